// A KV source's compressor (spec §2.4) and index-key path (§2.5 step 1) over one item's rows.
// Order matters: the raw (pre-RoPE) latent feeds the index key; only then is the latent rotated
// at its entry position, rounded to the storage grid and stored. Replay items only advance the
// ratio-2 tail: their entries are already in the (shared) pages.
#include <vector>

#include "kernels/cpu/op_check.hpp"
#include "kernels/model/forward_pass.hpp"
#include "kernels/model/kv_io.hpp"

namespace cedar::model_detail {
namespace {

/// Index keys of raw latents [num, head_dim] -> stored key records of entries first_entry...
void store_index_keys(const layer_context& c, item_state& it, const float* raw, int num,
                      int64_t first_entry, const int32_t* entry_pos) {
  const compressor_weights& w = c.w.attn.compressor;
  const int dih = c.args.index_head_dim;
  std::vector<float> k(std::size_t(num) * dih);  // [num, index_head_dim]
  cpu::linear_bf16(raw, num, w.index_wk, k.data());
  cpu::rmsnorm(k.data(), num, dih, w.index_k_norm.data(), float(c.args.rms_norm_eps), k.data());
  cpu::rope(k.data(), num, 1, dih, entry_pos, c.rope, false);
  for (int e = 0; e < num; ++e) {
    float* row = k.data() + std::size_t(e) * dih;
    quantize_index_key(c.layout, row);
    store_index_key(c.layout, *it.kv, c.info.kv_source_slot, first_entry + e, row);
  }
}

}  // namespace

void run_compressor(const layer_context& c, item_state& it, const float* x) {
  const compressor_weights& w = c.w.attn.compressor;
  const int ratio = c.info.compress_ratio, dh = c.args.head_dim, T = it.num_rows;
  const float eps = float(c.args.rms_norm_eps);
  const int64_t p0 = it.first_pos;
  CEDAR_OP_CHECK(ratio == 1 || ratio == 2, "compressor ratio");

  std::vector<float> latents(std::size_t(T / ratio + 1) * dh);  // [<= T/ratio + 1, head_dim]
  int num = 0;
  int64_t first_entry = 0;
  if (ratio == 2) {
    float* tail = it.kv->tails + std::size_t(tail_index(c.layout, c.info.kv_source_slot)) * 2 * dh;
    num = cpu::compress_ratio2(x, T, p0, w.wkv, w.wgate, w.norm.data(), eps, tail,
                               latents.data());
    first_entry = p0 / 2;
  } else {
    cpu::compress_ratio1(x, T, w.wkv, w.norm.data(), eps, latents.data());
    num = T;
    first_entry = p0;
  }
  if (it.item->replay || num == 0) return;

  std::vector<int32_t> entry_pos(num);  // [num] position each entry stands for
  for (int e = 0; e < num; ++e) entry_pos[e] = int32_t((first_entry + e) * ratio);
  store_index_keys(c, it, latents.data(), num, first_entry, entry_pos.data());
  cpu::rope(latents.data(), num, 1, dh, entry_pos.data(), c.rope, false);
  for (int e = 0; e < num; ++e) {
    float* row = latents.data() + std::size_t(e) * dh;
    quantize_latent(c.layout, row);
    store_latent(c.layout, *it.kv, c.info.kv_source_slot, first_entry + e, row);
  }
}

}  // namespace cedar::model_detail
