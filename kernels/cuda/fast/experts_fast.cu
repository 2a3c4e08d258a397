// The fast kernel set's routed and shared experts (fast_ops.hpp, moe_ffn), on tensor cores.
//
// Decode (up to tuning::expert_gemv_max_rows tokens): the slots grouped by expert on the device
// (no host round trip), each busy expert's FP4 weight streamed through gemm_tiles.cu's narrow
// tiles (once per 8, 16 or 32 of its slots, by token count), SwiGLU, the FP8 quantization of h;
// the shared expert runs beside them on a second stream (a branch of the captured graph).
// Prefill: the per-expert counts to the host, then per expert a cuBLAS bf16 GEMM on its sorted
// rows (linear_fast.cu's building blocks), its weights dequantized on a side stream under the
// previous expert's GEMM.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/experts_wg.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/side_lane.cuh"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda::fast {
namespace detail {
namespace {

using cuda::detail::blocks_for;
using cuda::detail::scratch;
using cuda::detail::stream;

constexpr int max_experts = 1024;

using cuda::detail::swiglu_f;

__device__ __forceinline__ bool expert_valid(int e, int num_experts, const cpu::expert_weights* table) {
  return e >= 0 && e < num_experts && table[e].w1.data != nullptr;
}

/// grid (num_experts), 256 threads. Block e: the slots routed to expert e in ascending slot
/// order fill sorted positions [off_e, off_e + count_e) (off_e = the counts of the experts
/// before e): slot_src[p] = slot, slot_row[p] = slot / topk, slot_pos[slot] = p (-1 for slots
/// of no present expert), and the groups of the three matrices. counts[e] = count_e; *total.
/// The groups are compacted: the experts with slots come first (in expert order), so a launch
/// over the first min(num_experts, slots) groups covers every slot. (Up to 8 rows the router's
/// block writes the same arrays instead: expert_groups.cuh.)
__global__ void group_kernel(const int32_t* sel, int slots, int topk, const cpu::expert_weights* table, int num_experts,
                             int32_t* slot_src, int32_t* slot_row, int32_t* iota, int32_t* slot_pos, expert_group* g1,
                             expert_group* g3, expert_group* g2, int* counts, int* total) {
  cuda::detail::dependent_start();
  __shared__ int count[max_experts];
  __shared__ int warp_n[32];
  __shared__ int base;
  const int e = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
  for (int i = tid; i < num_experts; i += blockDim.x) count[i] = 0;
  __syncthreads();
  for (int s = tid; s < slots; s += blockDim.x)
    if (expert_valid(sel[s], num_experts, table)) atomicAdd(&count[sel[s]], 1);
  __syncthreads();
  if (tid == 0) {
    int off = 0, used_before = 0, used = 0;
    for (int i = 0; i < num_experts; ++i) {
      used += count[i] > 0;
      if (i < e) off += count[i], used_before += count[i] > 0;
    }
    base = off;
    counts[e] = count[e];
    if (e == num_experts - 1) *total = off + count[e];
    const cpu::expert_weights& w = table[e];
    const int at = count[e] > 0 ? used_before : used + (e - used_before);  // the empty ones after
    g1[at] = {w.w1.data, w.w1.scale, off, count[e]};
    g3[at] = {w.w3.data, w.w3.scale, off, count[e]};
    g2[at] = {w.w2.data, w.w2.scale, off, count[e]};
  }
  __syncthreads();
  const bool present = expert_valid(e, num_experts, table);
  for (int c0 = 0; c0 < slots && present; c0 += blockDim.x) {
    const int s = c0 + tid;
    const bool mine = s < slots && sel[s] == e;
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, mine);
    if (lane == 0) warp_n[warp] = __popc(ballot);
    __syncthreads();
    int before = base;
    for (int i = 0; i < warp; ++i) before += warp_n[i];
    if (mine) {
      const int p = before + __popc(ballot & ((1u << lane) - 1));
      slot_src[p] = s, slot_row[p] = s / topk, iota[p] = p, slot_pos[s] = p;
    }
    __syncthreads();
    if (tid == 0)
      for (int i = 0; i < warps; ++i) base += warp_n[i];
    __syncthreads();
  }
  if (e == 0)
    for (int s = tid; s < slots; s += blockDim.x)
      if (!expert_valid(sel[s], num_experts, table)) slot_pos[s] = -1;
}

/// h = silu(min(g, limit)) * clamp(u, -limit, limit), times weights[slot_src[s]] when given,
/// over g [cap, inter] (slots at or past *total: 0).
__global__ void swiglu_kernel(float* g, const float* u, int cap, int inter, const int32_t* slot_src,
                              const float* weights, const int* total, float limit) {
  cuda::detail::dependent_start();
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= (long long)cap * inter) return;
  const int s = int(i / inter);
  if (total && s >= *total) {
    g[i] = 0.0f;
    return;
  }
  const float h = swiglu_f(g[i], u[i], limit);
  g[i] = weights ? weights[slot_src ? slot_src[s] : s] * h : h;
}

/// swiglu_kernel's h, then quantize_rows_fp8 of it (one warp per group of 32): codes [cap,
/// inter] and scales [cap, inter / 32], the bits of the two launches; h itself is kept in g
/// when keep_h (a bf16 path may read it).
__global__ void swiglu_codes_kernel(float* g, const float* u, int cap, int inter, const int32_t* slot_src,
                                    const float* weights, const int* total, float limit, bool keep_h, uint8_t* codes,
                                    float* scales) {
  cuda::detail::dependent_start();
  const long long gi = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32, gpr = inter / 32;
  if (gi >= (long long)cap * gpr) return;  // gi is uniform across the warp
  const int s = int(gi / gpr);
  const long long i = gi * 32 + lane;
  float h = 0.0f;
  if (!(total && s >= *total)) {
    h = swiglu_f(g[i], u[i], limit);
    if (weights) h = weights[slot_src ? slot_src[s] : s] * h;
  }
  if (keep_h) g[i] = h;
  const float sc = cuda::detail::fp8_group_code(h, codes[i]);
  if (lane == 0) scales[gi] = sc;
}

/// The same on gu [cap, 2 inter] (g then u), written as the fake-quantized bf16 h [cap, inter]
/// (its columns in wg_column's order with wg_order).
/// Grid (slots, ceil(inter / 8 / blockDim.x)): eight values a thread, four threads (neighbour
/// lanes) a group of 32; slots at or past *total get zeros.
__global__ void swiglu_bf16_kernel(const float* gu, int inter, const int32_t* slot_src, const float* weights,
                                   const int* total, float limit, bool wg_order, uint16_t* out) {
  cuda::detail::dependent_start();
  const int s = int(blockIdx.x), c8 = int(blockIdx.y * blockDim.x + threadIdx.x);
  const bool in = c8 * 8 < inter;  // inter % 32 == 0: a group's four threads are all in or all out
  float h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (in && s < *total) {
    const float4* g = reinterpret_cast<const float4*>(gu + size_t(s) * 2 * inter) + 2 * c8;
    const float4* u = reinterpret_cast<const float4*>(gu + size_t(s) * 2 * inter + inter) + 2 * c8;
    const float4 g0 = g[0], g1 = g[1], u0 = u[0], u1 = u[1];
    const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    const float uv[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    const float rw = weights ? weights[slot_src[s]] : 1.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float hv = swiglu_f(gv[i], uv[i], limit);
      h[i] = weights ? rw * hv : hv;
    }
  }
  const uint4 q = cuda::detail::fake_quant8_bf16(h);
  if (in) store8(out + size_t(s) * inter, c8, q, wg_order);
}

/// out[r, c] = (0 + down[pos(r, 0), c] + ... in top-k order) + shared[r, c] (0 when null),
/// rounded to bf16 when round_out. Grid (m, ceil(d / 4 / blockDim.x)): four columns a thread
/// (d % 4 == 0; every buffer's rows 16-byte aligned).
/// out[r] = the sum of row r's slots in top-k order (down[slot_pos[slot]], or down[slot] itself
/// when slot_pos is null; -1: none), + shared[r] (or + 0), rounded to bf16 when round_out.
__global__ void combine_kernel(const float* down, const int32_t* slot_pos, const float* shared, int topk, int d,
                               bool round_out, float* out) {
  cuda::detail::dependent_start();
  const int r = int(blockIdx.x), c4 = int(blockIdx.y * blockDim.x + threadIdx.x);
  if (c4 * 4 >= d) return;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const auto add = [&o](const float4& v) { o.x += v.x, o.y += v.y, o.z += v.z, o.w += v.w; };
  const auto row = [&](int p) {
    return p >= 0 ? reinterpret_cast<const float4*>(down + size_t(p) * d)[c4] : make_float4(0, 0, 0, 0);
  };
  constexpr int in_flight = 8;  // up to this top-k: every position, then every row, loaded at once
  if (topk <= in_flight) {       // (two load latencies, not two per expert)
    int pos[in_flight];
    float4 v[in_flight];
#pragma unroll
    for (int i = 0; i < in_flight; ++i)
      pos[i] = i >= topk ? -1 : slot_pos ? slot_pos[size_t(r) * topk + i] : int32_t(size_t(r) * topk + i);
#pragma unroll
    for (int i = 0; i < in_flight; ++i) v[i] = row(pos[i]);
#pragma unroll
    for (int i = 0; i < in_flight; ++i)
      if (i < topk) add(v[i]);
  } else {
    for (int i = 0; i < topk; ++i) add(row(slot_pos ? slot_pos[size_t(r) * topk + i] : int32_t(size_t(r) * topk + i)));
  }
  {  // + 0 without a shared expert, as the scalar sum (it turns -0 into +0)
    const float4 v = shared ? reinterpret_cast<const float4*>(shared + size_t(r) * d)[c4] : make_float4(0, 0, 0, 0);
    o.x += v.x, o.y += v.y, o.z += v.z, o.w += v.w;
  }
  if (round_out) {
    using cuda::detail::round_bf16;
    o = make_float4(round_bf16(o.x), round_bf16(o.y), round_bf16(o.z), round_bf16(o.w));
  }
  reinterpret_cast<float4*>(out + size_t(r) * d)[c4] = o;
}

/// slots[s] = down[slot_pos[s]] (zeros where slot_pos[s] is -1: an expert not held here), d
/// values a row; grid (slots, d / 4 / 256 blocks).
__global__ void slot_rows_kernel(const float* down, const int32_t* slot_pos, int d, float* slots) {
  cuda::detail::dependent_start();
  const int s = int(blockIdx.x), c4 = int(blockIdx.y * blockDim.x + threadIdx.x);
  if (c4 * 4 >= d) return;
  const int p = slot_pos[s];
  reinterpret_cast<float4*>(slots + size_t(s) * d)[c4] =
      p >= 0 ? reinterpret_cast<const float4*>(down + size_t(p) * d)[c4] : make_float4(0, 0, 0, 0);
}

}  // namespace
}  // namespace detail

using namespace detail;

namespace {

/// The shared expert (FP8): the fast linears and the exact SwiGLU (no routing weight). w1 and
/// w3 share one GEMV launch; xq / xs, when given, are y already quantized (the routed experts'
/// codes).
void shared_expert(const float* y, int m, const cpu::shared_expert_weights& e, float limit, float* out,
                   const uint8_t* xq = nullptr, const float* xs = nullptr) {
  const int inter = e.w1.out;
  scratch<float> g(size_t(m) * inter), u(size_t(m) * inter);
  const fp8_weight* w13[2] = {&e.w1, &e.w3};
  float* gu[2] = {g.get(), u.get()};
  linear_fp8_set(y, m, 2, w13, gu, xq, xs);
  if (linear_fp8_takes_codes(m, e.w2)) {  // decode: SwiGLU and w2's activation codes in one launch
    scratch<uint8_t> hq(size_t(m) * inter);
    scratch<float> hs(size_t(m) * (inter / 32));
    cuda::detail::launch_dependent(swiglu_codes_kernel, dim3(blocks_for((long long)m * inter, 256)), dim3(256), 0,
                                   g.get(), u.get(), m, inter, nullptr, nullptr, nullptr, limit, false, hq.get(),
                                   hs.get());
    linear_fp8(g.get(), m, e.w2, out, hq.get(), hs.get());
    return;
  }
  cuda::detail::launch_dependent(swiglu_kernel, dim3(blocks_for((long long)m * inter, 256)), dim3(256), 0, g.get(),
                                 u.get(), m, inter, nullptr, nullptr, nullptr, limit);
  linear_fp8(g.get(), m, e.w2, out);
}

/// $CEDAR_GPU_EXPERTS: "cublas" keeps the experts past the grouped tiles on the cuBLAS path
/// (A/B runs against the wgmma experts); unset or "auto": tuning::expert_wgmma decides.
bool wgmma_experts_allowed() {
  static const bool allowed = [] {
    const char* env = std::getenv("CEDAR_GPU_EXPERTS");
    const std::string v = env ? env : "";
    if (!v.empty() && v != "auto" && v != "cublas")
      std::fprintf(stderr, "cedar: CEDAR_GPU_EXPERTS='%s' is not cublas or auto; ignored\n", env);
    return v != "cublas";
  }();
  return allowed;
}

/// Rows per pass of the experts at prefill (bounds the [slots, 2 inter] fp32 buffer).
constexpr int moe_chunk_rows = 8192;

/// Runs gemm(e, weights) for each expert with rows, its bf16 weights dequantized by
/// dequant(e, into, side stream) into one of two buffers of `elems` values: expert j's
/// dequantization runs on the side lane while expert j - 1's GEMM runs on the current stream,
/// and waits for expert j - 2's GEMM, the buffer's last reader.
template <class Dequant, class Gemm>
void overlapped_experts(const std::vector<int>& counts, size_t elems, Dequant dequant, Gemm gemm) {
  side_lane& lane = side_lane_now();
  scratch<uint16_t> wb(2 * elems);
  CEDAR_CUDA_CHECK(cudaEventRecord(lane.start, stream()));  // wb is allocated in stream order
  CEDAR_CUDA_CHECK(cudaStreamWaitEvent(lane.stream, lane.start, 0));
  int j = 0;
  for (int e = 0; e < int(counts.size()); ++e) {
    if (counts[e] == 0) continue;
    const int buf = j % 2;
    uint16_t* w = wb.get() + buf * elems;
    if (j >= 2) CEDAR_CUDA_CHECK(cudaStreamWaitEvent(lane.stream, lane.done[buf], 0));
    dequant(e, w, static_cast<void*>(lane.stream));
    CEDAR_CUDA_CHECK(cudaEventRecord(lane.ready[buf], lane.stream));
    CEDAR_CUDA_CHECK(cudaStreamWaitEvent(stream(), lane.ready[buf], 0));
    gemm(e, w);
    CEDAR_CUDA_CHECK(cudaEventRecord(lane.done[buf], stream()));
    ++j;
  }
  // the last GEMM waited for the last dequantization, so wb's stream-ordered free comes after
  // every use of it on either stream
}

}  // namespace

/// The device copy of a host table of expert views, kept per (table address, size) and
/// checked byte for byte on each use, so a layer's table is uploaded once, not per call.
const cpu::expert_weights* detail::expert_table(const cpu::expert_weights* experts, int num_experts) {
  struct entry {
    std::vector<cpu::expert_weights> host;
    void* dev = nullptr;
  };
  static std::mutex mu;
  // by host array and device: a model per device (multi-GPU layouts) has its own table there
  static std::map<std::tuple<const void*, int, int>, entry> cache;
  std::lock_guard<std::mutex> lock(mu);
  entry& e = cache[{experts, num_experts, cuda::current_device()}];
  const std::size_t bytes = sizeof(cpu::expert_weights) * num_experts;
  if (e.dev == nullptr || std::memcmp(e.host.data(), experts, bytes) != 0) {
    if (e.dev == nullptr) e.dev = cuda::device_alloc(bytes);
    e.host.assign(experts, experts + num_experts);
    CEDAR_CUDA_CHECK(cudaMemcpyAsync(e.dev, e.host.data(), bytes, cudaMemcpyHostToDevice, stream()));
  }
  return static_cast<const cpu::expert_weights*>(e.dev);
}

namespace {
std::size_t align16(std::size_t n) { return (n + 15) / 16 * 16; }
}  // namespace

std::size_t expert_plan_bytes(int m, int topk, int num_experts) {
  const std::size_t cap = std::size_t(m) * topk;
  return align16(4 * cap * sizeof(int32_t)) + align16(3 * std::size_t(num_experts) * sizeof(expert_group)) +
         (std::size_t(num_experts) + 1) * sizeof(int);
}

detail::plan_arrays detail::plan_layout(void* buffer, int m, int topk, int num_experts) {
  const std::size_t cap = std::size_t(m) * topk;
  auto* b = static_cast<unsigned char*>(buffer);
  plan_arrays a;
  a.slot_src = reinterpret_cast<int32_t*>(b);
  a.slot_row = a.slot_src + cap, a.iota = a.slot_row + cap, a.slot_pos = a.iota + cap;
  b += align16(4 * cap * sizeof(int32_t));
  a.g1 = reinterpret_cast<expert_group*>(b);
  a.g3 = a.g1 + num_experts, a.g2 = a.g3 + num_experts;
  b += align16(3 * std::size_t(num_experts) * sizeof(expert_group));
  a.counts = reinterpret_cast<int*>(b);
  a.total = a.counts + num_experts;
  return a;
}

namespace {

/// Where moe_run leaves its results: combined into out (moe_ffn), or per slot (moe_slots).
struct moe_outputs {
  float* out = nullptr;  ///< [m, d] combined
  bool round_out = false;
  float* slots = nullptr;   ///< [m * topk, d] per slot, uncombined (then out is unused)
  float* shared = nullptr;  ///< [m, d] the shared expert's output (with slots)
};

void moe_run(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
             const cpu::expert_weights* experts, int num_experts, const cpu::shared_expert_weights* shared, float limit,
             const moe_outputs& res, const uint8_t* yq, const float* ys, const expert_plan* plan = nullptr) {
  const bool round_out = res.round_out;
  float* out = res.out;
  CEDAR_CUDA_REQUIRE(num_experts > 0 && num_experts <= max_experts, "expert count");
  if (m <= 0) return;
  const int inter = cuda::detail::expert_inter(experts, num_experts, d);
  CEDAR_CUDA_REQUIRE(d % 32 == 0 && inter % 32 == 0, "fast moe_ffn: d and inter multiples of 32");
  // The grouped W4A8 kernels, on device-side groups: the narrow weight streams where the shapes
  // allow (2.4x the gemv tile on 64 experts x ~6 slots, `cedar kernel-lab --op moe`; 16 slots a
  // pass past expert_narrow_max_rows tokens, 32 past expert_narrow16_max_rows), else the gemv
  // tile; then the skinny tile (when the thresholds leave it rows). Past those: the bf16 path.
  const tuning& tune = tuning_now();
  const bool tiles_fit = d % 256 == 0 && inter % 256 == 0;
  bool grouped = true;
  tile_kind tile = tile_kind::skinny;
  if (m <= tune.expert_gemv_max_rows && tiles_fit)
    tile = m <= std::min(tune.expert_stream_max_rows, stream_max_slots) && stream_shape(true, inter, d) &&
                   stream_shape(true, d, inter)
               ? tile_kind::stream
           : m <= tune.expert_narrow_max_rows   ? tile_kind::narrow
           : m <= tune.expert_narrow16_max_rows ? tile_kind::narrow16
                                                : tile_kind::narrow32;
  else if (m <= tune.expert_gemv_max_rows && gemv_shape(inter, d) && gemv_shape(d, inter))
    tile = tile_kind::gemv;
  else
    grouped = m <= tune.expert_tiled_max_rows && tiles_fit;
  // on sm_90a, from expert_wg_min_rows tokens (or wherever the thresholds above leave the bf16
  // path) the wgmma experts instead, on the device as well
  const bool wg_experts = (!grouped || m >= tune.expert_wg_min_rows) && tune.expert_wgmma &&
                          wgmma_experts_allowed() && detail::experts_wg_supports(experts, num_experts, d, inter);
  if (wg_experts) grouped = false;
  // the narrow tiles on x's and h's pairs (fp4_x_pairs: one launch each, once for w1, w3 and w2)
  // from expert_pairs_min_rows tokens
  const bool pairs = grouped && m >= tune.expert_pairs_min_rows && takes_x_pairs(tile);
  const int chunk = grouped ? m : std::min(m, moe_chunk_rows);
  const int cap = chunk * topk;
  // the slots grouped by expert: moe_route's plan of these sel (one pass), else a launch here
  const bool planned = plan != nullptr && plan->rows == m && plan->topk == topk && chunk == m &&
                       plan->experts == experts && plan->num_experts == num_experts;
  // (the plan looked the device table up already: one lookup a layer on the host)
  const cpu::expert_weights* table = planned ? plan->table : expert_table(experts, num_experts);
  const size_t plan_bytes = planned ? 0 : expert_plan_bytes(chunk, topk, num_experts);
  scratch<unsigned char> own_plan(plan_bytes);
  const plan_arrays pa = plan_layout(planned ? plan->buffer : own_plan.get(), chunk, topk, num_experts);
  expert_group *g1 = pa.g1, *g3 = pa.g3, *g2 = pa.g2;
  int* total = pa.total;
  scratch<float> down(size_t(cap + 64) * d), shared_out(shared ? size_t(chunk) * d : 0);  // + padding rows
  std::vector<int> host_counts(num_experts);
  // the grouped path's x codes (one pass: chunk == m), which the shared expert reuses
  scratch<uint8_t> xq(grouped && !yq ? size_t(m) * d : 0);
  scratch<float> xs(grouped && !yq ? size_t(m) * (d / 32) : 0);
  bool quantized = false, shared_done = false;
  for (int r0 = 0; r0 < m; r0 += chunk) {
    const int rows = std::min(chunk, m - r0), slots = rows * topk;
    const int32_t* sel_c = sel + size_t(r0) * topk;
    const float* w_c = weights + size_t(r0) * topk;
    const float* y_c = y + size_t(r0) * d;
    if (inter > 0) {
      if (!planned)
        cuda::detail::launch_dependent(group_kernel, dim3(num_experts), dim3(256), 0, sel_c, slots, topk, table,
                                       num_experts, pa.slot_src, pa.slot_row, pa.iota, pa.slot_pos, g1, g3, g2,
                                       pa.counts, total);
      if (grouped) {
        scratch<uint8_t> hq(size_t(slots) * inter);
        scratch<float> hs(size_t(slots) * (inter / 32));
        const bool swiglu_in = tune.expert_swiglu_in_tile && swiglu_in_tile(tile);
        scratch<float> g(swiglu_in ? 0 : size_t(slots) * inter), u(swiglu_in ? 0 : size_t(slots) * inter);
        scratch<uint16_t> xp(pairs ? size_t(rows) * d : 0), hp(pairs ? size_t(slots) * inter : 0);
        scratch<float> xf(pairs ? size_t(rows) * (d / 128) : 0), hf(pairs ? size_t(slots) * (inter / 128) : 0);
        const int busy = std::min(num_experts, slots);  // groups that can have slots (compacted)
        if (yq == nullptr) quantize_rows_fp8(y_c, rows, d, xq.get(), xs.get());
        quantized = true;
        // the shared expert (y and its codes only) on the side lane, beside the routed experts:
        // each kernel's last partial wave leaves SMs the other's blocks can take
        if (shared != nullptr) {
          side_begin();
          shared_expert(y_c, rows, *shared, limit, shared_out.get(), yq ? yq : xq.get(), yq ? ys : xs.get());
          side_end();
          shared_done = true;
        }
        if (pairs) fp4_x_pairs(yq ? yq : xq.get(), yq ? ys : xs.get(), rows, d, xp.get(), xf.get());
        if (swiglu_in) {  // h's codes from the w1 | w3 launch (slots of no expert here: unwritten, unread)
          grouped_fp4_swiglu(yq ? yq : xq.get(), yq ? ys : xs.get(), pa.slot_row, g1, g3, busy, slots, rows, inter,
                             d, tile, pa.slot_src, w_c, limit, hq.get(), hs.get(), xp.get(), xf.get());
        } else {
          grouped_fp4_pair(yq ? yq : xq.get(), yq ? ys : xs.get(), pa.slot_row, g1, g3, busy, slots, rows, inter,
                           d, g.get(), u.get(), tile, xp.get(), xf.get());
          cuda::detail::launch_dependent(swiglu_codes_kernel, dim3(blocks_for((long long)slots * inter, 256)),
                                         dim3(256), 0, g.get(), u.get(), slots, inter, pa.slot_src, w_c, total,
                                         limit, false, hq.get(), hs.get());
        }
        if (pairs) fp4_x_pairs(hq.get(), hs.get(), slots, inter, hp.get(), hf.get());
        grouped_fp4(hq.get(), hs.get(), pa.iota, g2, busy, slots, rows, d, inter, down.get(), tile, hp.get(),
                    hf.get());
        if (shared_done) side_wait();
      } else if (wg_experts) {
        // prefill on Hopper: all experts' w1 and w3 in one launch, then w2, on the sorted rows'
        // bf16 activations, the counts read on the device (no host round trip)
        scratch<uint16_t> xb(size_t(slots) * d), hb(size_t(slots) * inter);
        scratch<float> gu(size_t(slots) * 2 * inter);
        fake_quant_bf16(y_c, d, pa.slot_row, total, slots, d, xb.get(), true);
        detail::experts_wg(xb.get(), pa.counts, table, num_experts, 0, 2 * inter, d, slots, gu.get(), 2 * inter,
                           tune.expert_wg_tile);
        cuda::detail::launch_dependent(swiglu_bf16_kernel, dim3(unsigned(slots), blocks_for(inter / 8, 256)),
                                       dim3(256), 0, gu.get(), inter, pa.slot_src, w_c, total, limit, true,
                                       hb.get());
        detail::experts_wg(hb.get(), pa.counts, table, num_experts, 1, d, inter, slots, down.get(), d,
                           tune.expert_wg_tile);
      } else {
        // prefill: the 64 (or so) counts to the host, then per-expert bf16 GEMMs on sorted rows
        CEDAR_CUDA_CHECK(cudaMemcpyAsync(host_counts.data(), pa.counts, sizeof(int) * num_experts,
                                         cudaMemcpyDeviceToHost, stream()));
        CEDAR_CUDA_CHECK(cudaStreamSynchronize(stream()));
        int used = 0;
        for (int c : host_counts) used += c;
        // Each expert's GEMM runs on its row count rounded up to a multiple of 64, so cuBLAS
        // sees a handful of shapes (its heuristic cache answers, instead of a fresh search
        // per expert and layer). The extra rows read the next expert's inputs (or the slack
        // past the last) and write into the next expert's outputs, which that expert's own
        // GEMM, later on the same stream, overwrites; a row's output depends on its row only.
        const auto padded = [](int c) { return (c + 63) / 64 * 64; };
        const size_t rows_alloc = size_t(used) + 64;
        scratch<uint16_t> xb(rows_alloc * d), hb(rows_alloc * inter);
        scratch<float> gu(rows_alloc * 2 * inter);
        std::vector<int> first_row(num_experts, 0);
        for (int e = 1; e < num_experts; ++e) first_row[e] = first_row[e - 1] + host_counts[e - 1];
        fake_quant_bf16(y_c, d, pa.slot_row, total, used, d, xb.get());
        overlapped_experts(
            host_counts, size_t(2) * inter * d,
            [&](int e, uint16_t* w, void* side) {
              dequant_bf16(experts[e].w1, w, side);
              dequant_bf16(experts[e].w3, w + size_t(inter) * d, side);
            },
            [&](int e, const uint16_t* w) {
              const int off = first_row[e];
              gemm_bf16(xb.get() + size_t(off) * d, d, padded(host_counts[e]), w, d, 2 * inter, d,
                        gu.get() + size_t(off) * 2 * inter, 2 * inter, false);
            });
        if (used > 0) {  // none when this shard holds none of the chosen experts
          cuda::detail::launch_dependent(swiglu_bf16_kernel, dim3(unsigned(used), blocks_for(inter / 8, 256)),
                                         dim3(256), 0, gu.get(), inter, pa.slot_src, w_c, total, limit, false,
                                         hb.get());
        }
        overlapped_experts(
            host_counts, size_t(inter) * d,
            [&](int e, uint16_t* w, void* side) { dequant_bf16(experts[e].w2, w, side); },
            [&](int e, const uint16_t* w) {
              const int off = first_row[e];
              gemm_bf16(hb.get() + size_t(off) * inter, inter, padded(host_counts[e]), w, inter, d, inter,
                        down.get() + size_t(off) * d, d, false);
            });
      }
    }
    if (shared != nullptr && !shared_done)
      shared_expert(y_c, rows, *shared, limit, shared_out.get(), !quantized ? nullptr : yq ? yq : xq.get(),
                    !quantized ? nullptr : yq ? ys : xs.get());
    if (res.slots != nullptr) {
      float* dst = res.slots + size_t(r0) * topk * d;
      if (inter > 0 && slots > 0)
        cuda::detail::launch_dependent(slot_rows_kernel, dim3(unsigned(slots), blocks_for(d / 4, 256)), dim3(256), 0,
                                       down.get(), pa.slot_pos, d, dst);
      else if (slots > 0)
        CEDAR_CUDA_CHECK(cudaMemsetAsync(dst, 0, sizeof(float) * slots * d, stream()));
      if (shared != nullptr) cuda::copy_device(res.shared + size_t(r0) * d, shared_out.get(), sizeof(float) * rows * d);
    } else if (inter > 0) {
      cuda::detail::launch_dependent(combine_kernel, dim3(unsigned(rows), blocks_for(d / 4, 256)), dim3(256), 0,
                                     down.get(), pa.slot_pos, shared ? shared_out.get() : nullptr, topk, d,
                                     round_out, out + size_t(r0) * d);
    } else if (shared != nullptr) {
      cuda::copy_device(out + size_t(r0) * d, shared_out.get(), sizeof(float) * rows * d);
      if (round_out) cuda::round_bf16(out + size_t(r0) * d, size_t(rows) * d);
    } else {
      CEDAR_CUDA_CHECK(cudaMemsetAsync(out + size_t(r0) * d, 0, sizeof(float) * rows * d, stream()));
    }
  }
}

}  // namespace

void moe_ffn(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
             const cpu::expert_weights* experts, int num_experts, const cpu::shared_expert_weights* shared, float limit,
             float* out, bool round_out, const uint8_t* yq, const float* ys, const expert_plan* plan) {
  moe_outputs res;
  res.out = out, res.round_out = round_out;
  moe_run(y, m, d, sel, weights, topk, experts, num_experts, shared, limit, res, yq, ys, plan);
}

void moe_slots(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
               const cpu::expert_weights* experts, int num_experts, const cpu::shared_expert_weights* shared,
               float limit, float* slots, float* shared_out, const uint8_t* yq, const float* ys) {
  CEDAR_CUDA_REQUIRE(shared == nullptr || shared_out != nullptr, "moe_slots: the shared expert needs shared_out");
  moe_outputs res;
  res.slots = slots, res.shared = shared_out;
  moe_run(y, m, d, sel, weights, topk, experts, num_experts, shared, limit, res, yq, ys);
}

void shared_ffn(const float* y, int m, const cpu::shared_expert_weights& shared, float limit, float* out,
                const uint8_t* yq, const float* ys) {
  if (m > 0) shared_expert(y, m, shared, limit, out, yq, ys);
}

namespace {
/// One warp: dep_dispatch_plan's records (fast_ops.hpp). Pass 1 counts each rank's records; pass 2
/// gives each slot its record, 32 slots at a time in slot order (a ballot per rank: a slot's
/// place among the chunk's slots of its rank).
__global__ void dispatch_plan_kernel(const int32_t* sel, const float* weights, int slots, int topk, int ranks,
                                     int32_t* src_rows, float* head, int32_t* from, unsigned long long* counts) {
  extern __shared__ int cursor[];  // [ranks]: records so far, then each rank's next record
  __shared__ int total;
  cuda::detail::dependent_start();
  const int lane = int(threadIdx.x);
  for (int p = lane; p < ranks; p += 32) cursor[p] = 0;
  __syncwarp();
  const auto owner = [&](int s) {
    const int e = s < slots ? sel[s] : -1;
    return e >= 0 ? e % ranks : -1;
  };
  for (int s0 = 0; s0 < slots; s0 += 32)
    if (const int o = owner(s0 + lane); o >= 0) atomicAdd(&cursor[o], 1);
  __syncwarp();
  if (lane == 0) {
    int at = 0;
    for (int p = 0; p < ranks; ++p) {
      const int c = cursor[p];
      counts[p] = (unsigned long long)c;
      cursor[p] = at;
      at += c;
    }
    total = at;
  }
  __syncwarp();
  const unsigned below = (1u << lane) - 1u;
  for (int s0 = 0; s0 < slots; s0 += 32) {
    const int s = s0 + lane, o = owner(s);
    int at = total;  // a slot that goes nowhere: the zero row past the records
    for (int p = 0; p < ranks; ++p) {
      const unsigned mask = __ballot_sync(0xffffffffu, o == p);
      if (mask == 0u) continue;
      if (o == p) at = cursor[p] + __popc(mask & below);
      __syncwarp();
      if (lane == 0) cursor[p] += __popc(mask);
      __syncwarp();
    }
    if (s >= slots) continue;
    from[s] = at;
    if (o < 0) continue;
    src_rows[at] = s / topk;
    head[2 * at] = float(sel[s]);
    head[2 * at + 1] = weights[s];
  }
}
}  // namespace

void dep_dispatch_plan(const int32_t* sel, const float* weights, int m, int topk, int ranks, int32_t* src_rows,
                       float* head, int32_t* from, uint64_t* counts) {
  CEDAR_CUDA_REQUIRE(ranks >= 1 && topk >= 1 && m >= 0, "dep_dispatch_plan: ranks and topk at least 1");
  cuda::detail::launch_dependent(dispatch_plan_kernel, dim3(1), dim3(32), sizeof(int) * ranks, sel, weights, m * topk,
                                 topk, ranks, src_rows, head, from, reinterpret_cast<unsigned long long*>(counts));
}

namespace {
/// One thread per received slot: its header (expert id, routing weight; floats) -> sel, weights.
__global__ void slot_headers_kernel(const float* head, int n, int num_experts, int32_t* sel, float* weights) {
  cuda::detail::dependent_start();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float e = head[2 * i];
  sel[i] = e >= 0.0f && e < float(num_experts) && e == floorf(e) ? int32_t(e) : -1;
  weights[i] = head[2 * i + 1];
}
}  // namespace

void unpack_slot_headers(const float* head, int n, int num_experts, int32_t* sel, float* weights) {
  if (n <= 0) return;
  cuda::detail::launch_dependent(slot_headers_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, head, n, num_experts,
                                 sel, weights);
}

void moe_combine(const float* slots, const float* shared, int m, int topk, int d, bool round_out, float* out) {
  CEDAR_CUDA_REQUIRE(d % 4 == 0, "moe_combine: d a multiple of 4");
  if (m <= 0) return;
  cuda::detail::launch_dependent(combine_kernel, dim3(unsigned(m), blocks_for(d / 4, 256)), dim3(256), 0, slots,
                                 static_cast<const int32_t*>(nullptr), shared, topk, d, round_out, out);
}

}  // namespace cedar::cuda::fast
