// The plain-C++ parts of layouts, without actors: layout names, session routing (affinity,
// balance, regrouping) and re-homing requests with their cached pages from one scheduler to
// two others mid-run, against the toy model (whose tokens depend on every page byte and ring
// entry, so a page not copied or a ring not rebuilt changes them or throws).
#include <doctest/doctest.h>

#include <map>

#include "actors/layout.hpp"
#include "actors/rehome.hpp"
#include "config/model_config.hpp"
#include "tests/actors/toy_model.hpp"

using namespace cedar;

namespace {

engine_options toy_options() {
  engine_options o;
  o.page_tokens = 16;
  o.max_num_seqs = 8;
  o.max_batched_tokens = 64;
  o.max_prefill_tokens_per_request = 24;
  o.kv_budget_bytes = 16 << 20;
  return o;
}

/// A scheduler and its shard running the toy model.
struct group {
  std::unique_ptr<scheduler> sched;
  std::unique_ptr<shard> sh;
  explicit group(const engine_options& o) {
    auto m = std::make_unique<test::toy_model>(test::toy_args(), o.page_tokens);
    sched = std::make_unique<scheduler>(m->args(), m->layout(), o);
    sh = std::make_unique<shard>(std::move(m), sched->pool().capacity());
  }
  /// One step; false when nothing ran. Tokens go to `out`.
  bool step(std::map<uint64_t, std::vector<int32_t>>& out) {
    auto s = sched->next_step();
    if (s) REQUIRE(sched->apply(sh->run(*s)));
    for (auto& b : sched->take_events()) out[b.request_id].insert(out[b.request_id].end(), b.ids.begin(), b.ids.end());
    return s.has_value();
  }
};

request_spec spec_of(int i) {
  request_spec s;
  s.session_id = uint64_t(i + 1);
  for (int k = 0; k < 20 + 9 * i; ++k) s.prompt.push_back(2 + (k * 7 + i * 13) % 60);
  s.max_tokens = 12;
  s.ignore_eos = true;
  return s;
}

}  // namespace

TEST_CASE("layouts: names parse and are checked against the model") {
  std::string error;
  const auto a = load_model_args("micro", &error);
  REQUIRE(a.has_value());
  CHECK(parse_layout("tp4", *a).value().num_shards == 4);
  CHECK(parse_layout("dep2", *a).value().num_groups() == 2);
  CHECK(parse_layout("tp4", *a).value().num_groups() == 1);
  CHECK(parse_layout("dep2", *a).value().name() == "dep2");
  for (const char* bad : {"tp3", "tp", "dp2", "dep0", "tp-1", "dep99"}) {
    INFO(bad);
    CHECK_FALSE(parse_layout(bad, *a).ok());
  }
}

TEST_CASE("session router: a session stays on its group; new sessions and loose requests balance") {
  session_router r(2);
  CHECK(r.route(10, {0, 0}) == 0);
  CHECK(r.route(11, {0, 0}) == 1);
  CHECK(r.route(12, {0, 0}) == 0);
  CHECK(r.route(10, {9, 0}) == 0);  // affinity beats load
  CHECK(r.route(0, {3, 1}) == 1);   // no session: the least loaded group
  r.forget(12);
  CHECK(r.route(13, {0, 0}) == 0);  // group 0 has one live session again, like group 1
  r.regroup(3);
  std::vector<int> seen(3, 0);
  for (uint64_t s : {10, 11, 13}) ++seen[r.group_of(s)];
  CHECK(seen == std::vector<int>{1, 1, 1});
}

TEST_CASE("rehome: requests moved mid-run to two new groups finish with the tokens of an unmoved run") {
  const engine_options o = toy_options();
  std::map<uint64_t, std::vector<int32_t>> want;
  {
    group g(o);
    for (int i = 0; i < 6; ++i) g.sched->submit(spec_of(i));
    while (g.step(want)) {
    }
  }
  std::map<uint64_t, std::vector<int32_t>> got;
  group old(o);
  session_router router(1);
  std::map<uint64_t, int> where;
  for (int i = 0; i < 6; ++i) where[old.sched->submit(spec_of(i)).value()] = router.route(uint64_t(i + 1), {0});
  for (int s = 0; s < 6; ++s) old.step(got);  // prefills done for some, decoding for others
  REQUIRE(old.sched->has_work());

  group a(o), b(o);
  router.regroup(2);
  const rehome_stats st = rehome({{old.sched.get(), &old.sh->arena()}},
                                 {{a.sched.get(), {&a.sh->arena()}}, {b.sched.get(), {&b.sh->arena()}}},
                                 old.sh->model_ref().layout(), router, where);
  CHECK(st.requests_moved == 6);
  CHECK(st.pages_copied > 0);
  CHECK(st.chains_dropped == 0);
  CHECK_FALSE(old.sched->has_work());
  int on_a = 0;
  for (const auto& [id, g] : where) on_a += g == 0;
  CHECK(on_a == 3);  // sessions dealt out evenly
  while (a.step(got) | b.step(got)) {
  }
  CHECK(got == want);
}

TEST_CASE("rehome: a group whose KV was lost recomputes from the tokens") {
  const engine_options o = toy_options();
  std::map<uint64_t, std::vector<int32_t>> want, got;
  {
    group g(o);
    g.sched->submit(spec_of(2));
    while (g.step(want)) {
    }
  }
  group old(o), fresh(o);
  session_router router(1);
  std::map<uint64_t, int> where;
  old.sched->submit(spec_of(2));
  for (int s = 0; s < 4; ++s) old.step(got);
  const rehome_stats st = rehome({{old.sched.get(), nullptr}}, {{fresh.sched.get(), {&fresh.sh->arena()}}},
                                 old.sh->model_ref().layout(), router, where);
  CHECK(st.pages_copied == 0);
  CHECK(st.chains_dropped > 0);  // its cached pages went with the shard
  while (fresh.step(got)) {
  }
  CHECK(got == want);
}

TEST_CASE("rehome: merging groups keeps each group's newest chains, and their LRU order") {
  // Two old groups, each with four finished sessions (oldest first): four cached chains each.
  const engine_options o = toy_options();
  group g0(o), g1(o);
  std::map<uint64_t, std::vector<int32_t>> out;
  std::vector<std::vector<int32_t>> prompts[2];
  for (int k = 0; k < 4; ++k) {
    for (int s = 0; s < 2; ++s) {
      request_spec spec = spec_of(2 + k);
      for (auto& t : spec.prompt) t = 2 + (t + 31 * s + 7 * k) % 60;  // no prefix shared across chains
      spec.session_id = 0;
      prompts[s].push_back(spec.prompt);
      group& g = s ? g1 : g0;
      g.sched->submit(spec);
      while (g.step(out)) {
      }
    }
  }
  const auto c0 = g0.sched->cached_chains(), c1 = g1.sched->cached_chains();
  REQUIRE(c0.size() == 4);
  REQUIRE(c1.size() == 4);
  // The new group holds only about half of it: the two newest chains of each old group.
  int64_t pages_needed = 0;
  for (const auto& c : {c0[0], c0[1], c1[0], c1[1]}) pages_needed += int64_t(c.page_ids.size());
  engine_options small = o;
  const auto layout = kv_layout::make(test::toy_args(), kv_dtype::fp4, o.page_tokens);
  small.kv_budget_bytes = int64_t(o.max_num_seqs) * int64_t(layout.ring_bytes() + layout.tail_floats() * 4) +
                          pages_needed * int64_t(layout.page_bytes);
  group merged(small);
  REQUIRE(merged.sched->pool().capacity().num_pages == pages_needed);
  session_router router(2);
  router.regroup(1);
  std::map<uint64_t, int> where;
  const rehome_stats st = rehome({{g0.sched.get(), &g0.sh->arena()}, {g1.sched.get(), &g1.sh->arena()}},
                                 {{merged.sched.get(), {&merged.sh->arena()}}}, layout, router, where);
  CHECK(st.pages_copied == pages_needed);
  CHECK(st.chains_dropped == 4);
  // What the new group caches, most recent first: the newest of each, then the next of each,
  // each old group's order kept (a chain is known by its first tokens).
  std::vector<std::vector<int32_t>> kept;
  for (const auto& c : merged.sched->cached_chains()) kept.emplace_back(c.tokens.begin(), c.tokens.begin() + 16);
  auto head = [&](int s, int k) { return std::vector<int32_t>(prompts[s][std::size_t(k)].begin(), prompts[s][std::size_t(k)].begin() + 16); };
  CHECK(kept == std::vector<std::vector<int32_t>>{head(0, 3), head(1, 3), head(0, 2), head(1, 2)});
}
