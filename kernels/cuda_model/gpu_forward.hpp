// Private state of the GPU forward pass (gpu_model.hpp): device arrays, the device copies of a
// layer's weights, the per-call batch and item state, and gpu_model::impl with its steps, which
// gpu_model.cpp (layer loop, head), gpu_layers.cpp (attention, compressor, indexer, MoE, Engram)
// and gpu_weights.cpp (upload) define. One forward call, the calling thread.
#pragma once

#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kernels/cpu/op_check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#include "kernels/model/weights.hpp"

namespace cedar::cuda::fast {
struct expert_plan;  // kernels/cuda/fast/fast_ops.hpp
}

namespace cedar {
namespace gpu_detail {

/// Stream-ordered device array of n T's, freed when it goes out of scope.
template <class T>
class dvec {
 public:
  dvec() = default;
  explicit dvec(std::size_t n) : n_(n), p_(static_cast<T*>(cuda::scratch_alloc(n * sizeof(T)))) {}
  explicit dvec(const std::vector<T>& v) : dvec(v.size()) {
    cuda::copy_to_device_async(p_, v.data(), v.size() * sizeof(T));
  }
  /// A view of n T's at p that someone else owns (not freed by this dvec).
  static dvec borrow(T* p, std::size_t n) {
    dvec v;
    v.n_ = n, v.p_ = p, v.owned_ = false;
    return v;
  }
  dvec(dvec&& o) noexcept : n_(o.n_), p_(o.p_), owned_(o.owned_) { o.p_ = nullptr; o.n_ = 0; }
  dvec& operator=(dvec&& o) noexcept {
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    std::swap(owned_, o.owned_);
    return *this;
  }
  ~dvec() {
    if (owned_) cuda::scratch_free(p_);
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_ = 0;
  T* p_ = nullptr;
  bool owned_ = true;
};

struct fast_attention_state;  // fast kernel set (gpu_attention_fast.cpp)

/// Forward calls of the fast kernel set with few rows (decode steps, the truncated decoder
/// layers' rows at prefill, a replayed window) run each layer's MoE half (HCPost + HCMix of the
/// FFN sublayer, router, experts, HCPost) as one CUDA graph per (rows, layer), captured at
/// first use; the residual and the sublayer buffers they touch live here, one set per row count,
/// so the captured addresses stay valid. A decode step's layers that neither compress nor index
/// run whole (both halves) as one graph: their positions and the attention's page tables and
/// top-k live here too, rewritten in place each step.
struct graph_workspace {
  dvec<float> X, pre, a_pre, post, comb, x, f;  // [n, hc, dim], [n, hc] x 3, [n, hc, hc], [n, dim] x 2
  dvec<int32_t> positions;                      // [n]: whole-layer graphs
  std::shared_ptr<fast_attention_state> attention;
};

/// Wall time per phase of the forward pass when $CEDAR_GPU_PROFILE is set (to anything but 0):
/// the stream is synchronized around every timed phase (which adds launch gaps to a step), and
/// the totals per forward call, decode calls and the others apart, are printed to stderr when
/// the model is destroyed.
class phase_profile {
 public:
  enum phase : int {
    embed, engram, mhc, attn_proj, compressor, indexer, attend, out_proj, route, experts, head, num_phases
  };
  phase_profile();
  ~phase_profile();
  bool on() const { return on_; }
  /// Times that follow go to decode calls (every item one token) or to the other calls, kept
  /// apart by the call's row count (a batch-1 step and a batch-64 step are different lines).
  /// Calls first..last of $CEDAR_CUDA_PROFILER_CALLS ("A..B", counted from 1) run between
  /// cuda::profiler_start and profiler_stop, for ncu --profile-from-start off.
  void begin_call(bool decode, int rows);
  void count_call();
  /// Times the enclosing scope as phase p (no-op when off).
  class scope {
   public:
    scope(phase_profile& prof, phase p);
    ~scope();
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

   private:
    phase_profile& prof_;
    phase p_;
    double t0_ = 0;
  };

 private:
  bool on_ = false;
  struct totals {
    int64_t calls = 0;
    double ms[num_phases] = {};
  };
  std::pair<int, int> key_{0, 0};  // (0 decode / 1 other, rows)
  int64_t call_ = 0, window_first_ = 0, window_last_ = -1;
  std::map<std::pair<int, int>, totals> by_call_;
};

/// Device copies of one layer's weights (views with device pointers; fp32 vectors as arrays).
struct dev_hc {
  const float *fn = nullptr, *base = nullptr, *scale = nullptr;
};
struct dev_layer {
  dev_hc hc_attn, hc_ffn;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  fp8_weight wq_a, wq_b, wkv, wo_b;
  bf16_weight wo_a;
  fp8_weight wo_a8;  ///< wo_a as the checkpoint stores it, when FP8 (fast kernels): the decode GEMV reads it
  const float *q_norm = nullptr, *kv_norm = nullptr, *sink = nullptr;
  bf16_weight c_wkv, c_wgate, c_index_wk;
  const float *c_norm = nullptr, *c_index_k_norm = nullptr;
  fp8_weight i_wq_b;
  bf16_weight i_weights_proj;
  bf16_weight gate;
  const float* gate_bias = nullptr;
  std::vector<cpu::expert_weights> experts;
  cpu::shared_expert_weights shared;
  cpu::engram_weights engram;
};

/// One item's active rows and its device top-k / candidate state (as model_detail::item_state).
struct gitem {
  const forward_item* item = nullptr;
  request_kv* kv = nullptr;
  int row_begin = 0, num_rows = 0;
  int64_t first_pos = 0, ring_valid_from = 0;
  dvec<int32_t> topk;        // [num_rows, index_topk]
  dvec<uint8_t> candidates;  // [num_rows, num_candidate_blocks]
  int num_candidate_blocks = 0;
  uint8_t* const* d_pages = nullptr;  // fast kernel set: the item's device page table

  /// Its first rows that decoder truncation drops (those below item->truncate_below; none of a
  /// decode row, whose position is past its prompt's).
  int truncated_rows() const {
    const int64_t tb = item->truncate_below;
    return tb < 0 ? 0 : int(std::clamp<int64_t>(tb - first_pos, 0, num_rows));
  }
};

/// What the attention sublayer's fast steps read ([rows, width] device arrays): the normalized
/// q latent qr (with its FP8 codes and scales when a decode linear takes them, else null), the
/// sublayer input x, the rotated queries q, the window rows kv (with their ring records, or
/// null: packed from kv), and each row's RoPE cos and sin (or null) with which the attention
/// rotates its output back.
struct attn_rows {
  const float* qr = nullptr;
  const uint8_t* qr_codes = nullptr;
  const float* qr_scales = nullptr;
  const float *x = nullptr, *q = nullptr, *kv = nullptr;
  const uint8_t* kv_records = nullptr;
  const float* rope_cs = nullptr;
  bool q_unrotated = false;  ///< q not rotated yet: the attention rotates it with rope_cs
};

struct gbatch {
  int num_rows = 0;
  std::vector<gitem> items;
  std::vector<int32_t> positions;
  dvec<int32_t> d_positions;
  dvec<float> X, pre;  // [n, hc, dim], [n, hc]
  /// Fast kernel set: device page tables and the batch's top-k, built at the first layer.
  std::shared_ptr<fast_attention_state> fast;
  /// Under CUDA graphs (a row count graph_workspace_for takes): the buffers X, pre and the
  /// layer's sublayer buffers.
  graph_workspace* ws = nullptr;
  /// A decode step under graphs (every item one row, nothing truncated, one rank): the layers
  /// layer_graphed says run whole as one graph each.
  bool whole_layers = false;
  int generation = 0;  ///< of the workspace's attention state, for whole-layer graphs
  /// Fast kernel set: the last MoE sublayer's output with its HCPost weights, not yet added
  /// into X: the next layer's first boundary applies it (flush_post where X is read before).
  bool pending = false;
  dvec<float> pending_f, pending_post, pending_comb;
};


}  // namespace gpu_detail

using namespace gpu_detail;

struct gpu_model::impl {
  model_args args;
  kv_layout layout;
  gpu_kernels kernels = gpu_kernels::exact;
  int device = 0;
  gpu_placement placement;
  /// The layout rank of the forward call in progress (null: one rank). Calls are one at a time.
  mutable const shard_view* view = nullptr;
  bool sharded() const;
  bool splits_heads() const;
  int head_begin() const;  ///< this rank's query heads [head_begin, head_begin + num_heads)
  int num_heads() const;
  /// Whether the MoE halves may run as CUDA graphs: one rank, or TP (its collectives are stream
  /// ordered); not DEP, whose exchange reads counts on the host.
  bool graphable() const;
  mutable phase_profile profile;
  /// CUDA graphs of the MoE halves (fast kernel set; $CEDAR_GPU_GRAPHS=0 turns them off):
  /// workspaces by row count, executable graphs by (rows, layer).
  bool graphs_enabled = false;
  /// Whole-layer graphs of decode steps ($CEDAR_GPU_LAYER_GRAPHS=0 turns them off).
  bool layer_graphs_enabled = true;
  /// Forward calls of fewer rows run eagerly (the window's row count excepted). Eager steps
  /// wait on the host's launches: bench-40L-E64 decode at batch 1 on one H200 took 8.38 ms
  /// eagerly against 8.71 under graphs on one host, 9.29-12.02 against 8.62-8.74 on another
  /// (docs/BENCHMARKS.md), so every count takes graphs by default. $CEDAR_GPU_GRAPHS_FROM=N
  /// sets it (A/B runs).
  int graph_min_rows = 1;
  /// Fast kernel set, gpu_model's dense_bf16: every dense FP8 linear also kept as bf16
  /// (fp8_weight::bf16), filled by keep_dense_bf16 after the upload.
  bool dense_bf16 = false;
  void keep_dense_bf16();
  mutable std::map<int, graph_workspace> workspaces;
  struct graph_entry {
    int eager_runs = 0;
    int generation = 0;  ///< of the workspace's attention state it was captured with
    void* exec = nullptr;
  };
  /// Keys (rows, layer) for MoE halves, (rows, -1 - layer) for whole layers.
  mutable std::map<std::pair<int, int>, graph_entry> graphs;
  graph_workspace* graph_workspace_for(int rows, const forward_stats* stats) const;
  /// Replays the graph of `key`, capturing it first (after one eager run); a graph captured
  /// with another `generation` of the buffers it reads is captured again.
  void run_graphed(std::pair<int, int> key, const std::function<void()>& enqueue, int generation = 0) const;
  /// Whether a forward call of these items may run layers whole under graphs (gbatch::whole_layers).
  bool whole_layers_graphable(const gbatch& b) const;
  /// Whether layer l of b runs whole as one graph: neither a KV nor an index source (those
  /// size their work by the context on the host).
  bool layer_graphed(int l, const gbatch& b) const;
  /// Sets b's device positions (the workspace's, in place, for whole-layer graphs) and, for those,
  /// the attention state, before any layer is captured.
  void upload_positions(gbatch& b) const;
  std::vector<void*> allocations;
  uint64_t bytes = 0;
  /// Pinned host memory the kernels read over the bus (the Engram tables, when they stay there:
  /// gpu_weights.cpp) and its bytes.
  std::vector<void*> host_allocations;
  uint64_t host_bytes = 0;
  void engram_tables_to_host(const model_detail::model_weights& w);
  bf16_weight embed, head;
  const float* norm = nullptr;
  std::vector<dev_layer> layers;
  std::vector<cpu::rope_params> rope;
  std::vector<cpu::engram_hash_params> engram_hash;

  ~impl() {
    for (auto& [key, g] : graphs) cuda::graph_destroy(g.exec);
    workspaces.clear();
    for (void* p : allocations) cuda::device_free(p);
    for (void* p : host_allocations) cuda::host_free(p);
  }

  // ---- weight upload (gpu_weights.cpp) ----
  const upload_progress_fn* progress = nullptr;
  /// Lays every weight of `w` out in one device allocation and copies it there (progress over
  /// every byte).
  void bind(const model_detail::model_weights& w);

  // ---- linear layers: the kernel set's implementation (gpu_linear.cpp) ----
  void linear(const float* x, int m, const fp8_weight& w, float* y) const;
  void linear(const float* x, int m, const fp4_weight& w, float* y) const;
  void linear(const float* x, int m, const bf16_weight& w, float* y) const;
  /// The bf16 linear of the kernel set, for ops that take it as a parameter (the compressor).
  cuda::bf16_linear_fn bf16_linear() const;
  /// Two FP8 linears of one x (the fast set quantizes x once and runs one GEMV for both; xq /
  /// xs: x's FP8 codes and scales when already made, else null).
  void linear_pair(const float* x, int m, const fp8_weight& a, float* ya, const fp8_weight& b, float* yb,
                   const uint8_t* xq = nullptr, const float* xs = nullptr) const;
  /// The attention output projection (cuda::grouped_output's contract).
  void grouped_output(const float* o, int m, const dev_layer& w, float* out) const;
  /// The routed and shared experts (cuda::moe_ffn's contract; sel, weights on the device), out
  /// rounded to bf16; plan: the fast set's grouping of sel by the router (or null).
  void experts(const float* y, int m, const int32_t* sel, const float* weights, const dev_layer& w,
               float* out, const uint8_t* yq = nullptr, const float* ys = nullptr,
               const cuda::fast::expert_plan* plan = nullptr) const;

  // ---- forward steps ----
  void run_layer(int l, gbatch& b, forward_stats* stats) const;
  void run_layer_fast(int l, gbatch& b) const;
  /// Adds a pending MoE output into X (cuda::hc_post), if any.
  void flush_post(gbatch& b) const;
  /// xq / xs (fast set, or null): x's FP8 codes and scales, for the projections that read codes.
  void attention(int l, gbatch& b, const float* x, float* out, const uint8_t* xq = nullptr,
                 const float* xs = nullptr) const;
  void compressor(int l, gitem& it, const float* x) const;
  /// The index keys of num compressed latents and the latents rotated at their entry
  /// positions (d_pos), each fake-quantized to its storage format and given to store(values,
  /// dim, latent).
  void finish_entries(int l, float* latents, int num, const int32_t* d_pos,
                      const std::function<void(const float*, int, bool)>& store) const;
  void indexer(int l, gitem& it, const float* qr, const float* x) const;
  void attend(int l, gitem& it, const float* q, const float* kv, float* o) const;
  // fast kernel set (gpu_attention_fast.cpp): all items at once through device page tables
  bool fast_attention() const;
  fast_attention_state& fast_state(gbatch& b) const;
  void attend_fast(int l, gbatch& b, const attn_rows& in, float* o) const;
  /// Whether attend_fast at n rows takes the queries unrotated (the kernel it runs rotates them).
  bool attention_takes_unrotated_q(int n) const;
  void indexer_fast(int l, gbatch& b, const attn_rows& in) const;
  bool compressor_rows(int l, gbatch& b, const float* x) const;
  void store_entries(const gitem& it, int slot, int64_t first, int num, const float* x, int d, bool latent) const;
  void moe(int l, const float* y, int n, float* out, const uint8_t* yq = nullptr, const float* ys = nullptr) const;
  // ---- multi-rank layouts (gpu_sharded.cpp) ----
  /// o [n, num_heads, head_dim] of every rank -> all [n, all heads, head_dim], in head order.
  void gather_heads(const float* o, int n, float* all) const;
  /// The experts of a TP or DEP rank (sel, weights: the routing of y's n rows on the device);
  /// out as experts(): rounded to bf16. n may be 0 (DEP: this rank serves the others' rows).
  void moe_sharded(int l, const float* y, int n, const int32_t* sel, const float* weights, float* out,
                   const uint8_t* yq, const float* ys) const;
  void apply_engram(int l, gbatch& b) const;
  /// out [rows, vocab] = the logits of the rows the items ask for; returns rows.
  int head_device(const gbatch& b, dvec<float>& out) const;
  /// Every step of a forward call but the copy back: the logits stay on the device.
  int forward_device(std::span<forward_item> batch, forward_stats* stats, dvec<float>& logits) const;
  void drop_truncated_rows(gbatch& b, const forward_stats* stats) const;

  cuda::record_kind latent_kind() const {
    return layout.dtype == kv_dtype::fp8 ? cuda::record_kind::fp8 : cuda::record_kind::fp4_e4m3;
  }
  cuda::record_kind key_kind() const {
    return layout.dtype == kv_dtype::fp8 ? cuda::record_kind::fp8 : cuda::record_kind::fp4_pow2;
  }
  /// Record addresses of entries [first, first + n) of KV source `slot`: latents or index keys.
  std::vector<uint8_t*> entry_records(const request_kv& kv, int slot, int64_t first, int n, bool latent) const {
    const kv_source_layout& s = layout.sources.at(slot);
    std::vector<uint8_t*> out(n);
    for (int i = 0; i < n; ++i) {
      const int64_t e = first + i, page = e / s.entries_per_page;
      CEDAR_OP_CHECK(e >= 0 && page < int64_t(kv.pages.size()), "KV page out of range");
      const int64_t in_page = e - page * s.entries_per_page;
      out[i] = kv.pages[page] + (latent ? s.latent_offset + in_page * s.latent_bytes
                                        : s.key_offset + in_page * s.key_bytes);
    }
    return out;
  }
  std::vector<uint8_t*> ring_records(const request_kv& kv, int layer, int64_t first, int n) const {
    std::vector<uint8_t*> out(n);
    for (int i = 0; i < n; ++i)
      out[i] = kv.swa_ring + (std::size_t(layer) * layout.window + (first + i) % layout.window) * layout.swa_record_bytes;
    return out;
  }
};

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
