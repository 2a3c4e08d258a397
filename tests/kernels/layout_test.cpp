// Parallel layouts on CPU shards (kernels/model/shard_plan.hpp): TP-2, TP-4 and DEP-2 run the
// real forward pass on threads joined by the in-process collectives and must give what one
// rank gives, for 50 greedy generations on tiny and micro: the same tokens and the same fp32
// logits (the collectives move disjoint pieces and each rank combines them in the one-rank
// order, so the bound is 0; any difference is reported as the largest |delta|).
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <thread>

#include "config/model_config.hpp"
#include "kernels/collectives/inproc.hpp"
#include "kernels/model/random_weights.hpp"
#include "kernels/model/shard_plan.hpp"
#include "model_test_util.hpp"

namespace cedar::test {
namespace {

const model& load_model(const std::string& preset) {
  static std::map<std::string, std::pair<std::shared_ptr<const tensor_map>, std::unique_ptr<model>>> cache;
  auto& slot = cache[preset];
  if (!slot.second) {
    std::string error;
    const auto args = load_model_args(preset, &error);
    REQUIRE_MESSAGE(args.has_value(), error);
    slot.first = std::make_shared<tensor_map>(make_random_weights(*args, 1234));
    slot.second = std::make_unique<model>(*args, slot.first);
  }
  return *slot.second;
}

/// One greedy generation: its prompt, how many tokens to add, and what came out.
struct generation {
  std::vector<int32_t> prompt;
  int max_new = 0;
  std::vector<int32_t> tokens;         ///< generated
  std::vector<std::vector<float>> logits;  ///< [step] the logits each token was chosen from
};

std::vector<generation> make_prompts(int count, int vocab) {
  std::vector<generation> g(count);
  for (int i = 0; i < count; ++i) {
    g[i].prompt = random_tokens(4 + (i * 7) % 27, vocab, 100 + i);  // 4..30 tokens
    g[i].max_new = 2 + i % 4;
  }
  return g;
}

/// Runs `gens` step by step on one rank: a prefill step (with decoder truncation on prompts
/// longer than the window), then one decode step per token, the rank's generations batched,
/// for `num_steps` steps (a rank with nothing left runs an empty batch: in DEP it still serves
/// its experts). A TP follower (rank > 0) keeps no logits; rank 0 broadcasts the tokens.
void run_rank(const model& m, const shard_view* view, std::vector<generation>& gens, int num_steps) {
  const int vocab = m.args().vocab_size, W = m.args().sliding_window;
  const bool follower = view && view->mode == parallel_mode::tp && view->rank > 0;
  const bool tp = view && view->mode == parallel_mode::tp && view->size > 1;
  std::vector<std::unique_ptr<test_request>> reqs;
  for (std::size_t i = 0; i < gens.size(); ++i) reqs.push_back(std::make_unique<test_request>(m.layout(), 64));
  for (int step = 0; step < num_steps; ++step) {
    std::vector<forward_item> batch;
    std::vector<std::vector<int32_t>> inputs(gens.size());
    std::vector<std::size_t> active;
    for (std::size_t i = 0; i < gens.size(); ++i) {
      generation& g = gens[i];
      if (step >= g.max_new) continue;
      inputs[i] = step == 0 ? g.prompt : std::vector<int32_t>{g.tokens.back()};
      forward_item it = reqs[i]->item(inputs[i], follower ? logits_mode::none : logits_mode::last);
      if (step == 0 && int(g.prompt.size()) > W) it.truncate_below = int64_t(g.prompt.size()) - W;
      batch.push_back(it);
      active.push_back(i);
    }
    std::vector<float> logits;
    if (view) m.forward(batch, logits, *view);
    else m.forward(batch, logits);
    std::vector<float> sampled(active.size());
    for (std::size_t b = 0; b < active.size(); ++b) {
      test_request& r = *reqs[active[b]];
      r.history.insert(r.history.end(), inputs[active[b]].begin(), inputs[active[b]].end());
      if (follower) continue;
      std::span<const float> row(logits.data() + b * vocab, vocab);
      gens[active[b]].logits.emplace_back(row.begin(), row.end());
      sampled[b] = float(argmax(row));
    }
    if (tp) view->comm->broadcast(sampled.data(), sampled.size(), 0);
    for (std::size_t b = 0; b < active.size(); ++b) gens[active[b]].tokens.push_back(int32_t(sampled[b]));
  }
}

/// Runs a layout over all generations: every TP rank runs all of them (rank 0's logits are
/// returned); DEP ranks take interleaved shares.
std::vector<generation> run_layout(const model& m, parallel_mode mode, int size, const std::vector<generation>& prompts) {
  int num_steps = 0;
  for (const auto& g : prompts) num_steps = std::max(num_steps, g.max_new);
  if (size == 1) {
    std::vector<generation> out = prompts;
    run_rank(m, nullptr, out, num_steps);
    return out;
  }
  auto group = inproc_group::make(size);
  std::vector<std::vector<generation>> per_rank(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < prompts.size(); ++i)
      if (mode == parallel_mode::tp || int(i) % size == r) per_rank[r].push_back(prompts[i]);
    threads.emplace_back([&, r, comm = std::shared_ptr<communicator>(group->join(r))] {
      try {
        const shard_view v = make_shard_view(m.args(), mode, r, size, comm.get());
        run_rank(m, &v, per_rank[r], num_steps);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        group->abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
  if (mode == parallel_mode::tp) return per_rank[0];
  std::vector<generation> out(prompts.size());
  for (int r = 0; r < size; ++r)
    for (std::size_t j = 0; j < per_rank[r].size(); ++j) out[j * size + r] = per_rank[r][j];
  return out;
}

/// Compares a layout's generations with one rank's: tokens must match; returns the largest
/// |logit difference| over every step.
float compare(const std::vector<generation>& want, const std::vector<generation>& got) {
  float worst = 0.0f;
  REQUIRE(want.size() == got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("prompt " << i);
    CHECK(got[i].tokens == want[i].tokens);
    REQUIRE(got[i].logits.size() == want[i].logits.size());
    for (std::size_t s = 0; s < want[i].logits.size(); ++s)
      worst = std::max(worst, max_abs_diff(want[i].logits[s], got[i].logits[s]));
  }
  return worst;
}

}  // namespace

TEST_CASE("layouts: TP-2, TP-4 and DEP-2 give TP-1's tokens and logits on tiny and micro") {
  for (const std::string preset : {"micro", "tiny"}) {
    const model& m = load_model(preset);
    const auto prompts = make_prompts(50, m.args().vocab_size);
    const auto want = run_layout(m, parallel_mode::tp, 1, prompts);
    for (const auto& [mode, size] : {std::pair{parallel_mode::tp, 2}, std::pair{parallel_mode::tp, 4},
                                     std::pair{parallel_mode::dep, 2}}) {
      INFO(preset << (mode == parallel_mode::tp ? " TP-" : " DEP-") << size);
      const float worst = compare(want, run_layout(m, mode, size, prompts));
      MESSAGE(preset << (mode == parallel_mode::tp ? " TP-" : " DEP-") << size << ": max |logit delta| " << worst);
      CHECK(worst == 0.0f);
    }
  }
}

TEST_CASE("layouts: a rank's view splits heads for TP and experts round-robin for both") {
  std::string error;
  const auto a = load_model_args("tiny", &error);
  REQUIRE(a.has_value());
  CHECK(check_layout(*a, parallel_mode::tp, 3) != "");  // 4 heads do not split 3 ways
  CHECK(check_layout(*a, parallel_mode::dep, a->n_routed_experts + 1) != "");
  auto group = inproc_group::make(4);
  std::vector<std::unique_ptr<communicator>> comms;
  int heads = 0;
  std::vector<int> owners(a->n_routed_experts, 0);
  for (int r = 0; r < 4; ++r) {
    comms.push_back(group->join(r));
    const shard_view v = make_shard_view(*a, parallel_mode::tp, r, 4, comms.back().get());
    CHECK(v.head_begin == heads);
    heads = v.head_end;
    for (int e = 0; e < a->n_routed_experts; ++e) owners[e] += v.owns_expert(e);
  }
  CHECK(heads == a->num_attention_heads);
  for (int n : owners) CHECK(n == 1);
}

}  // namespace cedar::test
