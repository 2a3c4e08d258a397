// Runs a step on one shard: page ids -> request_kv, forward, sample (see shard.hpp).
#include "actors/shard.hpp"

#include <cstring>
#include <exception>

#include "actors/errors.hpp"

namespace cedar {
namespace {

class model_adapter final : public step_model {
 public:
  explicit model_adapter(std::shared_ptr<const model> m) : m_(std::move(m)) {}
  const model_args& args() const override { return m_->args(); }
  const kv_layout& layout() const override { return m_->layout(); }
  void forward(std::span<forward_item> batch, std::vector<float>& logits) override { m_->forward(batch, logits); }

 private:
  std::shared_ptr<const model> m_;
};

}  // namespace

std::size_t drop_logits(std::span<forward_item> batch) {
  std::size_t rows = 0;
  for (forward_item& it : batch) {
    rows += it.logits == logits_mode::last ? 1 : it.logits == logits_mode::all ? it.tokens.size() : 0;
    it.logits = logits_mode::none;
  }
  return rows;
}

std::unique_ptr<step_model> wrap_model(std::shared_ptr<const model> m) {
  return std::make_unique<model_adapter>(std::move(m));
}

host_kv_arena::host_kv_arena(const kv_layout& layout, kv_capacity cap)
    : layout_(layout), cap_(cap), pages_(cap.num_pages), rings_(cap.num_slots), tails_(cap.num_slots) {}

uint8_t* host_kv_arena::page(int32_t id) {
  CEDAR_CHECK(id >= 0 && id < cap_.num_pages);
  if (!pages_[id]) pages_[id] = std::make_unique<uint8_t[]>(layout_.page_bytes);
  return pages_[id].get();
}

uint8_t* host_kv_arena::ring(int32_t slot) {
  CEDAR_CHECK(slot >= 0 && slot < cap_.num_slots);
  if (!rings_[slot]) rings_[slot] = std::make_unique<uint8_t[]>(layout_.ring_bytes());
  return rings_[slot].get();
}

float* host_kv_arena::tails(int32_t slot) {
  CEDAR_CHECK(slot >= 0 && slot < cap_.num_slots);
  if (!tails_[slot]) tails_[slot] = std::make_unique<float[]>(std::max<std::size_t>(1, layout_.tail_floats()));
  return tails_[slot].get();
}

void host_kv_arena::read_page(int32_t id, uint8_t* out) { std::memcpy(out, page(id), layout_.page_bytes); }

void host_kv_arena::copy_page(int32_t dst_id, kv_arena& src, int32_t src_id) { src.read_page(src_id, page(dst_id)); }

shard::shard(std::unique_ptr<step_model> m, kv_capacity cap) : model_(std::move(m)), arena_(model_->make_arena(cap)) {}

step_output shard::run(const run_step& step) {
  const std::size_t n = step.items.size();
  std::vector<request_kv> kvs(n);
  std::vector<forward_item> batch(n);
  for (std::size_t i = 0; i < n; ++i) {
    const step_item& s = step.items[i];
    for (int32_t p : s.page_ids) kvs[i].pages.push_back(arena_->page(p));
    kvs[i].swa_ring = arena_->ring(s.ring_slot);
    kvs[i].tails = arena_->tails(s.ring_slot);
    kvs[i].num_tokens = s.start_pos;
    std::span<const int32_t> all(s.tokens);
    const auto before = std::size_t(s.start_pos - s.tokens_from);
    batch[i].kv = &kvs[i];
    batch[i].history = all.first(before);
    batch[i].tokens = all.subspan(before);
    batch[i].logits = s.sample ? logits_mode::last : logits_mode::none;
    batch[i].replay = s.replay;
    batch[i].truncate_below = s.truncate_below;
  }
  std::vector<sampling_params> params;
  std::vector<int64_t> token_idx;
  for (const step_item& s : step.items)
    if (s.sample) params.push_back(s.sampling), token_idx.push_back(s.token_idx);
  step_output out;
  out.step_id = step.step_id;
  std::vector<sampled_token> tokens;
  try {
    tokens = model_->forward_sample(batch, params, token_idx);
  } catch (const std::exception& e) {
    out.error = e.what();
    return out;
  }
  CEDAR_CHECK(tokens.size() == params.size());
  std::size_t next = 0;
  for (const step_item& s : step.items) {
    item_result r;
    r.request_id = s.request_id;
    if (s.sample) r.has_token = true, r.token = std::move(tokens[next++]);
    out.results.push_back(std::move(r));
  }
  return out;
}

std::vector<sampled_token> step_model::forward_sample(std::span<forward_item> batch,
                                                      std::span<const sampling_params> params,
                                                      std::span<const int64_t> token_idx) {
  std::vector<float> logits;
  forward(batch, logits);
  const std::size_t vocab = std::size_t(args().vocab_size);
  CEDAR_CHECK(logits.size() == params.size() * vocab);
  std::vector<sampled_token> out;
  for (std::size_t i = 0; i < params.size(); ++i)
    out.push_back(sample(std::span<const float>(logits).subspan(i * vocab, vocab), params[i], token_idx[i]));
  return out;
}

}  // namespace cedar
