// A small stand-in for the V4.1 model with the same forward contract, for runtime tests that
// must not depend on the model's speed: each position's "KV" is a running hash of every token
// up to it, written into its page; the SWA ring keeps (position, hash) of the last window;
// the last row's logits are a hash of the page value and the whole ring. A wrong page table,
// a stale ring slot or a skipped position changes the tokens (and throws when detectable).
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <span>
#include <vector>
#include <stdexcept>

#include "actors/messages.hpp"
#include "actors/sampler.hpp"
#include "actors/shard.hpp"

namespace cedar::test {

inline model_args toy_args(int window = 8, int vocab = 64) {
  model_args a;
  a.vocab_size = vocab;
  a.num_hidden_layers = 4;
  a.head_dim = 64;
  a.qk_rope_head_dim = 16;
  a.index_head_dim = 32;
  a.sliding_window = window;
  a.compress_ratios = {0, 0, 2, 1, 0};
  a.kv_source_layer_ids = {2, 3};
  a.max_position_embeddings = 1 << 20;
  a.eos_token_id = 1;
  return a;
}

class toy_model final : public step_model {
 public:
  explicit toy_model(model_args a, int page_tokens = 16)
      : args_(std::move(a)), layout_(kv_layout::make(args_, kv_dtype::fp4, page_tokens)) {
    if (layout_.page_bytes < std::size_t(page_tokens) * 16) throw std::logic_error("toy pages too small");
  }
  const model_args& args() const override { return args_; }
  const kv_layout& layout() const override { return layout_; }

  void forward(std::span<forward_item> batch, std::vector<float>& logits) override {
    logits.clear();
    for (auto& it : batch) run_item(it, logits);
  }

  static uint64_t mix(uint64_t a, uint64_t b) {
    uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 31);
  }

 private:
  struct cell {
    uint64_t tag;   // position + 1 when written
    uint64_t hash;  // running hash of tokens [0, position]
  };
  cell* page_cell(request_kv& kv, int64_t pos) const {
    const auto page = std::size_t(pos / layout_.page_tokens);
    if (page >= kv.pages.size()) throw std::runtime_error("position beyond the page table");
    return reinterpret_cast<cell*>(kv.pages[page]) + pos % layout_.page_tokens;
  }
  cell* ring_cell(request_kv& kv, int64_t pos) const {
    return reinterpret_cast<cell*>(kv.swa_ring) + pos % layout_.window;
  }

  void run_item(forward_item& it, std::vector<float>& logits) const {
    request_kv& kv = *it.kv;
    // the look-back the contract promises (the toy reads no token of it)
    if (int64_t(it.history.size()) > kv.num_tokens ||
        int64_t(it.history.size()) < std::min<int64_t>(kv.num_tokens, args_.history_lookback()))
      throw std::runtime_error("history / num_tokens mismatch");
    for (std::size_t i = 0; i < it.tokens.size(); ++i) {
      const int64_t pos = kv.num_tokens + int64_t(i);
      // Like SWA attention, every row reads the window before it; a replay clips at its start.
      const int64_t lo = std::max<int64_t>(it.replay ? kv.num_tokens : 0, pos - layout_.window + 1);
      for (int64_t w = lo; w < pos; ++w)
        if (ring_cell(kv, w)->tag != uint64_t(w + 1)) throw std::runtime_error("stale SWA ring entry");
      cell c = *page_cell(kv, pos);
      if (!it.replay) {
        uint64_t prev = 0;
        if (pos > 0) {
          const cell p = *page_cell(kv, pos - 1);
          if (p.tag != uint64_t(pos)) throw std::runtime_error("previous position was never written");
          prev = p.hash;
        }
        c = {uint64_t(pos + 1), mix(prev, uint64_t(it.tokens[i]))};
        *page_cell(kv, pos) = c;
      } else if (c.tag != uint64_t(pos + 1)) {
        throw std::runtime_error("replay over a position the cached page does not hold");
      }
      *ring_cell(kv, pos) = c;
    }
    kv.num_tokens += int64_t(it.tokens.size());
    if (it.logits == logits_mode::last) append_logits(kv, logits);
  }

  void append_logits(request_kv& kv, std::vector<float>& logits) const {
    const int64_t last = kv.num_tokens - 1;
    uint64_t h = page_cell(kv, last)->hash;
    for (int64_t p = std::max<int64_t>(0, last - layout_.window + 1); p <= last; ++p) {
      const cell c = *ring_cell(kv, p);
      if (c.tag != uint64_t(p + 1)) throw std::runtime_error("stale SWA ring entry");
      h = mix(h, c.hash);
    }
    for (int v = 0; v < args_.vocab_size; ++v) logits.push_back(float(mix(h, uint64_t(v)) % 1000) / 100.f);
  }

  model_args args_;
  kv_layout layout_;
};

/// The stand-alone tokens of `s` on the toy model (default args), computed directly without a
/// scheduler or a pool: the whole prompt in one forward call on private pages and ring, then
/// one token per call, sampled with the request's seed and token index as the shard samples
/// (penalties counted afresh from the output each time).
inline std::vector<int32_t> toy_alone(const request_spec& s, int page_tokens = 16) {
  toy_model m(toy_args(), page_tokens);
  const kv_layout& l = m.layout();
  const std::size_t total = s.prompt.size() + std::size_t(s.max_tokens);
  const std::size_t num_pages = (total + std::size_t(page_tokens) - 1) / std::size_t(page_tokens);
  std::vector<std::vector<uint8_t>> pages(num_pages, std::vector<uint8_t>(l.page_bytes));  // [page_bytes] each
  std::vector<uint8_t> ring(l.ring_bytes());  // [layers, window, record] bytes
  std::vector<float> tails(l.tail_floats());
  request_kv kv;
  for (auto& p : pages) kv.pages.push_back(p.data());
  kv.swa_ring = ring.data();
  kv.tails = tails.data();
  std::vector<int32_t> seq = s.prompt, out;
  std::vector<float> logits;  // [vocab] fp32
  while (int(out.size()) < s.max_tokens) {
    forward_item it;
    it.kv = &kv;
    it.history = std::span<const int32_t>(seq).first(std::size_t(kv.num_tokens));
    it.tokens = std::span<const int32_t>(seq).subspan(std::size_t(kv.num_tokens));
    m.forward(std::span<forward_item>(&it, 1), logits);
    sampling_params p = s.sampling;
    if (p.has_penalty()) {  // recounted from the output at every token
      std::map<int32_t, int32_t> counts;
      for (int32_t t : out) ++counts[t];
      for (auto [id, n] : counts) p.seen_ids.push_back(id), p.seen_counts.push_back(n);
      if (p.repetition_penalty != 1.f) {
        const std::set<int32_t> distinct(s.prompt.begin(), s.prompt.end());
        p.prompt_ids.assign(distinct.begin(), distinct.end());
      }
    }
    out.push_back(sample(logits, p, int64_t(out.size())).token_id);
    seq.push_back(out.back());
  }
  return out;
}

}  // namespace cedar::test
