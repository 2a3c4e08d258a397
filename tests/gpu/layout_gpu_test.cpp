// Multi-GPU layouts on real devices (needs two or more; skipped otherwise): TP-2 and DEP-2 of
// the GPU model, each rank's shard on its own device and thread joined by NCCL, give the greedy
// tokens of one GPU (TP-1, the same fast kernels) on micro with random weights: prompts of
// several lengths prefilled, then decoded step by step. DEP-2 also runs steps where one rank has
// no request of its own (it must still serve the other rank's expert slots).
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "actors/gpu_shard.hpp"
#include "config/model_config.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/model/random_weights.hpp"
#include "tests/gpu/gpu_test_util.hpp"
#include "tests/gpu/preset_weights.hpp"

using namespace cedar;

namespace {

using setup = gpu_test::preset_weights;

const setup& micro_weights() { return gpu_test::random_preset("micro", 4321); }

/// A request as a tiny scheduler keeps it on one shard.
struct req {
  std::vector<int32_t> tokens;
  std::vector<int32_t> pages;
  int32_t slot = -1;
  int64_t computed = 0;
  int generated = 0;
};

constexpr int max_tokens = 512;

kv_capacity capacity(const kv_layout& l, int requests) {
  kv_capacity cap;
  cap.num_slots = requests;
  cap.num_pages = requests * (max_tokens / l.page_tokens + 1);
  cap.page_bytes = l.page_bytes;
  cap.slot_bytes = l.ring_bytes() + l.tail_floats() * sizeof(float);
  cap.budget_bytes =
      int64_t(cap.num_pages) * int64_t(cap.page_bytes) + int64_t(cap.num_slots) * int64_t(cap.slot_bytes);
  return cap;
}

std::vector<req> make_requests(const std::vector<int>& lengths, const kv_layout& l) {
  std::vector<req> out;
  std::mt19937 g(99);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    req r;
    for (int t = 0; t < lengths[i]; ++t) r.tokens.push_back(int32_t(3 + g() % 20000));
    const int per = max_tokens / l.page_tokens + 1;  // pages a request
    for (int p = 0; p < per; ++p) r.pages.push_back(int32_t(int(i) * per + p));
    r.slot = int32_t(i);
    out.push_back(std::move(r));
  }
  return out;
}

/// One step of the given requests (prefill of what is new, sampling greedily at its end).
run_step step_of(const std::vector<req*>& rs, uint64_t id) {
  run_step s;
  s.step_id = id;
  for (const req* r : rs) {
    step_item it;
    it.request_id = uint64_t(r->slot + 1);
    it.tokens = r->tokens;
    it.start_pos = r->computed;
    it.page_ids = r->pages;
    it.ring_slot = r->slot;
    it.sample = true;
    it.token_idx = r->generated;
    s.items.push_back(std::move(it));
  }
  return s;
}

void take(const step_output& out, const std::vector<req*>& rs) {
  REQUIRE_MESSAGE(out.error.empty(), out.error);
  REQUIRE(out.results.size() == rs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    rs[i]->computed = int64_t(rs[i]->tokens.size());
    rs[i]->tokens.push_back(out.results[i].token.token_id);
    ++rs[i]->generated;
  }
}

std::shared_ptr<const gpu_model> upload(int device, gpu_placement p) {
  const setup& s = micro_weights();
  cuda::set_device(device);
  return std::make_shared<gpu_model>(s.args, s.weights, kv_dtype::fp4, upload_progress_fn{}, gpu_kernels::fast, false,
                                     p);
}

/// Runs fn(rank) for every rank at once, each on a thread of its own.
void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&, r] { fn(r); });
  for (std::thread& t : ts) t.join();
}

}  // namespace

TEST_CASE("layouts on GPUs: TP-2 and DEP-2 give one GPU's greedy tokens") {
  if (!gpu_test::have_gpu()) return;
  if (cuda::device_count() < 2) {
    MESSAGE("multi-GPU layout test skipped: " << cuda::device_count() << " CUDA device(s)");
    return;
  }
  const setup& s = micro_weights();
  const std::vector<int> lengths = {37, 130, 5, 260};
  const int decode_steps = 6, n = int(lengths.size());

  // TP-1 on device 0
  auto one = upload(0, {});
  const kv_layout layout = one->layout();
  std::vector<req> ref = make_requests(lengths, layout);
  {
    shard sh(std::make_unique<gpu_step_model>(one, false), capacity(layout, n));
    std::vector<req*> all;
    for (req& r : ref) all.push_back(&r);
    uint64_t id = 1;
    for (int st = 0; st <= decode_steps; ++st) take(sh.run(step_of(all, id++)), all);
  }

  std::vector<std::shared_ptr<const gpu_model>> ranks = {upload(0, {0, 2}), upload(1, {1, 2})};
  const auto shards_for = [&](parallel_mode mode) {
    auto comms = make_gpu_group({0, 1});
    std::vector<std::unique_ptr<shard>> sh(2);
    on_ranks(2, [&](int r) {
      cuda::set_device(r);
      sh[r] = std::make_unique<shard>(
          std::make_unique<gpu_step_model>(ranks[r], false, make_shard_view(s.args, mode, r, 2, comms[r].get()),
                                           std::move(comms[r])),
          capacity(layout, n));
    });
    return sh;
  };

  SUBCASE("TP-2: every rank runs every request; the leader's tokens") {
    auto sh = shards_for(parallel_mode::tp);
    std::vector<std::vector<req>> reqs = {make_requests(lengths, layout), make_requests(lengths, layout)};
    uint64_t id = 1;
    for (int st = 0; st <= decode_steps; ++st, ++id) {
      on_ranks(2, [&](int r) {
        std::vector<req*> all;
        for (req& q : reqs[r]) all.push_back(&q);
        take(sh[r]->run(step_of(all, id)), all);
      });
      // the follower runs on the leader's tokens (its own come back as 0), as the runtime feeds it
      for (int i = 0; i < n; ++i) reqs[1][i].tokens.back() = reqs[0][i].tokens.back();
    }
    for (int i = 0; i < n; ++i) CHECK(reqs[0][i].tokens == ref[i].tokens);
  }

  SUBCASE("DEP-2: requests split over the ranks, one rank idle for some steps") {
    auto sh = shards_for(parallel_mode::dep);
    std::vector<req> reqs = make_requests(lengths, layout);
    // rank 0: requests 0 and 1; rank 1: 2 and 3, which start two steps late (rank 1 idle)
    uint64_t id = 1;
    for (int st = 0; st <= decode_steps + 2; ++st, ++id) {
      on_ranks(2, [&](int r) {
        std::vector<req*> mine;
        for (int i = 2 * r; i < 2 * r + 2; ++i)
          if (reqs[i].generated <= decode_steps && (r == 0 || st >= 2)) mine.push_back(&reqs[i]);
        take(sh[r]->run(step_of(mine, id)), mine);
      });
    }
    for (int i = 0; i < n; ++i) CHECK(reqs[i].tokens == ref[i].tokens);
  }
}
