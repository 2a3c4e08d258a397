// Device side of `cedar kernel-lab` (fast_ops.hpp): CUDA-event timing, the copy-bandwidth
// ceiling and a cuBLASLt matrix product (the tensor-core ceiling), all on the current stream.
#include <cublasLt.h>

#include <cstdio>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/fast_ops.hpp"

namespace cedar::cuda::fast {

using cuda::detail::stream;

double time_ms(const std::function<void(int)>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t start, stop;
  CEDAR_CUDA_CHECK(cudaEventCreate(&start));
  CEDAR_CUDA_CHECK(cudaEventCreate(&stop));
  CEDAR_CUDA_CHECK(cudaEventRecord(start, stream()));
  for (int i = 0; i < iters; ++i) fn(i);
  CEDAR_CUDA_CHECK(cudaEventRecord(stop, stream()));
  CEDAR_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CEDAR_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CEDAR_CUDA_CHECK(cudaEventDestroy(start));
  CEDAR_CUDA_CHECK(cudaEventDestroy(stop));
  return double(ms) / iters;
}

double graph_time_ms(const std::function<void(int)>& fn, int iters) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CEDAR_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) fn(i);
  CEDAR_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
  CEDAR_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = time_ms([&](int) { CEDAR_CUDA_CHECK(cudaGraphLaunch(exec, stream())); }, 1, 1);
  CEDAR_CUDA_CHECK(cudaGraphExecDestroy(exec));
  CEDAR_CUDA_CHECK(cudaGraphDestroy(graph));
  return ms / iters;
}

void* create_stream() {
  cudaStream_t s = nullptr;
  CEDAR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroy_stream(void* s) { CEDAR_CUDA_CHECK(cudaStreamDestroy(static_cast<cudaStream_t>(s))); }

double copy_bandwidth_gbps(std::size_t bytes) {
  void* a = nullptr;
  void* b = nullptr;
  CEDAR_CUDA_CHECK(cudaMalloc(&a, bytes));
  CEDAR_CUDA_CHECK(cudaMalloc(&b, bytes));
  CEDAR_CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, stream()));
  const double ms = time_ms([&](int) { CEDAR_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream())); },
                            2, 10);
  CEDAR_CUDA_CHECK(cudaFree(a));
  CEDAR_CUDA_CHECK(cudaFree(b));
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

namespace {

/// Everything one cuBLASLt product needs; W [n, k] and x [m, k] row-major are the column-major
/// k x n and k x m operands, so y^T = W x^T is D [n, m] = op(A)^T B with A = W.
struct blaslt_state {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* a = nullptr;
  void* b = nullptr;
  void* d = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 64u << 20;
  std::size_t a_bytes = 0;  ///< one copy of W

  void release_descs() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (op) cublasLtMatmulDescDestroy(op);
    la = lb = ld = nullptr;
    op = nullptr;
  }
  void release_buffers() {
    for (void* p : {a, b, d, workspace})
      if (p) cudaFree(p);
    a = b = d = workspace = nullptr;
  }
};

}  // namespace

blaslt_gemm::blaslt_gemm(int m, int n, int k, int copies) : m_(m), n_(n), k_(k), copies_(copies) {
  auto* s = new blaslt_state;
  impl_ = s;
  if (cublasLtCreate(&s->handle) != CUBLAS_STATUS_SUCCESS) return;
  ok_ = setup(true);
  if (!ok_) ok_ = setup(false);
}

bool blaslt_gemm::setup(bool fp8) {
  auto* s = static_cast<blaslt_state*>(impl_);
  s->release_descs();
  s->release_buffers();
  const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const std::size_t in_size = fp8 ? 1 : 2;
  bool good = cublasLtMatmulDescCreate(&s->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  good = good && cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatrixLayoutCreate(&s->la, in_type, k_, n_, k_) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatrixLayoutCreate(&s->lb, in_type, k_, m_, k_) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatrixLayoutCreate(&s->ld, CUDA_R_16BF, n_, m_, n_) == CUBLAS_STATUS_SUCCESS;
  if (!good) return false;
  CEDAR_CUDA_CHECK(cudaMalloc(&s->a, std::size_t(n_) * k_ * in_size * copies_));
  CEDAR_CUDA_CHECK(cudaMalloc(&s->b, std::size_t(m_) * k_ * in_size));
  CEDAR_CUDA_CHECK(cudaMalloc(&s->d, std::size_t(m_) * n_ * 2));
  CEDAR_CUDA_CHECK(cudaMalloc(&s->workspace, s->workspace_bytes));
  // small values (0x30: 0.5 in e4m3; 0x3F00 ~ 0.5 in bf16) so nothing overflows
  CEDAR_CUDA_CHECK(cudaMemsetAsync(s->a, fp8 ? 0x30 : 0x3F, std::size_t(n_) * k_ * in_size * copies_, stream()));
  CEDAR_CUDA_CHECK(cudaMemsetAsync(s->b, fp8 ? 0x30 : 0x3F, std::size_t(m_) * k_ * in_size, stream()));
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &s->workspace_bytes,
                                       sizeof s->workspace_bytes);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(s->handle, s->op, s->la, s->lb, s->ld, s->ld, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  s->algo = result.algo;
  dtype_ = fp8 ? "fp8" : "bf16";
  s->a_bytes = std::size_t(n_) * k_ * in_size;
  return true;
}

void blaslt_gemm::run(int i) {
  auto* s = static_cast<blaslt_state*>(impl_);
  const float alpha = 1.0f, beta = 0.0f;
  const void* a = static_cast<const uint8_t*>(s->a) + (i % copies_) * s->a_bytes;
  const cublasStatus_t st = cublasLtMatmul(s->handle, s->op, &alpha, a, s->la, s->b, s->lb, &beta, s->d, s->ld,
                                           s->d, s->ld, &s->algo, s->workspace, s->workspace_bytes, stream());
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasLtMatmul failed: status %d\n", int(st));
    std::abort();
  }
}

blaslt_gemm::~blaslt_gemm() {
  auto* s = static_cast<blaslt_state*>(impl_);
  cudaStreamSynchronize(stream());
  s->release_descs();
  s->release_buffers();
  if (s->handle) cublasLtDestroy(s->handle);
  delete s;
}

}  // namespace cedar::cuda::fast
