// The plain-C++ policies of the runtime, without actors: engine options, sampling, KV page
// accounting, the prefix cache, replay planning and the two stages of the batch plan.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "actors/batch_plan.hpp"
#include "actors/prefix_cache.hpp"
#include "actors/replay.hpp"
#include "actors/sampler.hpp"
#include "config/engine_options.hpp"
#include "kernels/sampling_order.hpp"
#include "tests/actors/toy_model.hpp"

using namespace cedar;

TEST_CASE("engine options: every flag parses, bad values are named, unknown flags pass through") {
  auto r = parse_engine_options({"--prefix-cache", "off", "--swa-replay=full", "--decoder-truncation", "off",
                                 "--kv-dtype", "fp8", "--max-num-seqs", "7", "--max-batched-tokens=99",
                                 "--kv-budget-bytes", "123456789", "--port", "80"});
  CHECK(r.errors.empty());
  CHECK(!r.options.prefix_cache);
  CHECK(r.options.swa_replay == swa_replay_mode::full);
  CHECK(!r.options.decoder_truncation);
  CHECK(r.options.kv_fp8);
  CHECK(r.options.max_num_seqs == 7);
  CHECK(r.options.max_batched_tokens == 99);
  CHECK(r.options.kv_budget_bytes == 123456789);
  CHECK(r.rest == std::vector<std::string>{"--port", "80"});
  // which flags were given, so a device can default the ones that were not
  CHECK(r.given.count("--max-batched-tokens") == 1);
  CHECK(r.given.count("--kv-budget-bytes") == 1);
  CHECK(r.given.count("--max-prefill-chunk") == 0);
  auto bad = parse_engine_options({"--swa-replay", "some", "--max-num-seqs", "0", "--kv-dtype"});
  REQUIRE(bad.errors.size() == 3);
  CHECK(bad.errors[0].find("--swa-replay") != std::string::npos);
  CHECK(bad.errors[1].find("--kv-dtype") != std::string::npos);
  CHECK(bad.errors[2].find("--max-num-seqs") != std::string::npos);
}

namespace {

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

/// The distribution sampling should follow, computed the slow way.
std::vector<double> reference_probs(const std::vector<float>& l, const sampling_params& p) {
  const int n = int(l.size());
  std::vector<int> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] > l[b]; });
  const int k = p.top_k > 0 ? std::min(p.top_k, n) : n;
  std::vector<double> w(n, 0.0);
  double z = 0;
  const double top = std::exp(double(l[ids[0]]) / p.temperature);
  for (int i = 0; i < k; ++i) {
    w[ids[i]] = std::exp(double(l[ids[i]]) / p.temperature);
    if (w[ids[i]] < p.min_p * top) w[ids[i]] = 0;  // min_p: against the likeliest token
    z += w[ids[i]];
  }
  double cum = 0;
  std::vector<double> out(n, 0.0);
  double kept = 0;
  for (int i = 0; i < k; ++i) {
    out[ids[i]] = w[ids[i]];
    kept += w[ids[i]];
    if ((cum += w[ids[i]] / z) >= p.top_p) break;
  }
  for (auto& x : out) x /= kept;
  return out;
}

}  // namespace

TEST_CASE("sampler: greedy picks the arg-max (ties to the lowest id) and reports exact logprobs") {
  std::vector<float> l = random_logits(50, 1);
  l[17] = l[31] = 100.f;
  sampling_params p;
  p.logprobs = 3;
  const sampled_token t = sample(l, p, 0);
  CHECK(t.token_id == 17);
  double z = 0;
  for (float x : l) z += std::exp(double(x) - 100.0);
  CHECK(t.logprob == doctest::Approx(-std::log(z)).epsilon(1e-5));
  REQUIRE(t.top_ids.size() == 3);
  CHECK(t.top_ids[0] == 17);
  CHECK(t.top_ids[1] == 31);
}

TEST_CASE("sampler: seeded draws are reproducible and follow temperature / top-k / top-p") {
  const std::vector<float> l = random_logits(12, 2);
  for (auto [temp, k, top_p, min_p] : {std::tuple{1.f, 0, 1.f, 0.f}, {0.7f, 5, 1.f, 0.f}, {1.3f, 0, 0.8f, 0.f},
                                        {1.f, 4, 0.6f, 0.f}, {1.f, 0, 1.f, 0.1f}, {1.2f, 0, 0.9f, 0.05f}}) {
    sampling_params p;
    p.temperature = temp, p.top_k = k, p.top_p = top_p, p.min_p = min_p, p.seed = 42;
    const auto ref = reference_probs(l, p);
    std::vector<double> freq(l.size(), 0.0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) freq[sample(l, p, i).token_id] += 1.0 / n;
    for (std::size_t v = 0; v < l.size(); ++v) {
      if (ref[v] == 0.0) CHECK(freq[v] == 0.0);
      CHECK(std::abs(freq[v] - ref[v]) < 0.012);
    }
    CHECK(sample(l, p, 7).token_id == sample(l, p, 7).token_id);
  }
  // a temperature near 0 is near-greedy: the arg-max, never a NaN draw's last token
  for (float tiny : {1e-30f, 1e-40f}) {
    sampling_params p;
    p.temperature = tiny, p.seed = 3;
    const int32_t top = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    for (int i = 0; i < 20; ++i) CHECK(sample(l, p, i).token_id == top);
  }
  sampling_params bad;
  bad.top_p = 0.f;
  CHECK(!validate(bad, 12).empty());
  bad = {};
  bad.temperature = -1.f;
  CHECK(!validate(bad, 12).empty());
}

TEST_CASE("sampler: frequency and presence penalties lower the logits of tokens already sampled") {
  std::vector<float> l(10, 0.f);
  l[3] = 5.f, l[7] = 4.f, l[2] = 3.5f;
  sampling_params p;  // greedy
  p.seen_ids = {3, 7};
  p.seen_counts = {2, 1};
  CHECK(sample(l, p, 0).token_id == 3);  // no penalty set: the counts are not read
  p.presence_penalty = 0.9f;  // 3: 4.1, 7: 3.1, 2: 3.5
  CHECK(sample(l, p, 0).token_id == 3);
  p.frequency_penalty = 0.5f;  // 3: 5 - 1 - 0.9 = 3.1, 7: 4 - 0.5 - 0.9 = 2.6, 2: 3.5
  const sampled_token t = sample(l, p, 0);
  CHECK(t.token_id == 2);
  // the logprob stays the model's own, before the penalty
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  CHECK(t.logprob == doctest::Approx(3.5 - std::log(z)).epsilon(1e-5));
  p.frequency_penalty = p.presence_penalty = -2.f;  // negative: seen tokens are favoured
  p.seen_ids = {0};
  p.seen_counts = {3};  // 0 + 6 + 2 = 8
  CHECK(sample(l, p, 0).token_id == 0);
  // sampled draws never take a token pushed far down, and follow the adjusted distribution
  p.temperature = 1.f, p.seed = 4;
  p.frequency_penalty = 2.f, p.presence_penalty = 2.f;
  p.seen_ids = {3, 7, 2};
  p.seen_counts = {20, 20, 20};
  for (int i = 0; i < 200; ++i) {
    const int32_t id = sample(l, p, i).token_id;
    CHECK((id != 3 && id != 7 && id != 2));
  }
  sampling_params bad;
  bad.frequency_penalty = 2.5f;
  CHECK(validate(bad, 10).find("frequency_penalty") != std::string::npos);
  bad = {};
  bad.seen_ids = {12};
  bad.seen_counts = {1};
  CHECK(!validate(bad, 10).empty());
  CHECK(bad.host_only() == false);
  bad.presence_penalty = 0.1f;
  CHECK(bad.host_only());
}

TEST_CASE("sampler: a repetition penalty divides positive logits and multiplies negative ones, once a token") {
  std::vector<float> l(10, 0.f);
  l[3] = 6.f, l[7] = 4.f, l[2] = 3.5f, l[5] = -1.f, l[1] = -0.5f;
  sampling_params p;  // greedy
  p.prompt_ids = {3, 5};
  p.seen_ids = {3, 7};
  p.seen_counts = {4, 1};
  CHECK(sample(l, p, 0).token_id == 3);  // no penalty set: neither list is read
  p.repetition_penalty = 1.6f;           // 3: 6 / 1.6 = 3.75 (once, though in both lists), 7: 2.5, 2: 3.5
  const sampled_token t = sample(l, p, 0);
  CHECK(t.token_id == 3);
  p.repetition_penalty = 1.75f;  // 3: 3.43, 2: 3.5
  CHECK(sample(l, p, 0).token_id == 2);
  // below 1 it favours repeats: a negative logit is multiplied (5: -1 * 0.1 = -0.1 beats 1's -0.5)
  std::vector<float> neg(10, -3.f);
  neg[5] = -1.f, neg[1] = -0.5f;
  p.repetition_penalty = 0.1f;
  p.prompt_ids = {5};
  p.seen_ids = {}, p.seen_counts = {};
  CHECK(sample(neg, p, 0).token_id == 5);
  // the logprob stays the model's own
  double z = 0;
  for (float x : neg) z += std::exp(double(x));
  CHECK(sample(neg, p, 0).logprob == doctest::Approx(-1.0 - std::log(z)).epsilon(1e-5));
  // with the OpenAI penalties after it: 3 is 6 / 1.5 = 4, less 2 * 0.5 = 3; 7: 4 / 1.5 - 0.5 = 2.17; 2: 3.5
  p.repetition_penalty = 1.5f, p.frequency_penalty = 0.5f;
  p.prompt_ids = {};
  p.seen_ids = {3, 7}, p.seen_counts = {2, 1};
  CHECK(sample(l, p, 0).token_id == 2);
  CHECK(p.host_only());
  sampling_params bad;
  bad.repetition_penalty = 0.f;
  CHECK(validate(bad, 10).find("repetition_penalty") != std::string::npos);
  bad.repetition_penalty = INFINITY;
  CHECK(!validate(bad, 10).empty());
  bad = {};
  bad.prompt_ids = {4, 2};  // not ascending
  CHECK(!validate(bad, 10).empty());
  bad.prompt_ids = {2, 10};  // outside the vocabulary
  CHECK(!validate(bad, 10).empty());
  bad.prompt_ids = {2, 4};
  CHECK(validate(bad, 10).empty());
}

TEST_CASE("sampler: logit_bias moves the draw, not the reported logprobs") {
  std::vector<float> l(10, 0.f);
  l[3] = 5.f;
  sampling_params p;
  p.bias_ids = {6};
  p.bias_values = {4.5f};
  CHECK(sample(l, p, 0).token_id == 3);  // 4.5 < 5
  p.bias_values = {5.5f};
  const sampled_token t = sample(l, p, 0);
  CHECK(t.token_id == 6);
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  CHECK(t.logprob == doctest::Approx(-std::log(z)).epsilon(1e-5));
  p.bias_ids = {3, 6};  // -100 bans a token in practice, sampled or not
  p.bias_values = {-100.f, 0.f};
  p.temperature = 1.f, p.seed = 9;
  for (int i = 0; i < 200; ++i) CHECK(sample(l, p, i).token_id != 3);
  CHECK(p.host_only());
  p.bias_ids = {10};
  p.bias_values = {1.f};
  CHECK(validate(p, 10).find("outside the vocabulary") != std::string::npos);
  p.bias_ids = {1};
  p.bias_values = {101.f};
  CHECK(!validate(p, 10).empty());
}

TEST_CASE("sampler: the order by logit is a stable comparison sort's, over ties, signed zeros, -inf and denormals") {
  std::mt19937 g(21);
  for (const std::size_t n : {std::size_t(2), std::size_t(3), std::size_t(1000), std::size_t(129280)}) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<float> l(n);
      std::normal_distribution<float> d(0.f, 4.f);
      for (auto& x : l) {
        x = d(g);
        if (variant == 1) x = std::round(x * 2.f) / 2.f;  // many ties
        if (variant == 2) {  // the edge values of a masked or odd row
          const float edge[] = {-0.f, 0.f, -INFINITY, 1e-42f, -1e-42f, 3e38f, -3e38f, x};
          x = edge[std::uniform_int_distribution<int>(0, 7)(g)];
        }
      }
      std::vector<int32_t> want(n);
      std::iota(want.begin(), want.end(), 0);
      std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return l[std::size_t(a)] > l[std::size_t(b)]; });
      CAPTURE(n);
      CAPTURE(variant);
      CHECK(order_by_logit(l, n) == want);
      CHECK(order_by_logit(l, n + 5) == want);
      const std::vector<int32_t> top(want.begin(), want.begin() + long(std::min<std::size_t>(n, 20)));
      CHECK(order_by_logit(l, 20) == top);
    }
  }
}

TEST_CASE("sampling order: blocked sums and the first index whose running sum stops, against the definition") {
  std::mt19937 g(5);
  std::uniform_real_distribution<double> d(0.0, 1.0);
  const int C = sampling_order::chunk;
  for (const std::size_t n : {std::size_t(1), std::size_t(C - 1), std::size_t(C), std::size_t(3 * C + 17)}) {
    std::vector<double> x(n);
    for (auto& v : x) v = d(g) * (d(g) < 0.1 ? 1e6 : 1.0);  // a few large terms: rounding shows
    // the definition: chunk sums from 0, added in chunk order; a running sum is the chunks
    // before plus its own chunk up to it
    std::vector<double> parts;
    for (std::size_t c = 0; c < n; c += C) {
      double p = 0;
      for (std::size_t i = c; i < std::min(n, c + C); ++i) p += x[i];
      parts.push_back(p);
    }
    double total = 0;
    for (double p : parts) total += p;
    const auto term = [&](std::size_t i) { return x[i]; };
    CHECK(sampling_order::sum(n, term) == total);  // bit for bit
    auto running = [&](std::size_t i) {
      double before = 0;
      for (std::size_t c = 0; c < i / C; ++c) before += parts[c];
      double within = 0;
      for (std::size_t j = i / C * C; j <= i; ++j) within += x[j];
      return before + within;
    };
    for (double frac : {0.0, 1e-9, 0.3, 0.5, 0.999, 1.0}) {
      const double u = frac * total;
      std::size_t want = n;
      for (std::size_t i = 0; i < n; ++i)
        if (running(i) > u) { want = i; break; }
      CHECK(sampling_order::find(n, term, [&](double cum) { return cum > u; }) == want);
    }
    CHECK(sampling_order::find(n, term, [&](double cum) { return cum > 2 * total; }) == n);
  }
}

TEST_CASE("sampler: across many chunks, draws follow temperature and top-p in either walk order") {
  // 1000 tokens (four chunks of the blocked sums), the likely ones spread across the chunks
  std::vector<float> l = random_logits(1000, 9);
  for (int id : {3, 255, 256, 511, 700, 999}) l[std::size_t(id)] = 6.f + float(id % 7) * 0.3f;
  for (auto [temp, top_p] : {std::tuple{1.f, 1.f}, {0.8f, 0.7f}}) {  // index order; best first
    sampling_params p;
    p.temperature = temp, p.top_p = top_p, p.seed = 11;
    const auto ref = reference_probs(l, p);
    std::vector<double> freq(l.size(), 0.0);
    const int n = 30000;
    for (int i = 0; i < n; ++i) freq[std::size_t(sample(l, p, i).token_id)] += 1.0 / n;
    double worst = 0;
    for (std::size_t v = 0; v < l.size(); ++v) {
      if (ref[v] == 0.0) CHECK(freq[v] == 0.0);
      worst = std::max(worst, std::abs(freq[v] - ref[v]));
    }
    CHECK(worst < 0.012);
  }
}

TEST_CASE("kv_pool: the budget splits exactly into slots and pages; refs return pages to the free list") {
  const auto args = test::toy_args();
  const kv_layout layout = kv_layout::make(args, kv_dtype::fp4, 16);
  const std::size_t slot = layout.ring_bytes() + layout.tail_floats() * 4;
  const int64_t budget = int64_t(3 * slot + 10 * layout.page_bytes + 5);
  const kv_capacity cap = plan_kv_capacity(layout, budget, 3);
  CHECK(cap.num_slots == 3);
  CHECK(cap.num_pages == 10);
  kv_pool pool(cap);
  std::vector<int32_t> got;
  for (int i = 0; i < 10; ++i) got.push_back(pool.alloc_page());
  CHECK(pool.alloc_page() == -1);
  CHECK(pool.bytes_in_use() == int64_t(10 * layout.page_bytes));
  pool.retain(got[0]);
  CHECK(pool.release(got[0]) == 1);
  CHECK(pool.release(got[0]) == 0);
  CHECK(pool.num_pages_free() == 1);
  pool.set_cached(got[1], true);
  pool.release(got[1]);
  CHECK(pool.num_pages_idle_cached() == 1);
  CHECK(pool.num_pages_free() == 1);
  pool.set_cached(got[1], false);
  CHECK(pool.num_pages_free() == 2);
  const int32_t s = pool.alloc_slot();
  CHECK(pool.bytes_in_use() == int64_t(8 * layout.page_bytes + slot));
  pool.free_slot(s);
  CHECK(pool.num_slots_free() == 3);
}

TEST_CASE("prefix_cache: chained full-page hits, token re-check, LRU that keeps live sessions") {
  const auto args = test::toy_args();
  const kv_layout layout = kv_layout::make(args, kv_dtype::fp4, 4);
  const std::size_t slot = layout.ring_bytes() + layout.tail_floats() * sizeof(float);
  kv_pool pool(plan_kv_capacity(layout, int64_t(layout.page_bytes * 6 + slot), 1));
  REQUIRE(pool.capacity().num_pages == 6);
  prefix_cache cache(4, pool);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<int32_t> pages = {pool.alloc_page(), pool.alloc_page(), pool.alloc_page()};
  cache.session_opened(7);
  cache.publish(a, pages, 2, 7);  // the third page is partial
  CHECK(cache.num_cached_pages() == 2);
  auto hit = cache.lookup(a, 10, 7);
  CHECK(hit == std::vector<int32_t>{pages[0], pages[1]});
  CHECK(cache.hit_tokens() == 8);
  CHECK(cache.queried_tokens() == 10);
  for (int32_t p : hit) pool.release(p);
  std::vector<int32_t> b = a;
  b[5] = 99;  // second page differs: only the first page matches
  hit = cache.lookup(b, 10, 0);
  CHECK(hit == std::vector<int32_t>{pages[0]});
  pool.release(hit[0]);
  for (int32_t p : pages) pool.release(p);
  CHECK(pool.num_pages_idle_cached() == 2);
  // A page of a closed session goes before a more recently used... page of a live one.
  const std::vector<int32_t> c = {50, 51, 52, 53};
  std::vector<int32_t> pc = {pool.alloc_page()};
  cache.publish(c, pc, 1, 8);  // session 8 was never opened: not live
  pool.release(pc[0]);
  CHECK(cache.evict_one());
  CHECK(cache.lookup(c, 1, 0, false).empty());
  CHECK(cache.lookup(a, 2, 0, false).size() == 2);  // session 7's pages survived
  pool.release(pages[0]), pool.release(pages[1]);
  cache.session_closed(7);
  CHECK(cache.evict_one());
  CHECK(cache.evict_one());
  CHECK(!cache.evict_one());
  CHECK(pool.num_pages_free() == 6);
}

namespace {

/// A pool of `num_pages` pages of 4 tokens for prefix-cache tests.
kv_pool small_pool(int num_pages) {
  const auto args = test::toy_args();
  const kv_layout layout = kv_layout::make(args, kv_dtype::fp4, 4);
  const std::size_t slot = layout.ring_bytes() + layout.tail_floats() * sizeof(float);
  return kv_pool(plan_kv_capacity(layout, int64_t(layout.page_bytes * num_pages + slot), 1));
}

/// Tokens of `n` pages of 4: page i of branch b is {b, i, 0, 0}, so branches share nothing.
std::vector<int32_t> chain_tokens(int branch, int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.insert(t.end(), {branch, i, 0, 0});
  return t;
}

/// Runs one request through the cache the way the scheduler does: hit, compute the rest on
/// fresh pages (evicting for them), publish, finish. False when the pool could not hold it.
bool run_request(prefix_cache& cache, kv_pool& pool, const std::vector<int32_t>& tokens, uint64_t session) {
  const int64_t n = int64_t(tokens.size()) / 4;
  std::vector<int32_t> pages = cache.lookup(tokens, n, session);
  while (int64_t(pages.size()) < n) {
    int32_t p = pool.alloc_page();
    if (p < 0 && cache.evict_one()) p = pool.alloc_page();
    if (p < 0) break;
    pages.push_back(p);
  }
  const bool fits = int64_t(pages.size()) == n;
  if (fits) cache.publish(tokens, pages, n, session);
  for (int32_t p : pages) pool.release(p);
  return fits;
}

/// Pages reachable from a root: an evicted parent would leave its descendants unreachable.
int64_t reachable_pages(const prefix_cache& cache) {
  std::set<int32_t> pages;
  for (const auto& c : cache.export_chains()) pages.insert(c.page_ids.begin(), c.page_ids.end());
  return int64_t(pages.size());
}

}  // namespace

TEST_CASE("prefix_cache: eviction takes a chain from its tail, so what stays is still a prefix") {
  kv_pool pool = small_pool(12);
  prefix_cache cache(4, pool);
  const auto a = chain_tokens(1, 6), b = chain_tokens(2, 6);
  REQUIRE(run_request(cache, pool, a, 0));
  REQUIRE(run_request(cache, pool, b, 0));  // fills the pool: 12 pages cached
  CHECK(cache.num_cached_pages() == 12);
  // a is older: each eviction takes its last page, and what is left still hits from the root
  for (int kept = 5; kept >= 3; --kept) {
    REQUIRE(cache.evict_one());
    auto hit = cache.lookup(a, 6, 0, false);
    CHECK(int(hit.size()) == kept);
    for (int32_t p : hit) pool.release(p);
    // the lookup made a newer than b: touch b again so a stays the older one
    hit = cache.lookup(b, 6, 0, false);
    CHECK(hit.size() == 6);
    for (int32_t p : hit) pool.release(p);
  }
  CHECK(reachable_pages(cache) == cache.num_cached_pages());
}

TEST_CASE("prefix_cache: a prefix two requests prefilled at once keeps the later one's pages reachable") {
  kv_pool pool = small_pool(8);
  prefix_cache cache(4, pool);
  const std::vector<int32_t> s_tokens{1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> r_tokens{1, 2, 3, 4, 9, 9, 9, 9, 10};
  const std::vector<int32_t> s_pages{pool.alloc_page(), pool.alloc_page()};
  const std::vector<int32_t> r_pages{pool.alloc_page(), pool.alloc_page()};
  cache.publish(s_tokens, s_pages, 2, 0);
  // r computed the same first page on a page of its own: that copy stays uncached, and r's
  // second page is cached below s's first
  cache.publish(r_tokens, r_pages, 2, 0);
  for (int32_t p : s_pages) pool.release(p);  // s finishes; r still runs
  REQUIRE(run_request(cache, pool, chain_tokens(3, 1), 0));  // a newer idle page
  REQUIRE(cache.evict_one());  // s's second page
  // s's first page is the oldest idle one, but r's cached page hangs from it: the newer goes
  REQUIRE(cache.evict_one());
  CHECK(reachable_pages(cache) == cache.num_cached_pages());
  std::vector<int32_t> hit = cache.lookup(r_tokens, 2, 0, false);
  CHECK(hit == std::vector<int32_t>{s_pages[0], r_pages[1]});
  for (int32_t p : hit) pool.release(p);
  // nothing else idle: it goes, and takes r's page out of the cache (r still holds it)
  REQUIRE(cache.evict_one());
  CHECK(cache.num_cached_pages() == 0);
  CHECK(!cache.evict_one());
  CHECK(pool.num_pages_free() == 6);
  // r's next publish caches its own chain
  cache.publish(r_tokens, r_pages, 2, 0);
  hit = cache.lookup(r_tokens, 2, 0, false);
  CHECK(hit == r_pages);
  for (int32_t p : hit) pool.release(p);
  for (int32_t p : r_pages) pool.release(p);
  CHECK(reachable_pages(cache) == cache.num_cached_pages());
  CHECK(pool.num_pages_free() + pool.num_pages_idle_cached() == 8);
}

TEST_CASE("prefix_cache: a prefix shared with a closed session stays live while another session uses it") {
  kv_pool pool = small_pool(8);
  prefix_cache cache(4, pool);
  cache.session_opened(1);
  cache.session_opened(2);
  auto shared_then = [](int32_t tail) { return std::vector<int32_t>{7, 7, 7, 7, tail, 0, 0, 0}; };
  REQUIRE(run_request(cache, pool, shared_then(1), 1));  // session 1: shared page + its own
  REQUIRE(run_request(cache, pool, shared_then(2), 2));  // session 2 hits the shared page last
  cache.session_closed(2);
  // session 2's own page goes first, then session 1's tail; the shared root outlives both
  REQUIRE(cache.evict_one());
  auto hit = cache.lookup(shared_then(2), 2, 0, false);
  CHECK(hit.size() == 1);
  for (int32_t p : hit) pool.release(p);
  hit = cache.lookup(shared_then(1), 2, 0, false);
  CHECK(hit.size() == 2);
  for (int32_t p : hit) pool.release(p);
  REQUIRE(cache.evict_one());
  hit = cache.lookup(shared_then(1), 2, 0, false);
  CHECK(hit.size() == 1);
  for (int32_t p : hit) pool.release(p);
  CHECK(reachable_pages(cache) == cache.num_cached_pages());
}

TEST_CASE("prefix_cache: under random traffic no cached page is ever cut off from its root") {
  std::mt19937 rng(11);
  kv_pool pool = small_pool(24);
  prefix_cache cache(4, pool);
  std::set<uint64_t> open;
  int64_t hits = 0, evicting_runs = 0;
  for (int step = 0; step < 3000; ++step) {
    const uint64_t session = 1 + rng() % 6;
    if (rng() % 10 == 0) {  // sessions come and go
      if (open.erase(session)) cache.session_closed(session);
      else open.insert(session), cache.session_opened(session);
      continue;
    }
    // a path down a binary tree of pages: requests share prefixes of random lengths
    std::vector<int32_t> tokens;
    int32_t node = 1;
    const int n = 1 + int(rng() % 10);
    for (int i = 0; i < n; ++i) {
      node = node * 2 + int32_t(rng() % 2);
      tokens.insert(tokens.end(), {node, i, 3, 4});
    }
    const int64_t before = cache.hit_tokens();
    const int64_t free_before = pool.num_pages_free();
    run_request(cache, pool, tokens, open.count(session) ? session : 0);
    hits += cache.hit_tokens() - before;
    evicting_runs += free_before < n;
    REQUIRE(reachable_pages(cache) == cache.num_cached_pages());
    REQUIRE(pool.num_pages_idle_cached() == cache.num_cached_pages());
  }
  CHECK(hits > 0);
  CHECK(evicting_runs > 100);  // the pool was under pressure most of the time
}

TEST_CASE("replay: bounded replays the last window, full the whole layer halo; short hits are not taken") {
  auto b = plan_replay(512, 128, 40, swa_replay_mode::bounded);
  CHECK(b.cached_tokens == 512);
  CHECK(b.replay_from == 384);
  CHECK(plan_replay(128, 128, 40, swa_replay_mode::bounded).cached_tokens == 0);
  auto f = plan_replay(8192, 128, 40, swa_replay_mode::full);
  CHECK(f.replay_from == 8192 - 128 - 40 * 127);
  CHECK(plan_replay(1024, 128, 40, swa_replay_mode::full).replay_from == 0);
  CHECK(plan_replay(256, 8, 5, swa_replay_mode::full).replay_from % 2 == 0);
}

TEST_CASE("batch plan: decodes first, replays whole, prefill chunks capped per request and by the budget") {
  std::vector<budget_candidate> c = {
      {1, 1000, false, false}, {2, 1, true, false}, {3, 8, false, true}, {4, 1, true, false}, {5, 50, false, false}};
  auto s = plan_token_budget(c, 100, 64);
  REQUIRE(s.size() == 5);
  CHECK(s[0].request_id == 2);
  CHECK(s[1].request_id == 4);
  CHECK((s[2].request_id == 3 && s[2].num_tokens == 8));
  CHECK((s[3].request_id == 1 && s[3].num_tokens == 64));
  CHECK((s[4].request_id == 5 && s[4].num_tokens == 100 - 2 - 8 - 64));
  // A replay that does not fit beside the decodes goes first, with the decodes that fit after
  // it; the others wait one step (behind every decode it would wait as long as any decodes).
  s = plan_token_budget(c, 9, 64);
  REQUIRE(s.size() == 2);
  CHECK((s[0].request_id == 3 && s[0].num_tokens == 8));
  CHECK(s[1].request_id == 2);
  s = plan_token_budget(c, 1, 64);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == 3);
  // Without a replay, a budget smaller than the decodes: decodes still go first.
  std::vector<budget_candidate> decodes = {{1, 1000, false, false}, {2, 1, true, false}, {4, 1, true, false}};
  s = plan_token_budget(decodes, 1, 64);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == 2);
  // A replay bigger than the budget runs alone rather than never.
  std::vector<budget_candidate> big = {{9, 300, false, true}};
  s = plan_token_budget(big, 100, 64);
  REQUIRE(s.size() == 1);
  CHECK(s[0].num_tokens == 300);
}

TEST_CASE("batch plan: the capacity stage preempts the newest and admits in order while pages last") {
  std::vector<capacity_candidate> running = {{1, 2, 5}, {2, 1, 3}, {3, 1, 4}};
  auto p = plan_capacity(running, {}, 2, 0, 8);
  CHECK(p.preempt == std::vector<uint64_t>{3});  // 4 needed, 2 free + 4 freed by the newest
  p = plan_capacity(running, {}, 4, 0, 8);
  CHECK(p.preempt.empty());
  std::vector<capacity_candidate> waiting = {{4, 2, 0}, {5, 5, 0}, {6, 1, 0}};
  p = plan_capacity(running, waiting, 10, 5, 8);
  CHECK(p.admit == std::vector<uint64_t>{4});  // 5 does not fit; 6 may not overtake it
  p = plan_capacity(running, waiting, 100, 1, 8);
  CHECK(p.admit == std::vector<uint64_t>{4});  // one free slot
  p = plan_capacity(running, waiting, 100, 5, 4);
  CHECK(p.admit == std::vector<uint64_t>{4});  // max running
  std::vector<capacity_candidate> alone = {{1, 9, 0}};
  CHECK(plan_capacity(alone, waiting, 3, 5, 8).preempt == std::vector<uint64_t>{1});
}
