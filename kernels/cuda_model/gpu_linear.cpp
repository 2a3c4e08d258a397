// The GPU model's linear layers and expert FFNs (gpu_forward.hpp), per kernel set: exact runs
// the bit-exact CUDA ops of kernels/cuda; fast runs kernels/cuda/fast (tensor cores, the same
// contracts, within the bounds fast_ops.hpp states). One forward call, the calling thread.
#ifdef CEDAR_HAVE_CUDA

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda_model/gpu_forward.hpp"

namespace cedar {

void gpu_model::impl::linear(const float* x, int m, const fp8_weight& w, float* y) const {
  if (kernels == gpu_kernels::fast) cuda::fast::linear_fp8(x, m, w, y);
  else cuda::linear_fp8(x, m, w, y);
}

void gpu_model::impl::linear_pair(const float* x, int m, const fp8_weight& a, float* ya, const fp8_weight& b,
                                  float* yb, const uint8_t* xq, const float* xs) const {
  if (kernels == gpu_kernels::fast) {
    const fp8_weight* w[2] = {&a, &b};
    float* y[2] = {ya, yb};
    cuda::fast::linear_fp8_set(x, m, 2, w, y, xq, xs);
  } else {
    cuda::linear_fp8(x, m, a, ya);
    cuda::linear_fp8(x, m, b, yb);
  }
}

void gpu_model::impl::linear(const float* x, int m, const fp4_weight& w, float* y) const {
  if (kernels == gpu_kernels::fast) cuda::fast::linear_fp4(x, m, w, y);
  else cuda::linear_fp4(x, m, w, y);
}

void gpu_model::impl::linear(const float* x, int m, const bf16_weight& w, float* y) const { bf16_linear()(x, m, w, y); }

cuda::bf16_linear_fn gpu_model::impl::bf16_linear() const {
  return kernels == gpu_kernels::fast ? cuda::fast::linear_bf16 : cuda::linear_bf16;
}

void gpu_model::impl::grouped_output(const float* o, int m, const dev_layer& w, float* out) const {
  if (kernels == gpu_kernels::fast) cuda::fast::grouped_output(o, m, args.o_groups, w.wo_a, w.wo_b, out, &w.wo_a8);
  else cuda::grouped_output(o, m, args.o_groups, w.wo_a, w.wo_b, out);
}

void gpu_model::impl::experts(const float* y, int m, const int32_t* sel, const float* weights, const dev_layer& w,
                              float* out, const uint8_t* yq, const float* ys,
                              const cuda::fast::expert_plan* plan) const {
  const cpu::shared_expert_weights* shared = args.n_shared_experts > 0 ? &w.shared : nullptr;
  if (kernels == gpu_kernels::fast) {
    cuda::fast::moe_ffn(y, m, args.hidden_size, sel, weights, args.num_experts_per_tok, w.experts.data(),
                        int(w.experts.size()), shared, float(args.swiglu_limit), out, true, yq, ys, plan);
  } else {
    cuda::moe_ffn(y, m, args.hidden_size, sel, weights, args.num_experts_per_tok, w.experts.data(),
                  int(w.experts.size()), shared, float(args.swiglu_limit), out);
    cuda::round_bf16(out, std::size_t(m) * args.hidden_size);
  }
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
