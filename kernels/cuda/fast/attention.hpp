// Fused sparse attention and indexer of the fast kernel set (kernels/cuda/fast/attention.cu):
// KV records are read straight from the requests' pages and rings through device page tables,
// dequantized in registers and fed to bf16 tensor cores; every length and position comes from
// device arrays, so a launch's shape depends only on the row count (and the score width of the
// indexer). Plain C++ header; everything here exists only in a CUDA build.
//
// Numerics (not the CPU's bits; bounds checked by tests/gpu/fast_attention_test.cpp):
// - KV values (FP4 x E4M3, FP8 x UE8M0, the fresh rows on the FP8 grid) are exact in bf16.
// - Attention: q and the softmax weights are split into two bf16 terms (hi + lo, 2^-18 of each
//   value left over), products summed in fp32 by the tensor cores; online softmax over
//   chunks of 64 candidates with the sink added at the end. Output within 1e-4 of the largest
//   |o| of the CPU op (tests/gpu/fast_attention_test.cpp prints the measured figure).
// - Indexer: q (FP4 grid) and the keys are exact in bf16, so each q_h . k_j is exact products
//   summed in fp32; scores within 1e-5 of the row's largest |score| (measured about 5e-7). Top-k
//   is the exact radix select of kernels/cuda (ties to the lowest index), so the chosen set can
//   differ from the CPU's only where two scores are within that error of the k-th.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::cuda::fast {

#ifdef CEDAR_HAVE_CUDA

/// Global KV record formats: fp4 = latents FP4 with an E4M3 scale per 16 and index keys FP4
/// with a UE8M0 scale per 32; fp8 = both FP8 with a UE8M0 scale per 32 (formats.hpp).
enum class kv_format : uint8_t { fp4, fp8 };

/// Where the items of a batch keep their KV, all device arrays. Row r of the batch belongs to
/// item row_item[r]; its position is first_pos[item] + r - row_begin[item].
struct kv_items {
  const int32_t* row_item = nullptr;   // [rows]
  const int32_t* row_begin = nullptr;  // [items] first batch row of the item
  const int32_t* row_end = nullptr;    // [items] one past its last row
  const int64_t* first_pos = nullptr;  // [items] position of its first row
  const int64_t* window_floor = nullptr;  // [items] lowest window position still valid
  uint8_t* const* rings = nullptr;     // [items] SWA ring [layers, window, ring_record_bytes]
  uint8_t* const* pages = nullptr;     // [sum of pages] every item's page pointers, concatenated
  const int32_t* page_begin = nullptr; // [items] the item's first entry in pages
};

/// One KV source's records inside a page (kv_source_layout).
struct kv_source_view {
  int entries_per_page = 0;
  std::size_t latent_offset = 0, latent_bytes = 0;
  std::size_t key_offset = 0, key_bytes = 0;
};

struct sparse_attention_params {
  const float* q = nullptr;       // [rows, heads, dim] rotated queries (unrotated with q_rope_cs)
  const float* kv = nullptr;      // [rows, dim] this step's window KV (K = V), on the FP8 grid
  /// or, when set, the same rows as FP8 records of ring_record_bytes (the ring's format, packed
  /// from kv: the same values in about a quarter of the bytes); the kernel then reads these
  const uint8_t* kv_records = nullptr;
  const int32_t* topk = nullptr;  // [rows, topk] compressed entries (-1 = none), or null
  const float* sink = nullptr;    // [heads]
  float* out = nullptr;           // [rows, heads, dim]
  int rows = 0, heads = 0, dim = 0;
  int window = 0, topk_k = 0;     ///< W, K (K = 0: window only)
  int layer = 0;                  ///< ring layer
  std::size_t ring_record_bytes = 0;
  float scale = 0;
  kv_format format = kv_format::fp4;
  kv_source_view source;          ///< latents of the layer's KV source (topk_k > 0)
  /// then kv_records go to their ring slots (pos mod W of `layer`, the rows among their item's
  /// last W) in the attention's last pass, once every block has read the ring
  bool store_ring = false;
  /// Which kernel: attention_auto picks by shape and row count (attention_rows_min);
  /// attention_per16 = blocks of 16 heads, candidates split over blocks when rows are few;
  /// attention_all_heads = a block per row over all 64 heads of 512 on wgmma (sm_90a only).
  int variant = 0;
  /// When set ([rows, rope_dim], sparse_attention's rope_cs), q comes unrotated and the kernel
  /// rotates each head's last rope_dim values as it loads them (cuda::rope's arithmetic, the
  /// values finish_rows' rotate gives). Only where attention_rotates_queries(p).
  const float* q_rope_cs = nullptr;
  int q_rope_dim = 0;  ///< set by sparse_attention (its rope_dim)
};

enum : int { attention_auto = 0, attention_per16 = 1, attention_all_heads = 2 };

/// Rows from which attention_auto takes attention_all_heads where it can (below, the per-16
/// kernel's split blocks fill the device better).
int attention_rows_min();

/// True when sparse_attention takes p's queries unrotated (q_rope_cs): the per-16-heads kernel
/// is the one p's rows, shapes and variant choose (the all-heads kernel reads rotated queries).
bool attention_rotates_queries(const sparse_attention_params& p);

/// True when `variant` runs p's shapes on this device.
bool attention_variant_available(const sparse_attention_params& p, int variant);

/// True when the fused kernels take this head_dim and index_head_dim (else use the exact path).
bool supports(int dim, int index_dim);

/// Per row: the window positions max(floor, i - W + 1) .. i (older than the item's first row
/// from its ring, the others from kv) and the top-k entries' latents from the pages; softmax
/// with the per-head sink, as cpu::sparse_attention over the CPU model's candidate set.
/// rope_cs, when given ([rows, rope_dim], rope_dim <= 128: each row's cos, then sin, as
/// cuda::rope takes them; finish_rows writes it): the output is rotated back (cuda::rope's
/// inverse, its bits) in the pass that combines the splits, or in a pass of its own.
void sparse_attention(const sparse_attention_params& p, const kv_items& items, const float* rope_cs = nullptr,
                      int rope_dim = 0);

struct index_scores_params {
  const float* q = nullptr;  // [rows, heads, dim] index queries, rotated, on the FP4 grid
  const float* w = nullptr;  // [rows, heads] head weights (already scaled)
  float* scores = nullptr;   // [rows, num_keys] -inf where the entry is not visible
  int first_row = 0;         ///< batch row (kv_items) of q's row 0
  int rows = 0, heads = 0, dim = 0;
  int num_keys = 0;          ///< score width: at least every row's visible count
  int ratio = 1;             ///< entries visible at position i: (i + 1) / ratio
  kv_format format = kv_format::fp4;
  kv_source_view source;
};

/// scores[r, j] = sum_h w[r, h] relu(q[r, h] . key_j) for j < (pos_r + 1) / ratio, keys read from
/// the pages (cpu::index_scores over the item's unpacked keys).
void index_scores(const index_scores_params& p, const kv_items& items);

/// num_visible[r] = (pos_r + 1) / ratio.
void visible_entries(const kv_items& items, int rows, int ratio, int32_t* num_visible /*[rows]*/);

/// Copies record r of rec [m, rec_bytes] to entry first_entry + r of one item's pages
/// (pages: device array of that item's page pointers; record at offset + in_page * rec_bytes).
void store_entries(const uint8_t* rec, int m, std::size_t rec_bytes, uint8_t* const* pages,
                   int64_t first_entry, int entries_per_page, std::size_t offset);
/// The same with one item per record: record r to entry entry_of[r] of the page table
/// pages_of[r] (device arrays).
void store_entries_rows(const uint8_t* rec, int m, std::size_t rec_bytes, uint8_t* const* const* pages_of,
                        const int64_t* entry_of, int entries_per_page, std::size_t offset);

#endif  // CEDAR_HAVE_CUDA

}  // namespace cedar::cuda::fast
