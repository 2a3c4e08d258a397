// The residual streams' life outside the sublayers: embedding into 4 copies (spec §2.1),
// Engram (§2.8), dropping truncated rows before the decoder's later layers (§2.6), and the
// final collapse, norm and head. One forward call, the calling thread.
#include <algorithm>

#include "kernels/cpu/op_check.hpp"
#include "kernels/model/forward_pass.hpp"

namespace cedar::model_detail {

void init_batch(const model_args& args, const bf16_weight& embed, std::span<forward_item> batch,
                batch_state& b) {
  const int hc = args.hc_mult, D = args.hidden_size;
  b.items.clear();
  b.positions.clear();
  std::vector<int32_t> tokens;
  for (forward_item& item : batch) {
    CEDAR_OP_CHECK(item.kv != nullptr, "forward_item without KV");
    item_state it;
    it.item = &item;
    it.kv = item.kv;
    it.row_begin = int(b.positions.size());
    it.num_rows = int(item.tokens.size());
    it.first_pos = item.kv->num_tokens;
    it.ring_valid_from = item.replay ? it.first_pos : 0;
    for (int t = 0; t < it.num_rows; ++t) b.positions.push_back(int32_t(it.first_pos + t));
    tokens.insert(tokens.end(), item.tokens.begin(), item.tokens.end());
    b.items.push_back(std::move(it));
  }
  const int n = b.num_rows = int(tokens.size());
  std::vector<float> e(std::size_t(n) * D);  // [n, dim]
  cpu::embed(tokens.data(), n, embed, e.data());
  b.X.resize(std::size_t(n) * hc * D);
  b.pre.assign(std::size_t(n) * hc, 0.0f);
  for (int r = 0; r < n; ++r) {
    for (int h = 0; h < hc; ++h)
      std::copy_n(e.data() + std::size_t(r) * D, D, b.X.data() + (std::size_t(r) * hc + h) * D);
    b.pre[std::size_t(r) * hc] = 1.0f;
  }
}

void apply_engram(const model_args& args, const cpu::engram_hash_params& hash,
                  const cpu::engram_weights& w, batch_state& b) {
  const int per_token = args.engram_rows_per_token();
  std::vector<int64_t> rows(std::size_t(b.num_rows) * per_token);  // [n, rows per token]
  for (const item_state& it : b.items) {
    if (it.num_rows == 0) continue;
    engram_item_rows(hash, it.item->history, it.item->tokens, it.item->kv->num_tokens, it.first_pos, it.num_rows,
                     rows.data() + std::size_t(it.row_begin) * per_token);
  }
  cpu::engram(b.X.data(), b.num_rows, args.hc_mult, args.hidden_size, rows.data(), per_token, w,
              float(args.rms_norm_eps));
}

void drop_truncated_rows(batch_state& b, int index_topk) {
  const std::size_t stride = b.X.size() / std::max(1, b.num_rows);
  const std::size_t hc = b.pre.size() / std::max(1, b.num_rows);
  int out = 0;
  for (item_state& it : b.items) {
    const int64_t tb = it.item->truncate_below;
    const int drop = tb < 0 ? 0 : int(std::clamp<int64_t>(tb - it.first_pos, 0, it.num_rows));
    const int src = it.row_begin + drop, keep = it.num_rows - drop;
    std::copy_n(b.X.begin() + src * stride, keep * stride, b.X.begin() + out * stride);
    std::copy_n(b.pre.begin() + src * hc, keep * hc, b.pre.begin() + out * hc);
    std::copy_n(b.positions.begin() + src, keep, b.positions.begin() + out);
    it.topk.erase(it.topk.begin(), it.topk.begin() + std::min(it.topk.size(),
                                                              std::size_t(drop) * index_topk));
    it.candidates.erase(it.candidates.begin(),
                        it.candidates.begin() + std::min(it.candidates.size(),
                                                         std::size_t(drop) * it.num_candidate_blocks));
    it.row_begin = out;
    it.num_rows = keep;
    it.first_pos += drop;
    out += keep;
  }
  b.num_rows = out;
  b.X.resize(out * stride);
  b.pre.resize(out * hc);
  b.positions.resize(out);
}

void head_logits(const model_args& args, const model_weights& w, const batch_state& b,
                 std::vector<float>& logits) {
  const int hc = args.hc_mult, D = args.hidden_size;
  std::vector<int> rows;
  for (const item_state& it : b.items) {
    const logits_mode mode = it.item->logits;
    if (mode == logits_mode::none) continue;
    CEDAR_OP_CHECK(it.num_rows > 0, "logits asked of an item whose rows were all truncated");
    for (int r = mode == logits_mode::last ? it.num_rows - 1 : 0; r < it.num_rows; ++r)
      rows.push_back(it.row_begin + r);
  }
  const int m = int(rows.size());
  if (m == 0) return;
  std::vector<float> X(std::size_t(m) * hc * D), pre(std::size_t(m) * hc), h(std::size_t(m) * D);
  for (int i = 0; i < m; ++i) {
    std::copy_n(b.X.begin() + std::size_t(rows[i]) * hc * D, hc * D, X.begin() + std::size_t(i) * hc * D);
    std::copy_n(b.pre.begin() + std::size_t(rows[i]) * hc, hc, pre.begin() + std::size_t(i) * hc);
  }
  cpu::hc_collapse(X.data(), pre.data(), m, hc, D, h.data());
  cpu::rmsnorm(h.data(), m, D, w.norm.data(), float(args.rms_norm_eps), h.data());
  const std::size_t old = logits.size();
  logits.resize(old + std::size_t(m) * args.vocab_size);
  cpu::linear_bf16(h.data(), m, w.head, logits.data() + old);
}

}  // namespace cedar::model_detail
