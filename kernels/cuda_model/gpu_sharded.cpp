// The rank-aware steps of the GPU forward pass: the layouts of kernels/model/shard_plan.hpp on
// device buffers, as kernels/model/moe_sharded.cpp and shard_plan.cpp run them on the CPU.
// TP: the query heads' outputs gathered in head order; each rank's experts (and the shared
// expert, on its owner) write per-slot outputs that an all-reduce fills in (one nonzero term per
// value), then TP-1's combine. DEP: a row's slots travel to their experts' owners (rows and a
// header of expert id and routing weight per slot, two all-to-alls), run there, travel back,
// and the sender combines them with its own shared expert's output. Each collective is enqueued
// on the compute stream (communicator::enqueue_on), so no rank waits on the host for one; DEP
// still reads its routing on the host and exchanges its slot counts there. $CEDAR_GPU_TP_GRAPHS=1
// (trial) also lets TP's MoE halves run under CUDA graphs (a decode step of bench-40L-E64 at
// batch 1 on two H200s: 10.5 ms, against 12.7 without), but tests/gpu/layout_gpu_test.cpp hangs
// in it (a thread per step), so it stays off.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/collectives/communicator.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/cuda_model/gpu_forward.hpp"
#include "kernels/model/shard_plan.hpp"

namespace cedar {

bool gpu_model::impl::sharded() const { return view != nullptr && view->size > 1; }
bool gpu_model::impl::splits_heads() const { return view != nullptr && view->splits_heads(); }
int gpu_model::impl::head_begin() const { return splits_heads() ? view->head_begin : 0; }
namespace {
bool tp_graphs() {
  static const bool on = [] {
    const char* v = std::getenv("CEDAR_GPU_TP_GRAPHS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

/// Before a collective on data the compute stream makes: it runs on that stream, after them.
void before_collective(const shard_view& s) { s.comm->enqueue_on(cuda::current_stream()); }
}  // namespace

bool gpu_model::impl::graphable() const {
  return !sharded() || (view->mode == parallel_mode::tp && tp_graphs());
}
int gpu_model::impl::num_heads() const { return splits_heads() ? view->num_heads() : args.num_attention_heads; }

void gpu_model::impl::gather_heads(const float* o, int n, float* all) const {
  const shard_view& s = *view;
  const int dh = args.head_dim, nh = s.num_heads(), H = args.num_attention_heads;
  const std::size_t block = std::size_t(n) * nh * dh;  // one rank's o
  dvec<float> gathered(std::size_t(s.size) * block);   // [size, n, nh, dh]
  before_collective(s);
  s.comm->all_gather(o, block, gathered.get());
  // rank p's heads [p * nh, (p + 1) * nh) of every row (make_shard_view splits them evenly)
  for (int p = 0; p < s.size; ++p)
    cuda::copy_rows_device(all + std::size_t(p) * nh * dh, sizeof(float) * H * dh, gathered.get() + p * block,
                           sizeof(float) * nh * dh, sizeof(float) * nh * dh, n);
}

namespace {

/// TP: every rank holds every row; slots [n * topk + n, d] (the routed slots, then the shared
/// expert's rows) summed over ranks.
void tp_experts(const gpu_model::impl& m, const shard_view& s, const dev_layer& w, const float* y, int n,
                const int32_t* sel, const float* weights, float* out, const uint8_t* yq, const float* ys) {
  const model_args& a = m.args;
  const int k = a.num_experts_per_tok, d = a.hidden_size, E = int(w.experts.size());
  if (n == 0) return;
  const std::size_t routed = std::size_t(n) * k * d;
  dvec<float> slots(routed + std::size_t(n) * d);
  const bool has_shared = a.n_shared_experts > 0, owns_shared = has_shared && s.owns_expert(E);
  cuda::fast::moe_slots(y, n, d, sel, weights, k, w.experts.data(), E, owns_shared ? &w.shared : nullptr,
                        float(a.swiglu_limit), slots.get(), slots.get() + routed, yq, ys);
  if (!owns_shared) cuda::fill_bytes(slots.get() + routed, 0, sizeof(float) * n * d);
  before_collective(s);
  s.comm->all_reduce_sum(slots.get(), slots.size());
  cuda::fast::moe_combine(slots.get(), has_shared ? slots.get() + routed : nullptr, n, k, d, true, out);
}

/// DEP: the slots of this rank's rows go to their experts' owners and come back. The plan (which
/// record goes where) is made on the device; the host waits once a layer, for the record counts
/// that size the all-to-alls.
void dep_experts(const gpu_model::impl& m, const shard_view& s, const dev_layer& w, const float* y, int n,
                 const int32_t* sel, const float* weights, float* out, const uint8_t* yq, const float* ys) {
  const model_args& a = m.args;
  const int k = a.num_experts_per_tok, d = a.hidden_size, E = int(w.experts.size()), N = s.size;
  const float limit = float(a.swiglu_limit);
  const std::size_t slots = std::size_t(n) * k;
  dvec<int32_t> src_rows(std::max<std::size_t>(slots, 1)), from(std::max<std::size_t>(slots, 1));
  dvec<float> send_head(std::max<std::size_t>(2 * slots, 1));
  dvec<uint64_t> counts(2 * std::size_t(N));  // records to each rank, then from each
  cuda::fast::dep_dispatch_plan(sel, weights, n, k, N, src_rows.get(), send_head.get(), from.get(), counts.get());
  before_collective(s);
  s.comm->exchange_counts_device(counts.get(), counts.get() + N);
  std::vector<uint64_t> h_counts(2 * std::size_t(N));
  cuda::copy_to_host(h_counts.data(), counts.get(), sizeof(uint64_t) * h_counts.size());
  std::vector<std::size_t> send_n(N), recv_n(N);
  std::size_t J = 0, R = 0;
  for (int p = 0; p < N; ++p) {
    send_n[p] = std::size_t(h_counts[p]), recv_n[p] = std::size_t(h_counts[N + p]);
    J += send_n[p], R += recv_n[p];
  }
  const auto scaled = [&](const std::vector<std::size_t>& c, std::size_t f) {
    std::vector<std::size_t> v(c);
    for (std::size_t& x : v) x *= f;
    return v;
  };
  dvec<float> send_rows(J * d), recv_rows(R * d), recv_head(R * 2);
  if (J > 0) cuda::fast::gather_rows(y, src_rows.get(), int(J), d, send_rows.get());
  before_collective(s);
  s.comm->all_to_all(send_rows.get(), scaled(send_n, d).data(), recv_rows.get(), scaled(recv_n, d).data());
  s.comm->all_to_all(send_head.get(), scaled(send_n, 2).data(), recv_head.get(), scaled(recv_n, 2).data());

  // the received slots, each as a row of one slot (topk 1) of the expert it names
  dvec<float> results(R * d);
  if (R > 0) {
    dvec<int32_t> d_sel(R);
    dvec<float> d_w(R);
    cuda::fast::unpack_slot_headers(recv_head.get(), int(R), E, d_sel.get(), d_w.get());
    cuda::fast::moe_slots(recv_rows.get(), int(R), d, d_sel.get(), d_w.get(), 1, w.experts.data(), E, nullptr, limit,
                          results.get(), nullptr);
  }
  // back to the senders, into [J + 1, d]: the last row stays zero for slots with no expert
  dvec<float> mine((J + 1) * d);
  cuda::fill_bytes(mine.get() + J * d, 0, sizeof(float) * d);
  before_collective(s);
  s.comm->all_to_all(results.get(), scaled(recv_n, d).data(), mine.get(), scaled(send_n, d).data());
  if (n == 0) return;
  dvec<float> routed(slots * d), shared(a.n_shared_experts > 0 ? std::size_t(n) * d : 0);
  cuda::fast::gather_rows(mine.get(), from.get(), int(slots), d, routed.get());
  if (a.n_shared_experts > 0) cuda::fast::shared_ffn(y, n, w.shared, limit, shared.get(), yq, ys);
  cuda::fast::moe_combine(routed.get(), a.n_shared_experts > 0 ? shared.get() : nullptr, n, k, d, true, out);
}

}  // namespace

void gpu_model::impl::moe_sharded(int l, const float* y, int n, const int32_t* sel, const float* weights, float* out,
                                  const uint8_t* yq, const float* ys) const {
  if (view->mode == parallel_mode::tp) tp_experts(*this, *view, layers[l], y, n, sel, weights, out, yq, ys);
  else dep_experts(*this, *view, layers[l], y, n, sel, weights, out, yq, ys);
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
