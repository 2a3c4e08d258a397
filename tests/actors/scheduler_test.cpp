// The scheduler policy driven step by step against a shard running the toy model (no
// actors): batching invariance, chunked prefill, prefix hits with replay, preemption under
// KV pressure, cancellation, stop conditions and bad input, with every page and ring slot
// accounted for at the end.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include "actors/scheduler.hpp"
#include "tests/actors/toy_model.hpp"

using namespace cedar;

namespace {

struct rig {
  engine_options opts;
  model_args args = test::toy_args();
  std::unique_ptr<shard> sh;
  std::unique_ptr<scheduler> sched;
  std::map<uint64_t, std::vector<int32_t>> out;
  std::map<uint64_t, std::string> reason;

  explicit rig(engine_options o) : opts(o) {
    opts.page_tokens = 16;
    auto m = std::make_unique<test::toy_model>(args, opts.page_tokens);
    const kv_layout layout = m->layout();
    sched = std::make_unique<scheduler>(args, layout, opts);
    sh = std::make_unique<shard>(std::move(m), sched->pool().capacity());
  }
  /// One step; false when nothing ran.
  bool step() {
    auto s = sched->next_step();
    if (!s) return false;
    // A step carries each item's look-back, not its whole history: its size stays flat as
    // contexts grow.
    for (const step_item& it : s->items)
      CHECK(it.start_pos - it.tokens_from == std::min<int64_t>(it.start_pos, args.history_lookback()));
    const step_output o = sh->run(*s);
    REQUIRE(o.error.empty());
    REQUIRE(sched->apply(o));
    collect();
    return true;
  }
  void collect() {
    for (auto& b : sched->take_events()) {
      auto& v = out[b.request_id];
      v.insert(v.end(), b.ids.begin(), b.ids.end());
      if (b.finished) reason[b.request_id] = b.finish_reason;
    }
  }
  void run_all() {
    while (step()) {
    }
    collect();
  }
  /// Every ring slot free and no page referenced (idle cached pages are reusable).
  void check_nothing_held() const {
    CHECK(sched->pool().num_slots_used() == 0);
    CHECK(sched->pool().num_pages_referenced() == 0);
    CHECK(sched->pool().num_pages_free() + sched->pool().num_pages_idle_cached() ==
          sched->pool().capacity().num_pages);
    CHECK(!sched->has_work());
  }
};

engine_options small_options() {
  engine_options o;
  o.max_num_seqs = 16;
  o.max_batched_tokens = 48;
  o.max_prefill_tokens_per_request = 20;
  o.kv_budget_bytes = 64 << 20;
  return o;
}

request_spec make_spec(std::mt19937& g, int max_prompt, int max_new, bool sampled) {
  request_spec s;
  const int n = std::uniform_int_distribution<int>(1, max_prompt)(g);
  for (int i = 0; i < n; ++i) s.prompt.push_back(std::uniform_int_distribution<int>(2, 63)(g));
  s.max_tokens = std::uniform_int_distribution<int>(1, max_new)(g);
  if (sampled) s.sampling.temperature = 0.8f, s.sampling.top_p = 0.9f, s.sampling.seed = g();
  s.ignore_eos = true;
  return s;
}

std::vector<int32_t> run_alone(const request_spec& s, engine_options o) {
  rig r(o);
  const uint64_t id = r.sched->submit(s).value();
  r.run_all();
  return r.out[id];
}

}  // namespace

TEST_CASE("scheduler: concurrent requests give exactly the tokens each gives alone") {
  std::mt19937 g(3);
  rig r(small_options());
  std::vector<request_spec> specs;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 24; ++i) {
    specs.push_back(make_spec(g, 70, 12, i % 3 == 0));
    ids.push_back(r.sched->submit(specs.back()).value());
  }
  r.run_all();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CHECK(r.out[ids[i]] == run_alone(specs[i], small_options()));
    CHECK(int64_t(r.out[ids[i]].size()) == specs[i].max_tokens);
    CHECK(r.reason[ids[i]] == "length");
  }
  r.check_nothing_held();
}

TEST_CASE("scheduler: a long prompt is chunked and never stalls running decodes") {
  engine_options o = small_options();
  rig r(o);
  request_spec d;
  d.prompt = {5, 6, 7};
  d.max_tokens = 30;
  d.ignore_eos = true;
  const uint64_t decoder = r.sched->submit(d).value();
  r.step();  // its prefill
  request_spec big;
  big.prompt.assign(400, 9);
  big.max_tokens = 2;
  r.sched->submit(big).value();
  for (int i = 0; i < 10; ++i) {
    auto s = r.sched->next_step();
    REQUIRE(s);
    bool decoder_in = false;
    int64_t tokens = 0;
    for (auto& it : s->items) {
      decoder_in |= it.request_id == decoder;
      tokens += int64_t(it.tokens.size()) - it.start_pos;
      if (it.request_id != decoder) CHECK(int64_t(it.tokens.size()) - it.start_pos <= o.max_prefill_tokens_per_request);
    }
    CHECK(decoder_in);
    CHECK(tokens <= o.max_batched_tokens);
    r.sched->apply(r.sh->run(*s));
    r.collect();
  }
  r.run_all();
  r.check_nothing_held();
}

TEST_CASE("scheduler: a follow-up prompt hits the prefix cache, replays one window, and matches a cold run") {
  engine_options o = small_options();
  rig r(o);
  request_spec a;
  for (int i = 0; i < 100; ++i) a.prompt.push_back(2 + i % 50);
  a.max_tokens = 5;
  a.ignore_eos = true;
  const uint64_t first = r.sched->submit(a).value();
  r.run_all();
  request_spec b = a;
  b.prompt.insert(b.prompt.end(), r.out[first].begin(), r.out[first].end());
  for (int i = 0; i < 30; ++i) b.prompt.push_back(3 + i);
  const uint64_t second = r.sched->submit(b).value();
  r.run_all();
  const auto m = r.sched->metrics();
  CHECK(m.prefix_hit_tokens == 96);  // 6 full pages of the first prompt; 105 tokens ran
  CHECK(m.replay_tokens == r.args.sliding_window);
  engine_options cold = o;
  cold.prefix_cache = false;
  CHECK(r.out[second] == run_alone(b, cold));
  r.check_nothing_held();
}

TEST_CASE("scheduler: KV pressure preempts, the victims resume through the cache, nothing is lost") {
  for (auto mode : {swa_replay_mode::bounded, swa_replay_mode::full}) {
    engine_options o = small_options();
    o.swa_replay = mode;
    const auto layout = kv_layout::make(test::toy_args(), kv_dtype::fp4, 16);
    o.kv_budget_bytes = int64_t(16 * (layout.ring_bytes() + layout.tail_floats() * 4) + 14 * layout.page_bytes);
    rig r(o);
    std::mt19937 g(11);
    std::vector<request_spec> specs;
    std::vector<uint64_t> ids;
    for (int i = 0; i < 12; ++i) {
      specs.push_back(make_spec(g, 60, 40, i % 2 == 0));
      ids.push_back(r.sched->submit(specs.back()).value());
    }
    r.run_all();
    CHECK(r.sched->metrics().preemptions > 0);
    for (std::size_t i = 0; i < specs.size(); ++i) CHECK(r.out[ids[i]] == run_alone(specs[i], small_options()));
    r.check_nothing_held();
  }
}

TEST_CASE("scheduler: requests sharing an idle cached prefix under KV pressure all finish (no preempt/admit livelock)") {
  // 6 pages: a 4-page prefix X cached and idle, 2 free. A (fresh) and B, C (X + 3 tokens each)
  // arrive together. Admitting all three on the chunk estimate alone (B and C take X out of the
  // idle pool) and counting no page of X as freed by preempting B or C (each holds it twice)
  // preempted all three, admitted nothing, and left an empty step with requests waiting.
  for (auto mode : {swa_replay_mode::bounded, swa_replay_mode::full}) {
    engine_options o = small_options();
    o.swa_replay = mode;
    const auto layout = kv_layout::make(test::toy_args(), kv_dtype::fp4, 16);
    o.kv_budget_bytes = int64_t(o.max_num_seqs * (layout.ring_bytes() + layout.tail_floats() * 4) + 6 * layout.page_bytes);
    rig r(o);
    REQUIRE(r.sched->pool().capacity().num_pages == 6);
    request_spec x;
    for (int i = 0; i < 65; ++i) x.prompt.push_back(2 + (i * 7) % 60);
    x.max_tokens = 1;
    x.ignore_eos = true;
    r.sched->submit(x).value();
    r.run_all();
    REQUIRE(r.sched->pool().num_pages_idle_cached() == 4);
    std::vector<request_spec> specs(3);
    for (int i = 0; i < 40; ++i) specs[0].prompt.push_back(3 + (i * 11) % 59);
    specs[1].prompt.assign(x.prompt.begin(), x.prompt.begin() + 64);
    specs[2].prompt = specs[1].prompt;
    specs[1].prompt.insert(specs[1].prompt.end(), {5, 6, 7});
    specs[2].prompt.insert(specs[2].prompt.end(), {8, 9, 10});
    std::vector<uint64_t> ids;
    for (auto& s : specs) {
      s.max_tokens = 4;
      s.ignore_eos = true;
      ids.push_back(r.sched->submit(s).value());
    }
    for (int n = 0; n < 500 && r.sched->has_work(); ++n) REQUIRE_MESSAGE(r.step(), "an empty step while requests wait");
    REQUIRE(!r.sched->has_work());
    for (std::size_t i = 0; i < specs.size(); ++i) {
      CHECK(r.reason[ids[i]] == "length");
      CHECK(r.out[ids[i]] == run_alone(specs[i], small_options()));
    }
    r.check_nothing_held();
  }
}

TEST_CASE("scheduler: a preempted request's generated tokens are recomputed in chunks, not a token a step") {
  engine_options o = small_options();
  o.prefix_cache = false;  // nothing cached: the resumed request recomputes everything it had
  o.swa_replay = swa_replay_mode::full;
  const auto layout = kv_layout::make(test::toy_args(), kv_dtype::fp4, 16);
  o.kv_budget_bytes = int64_t(o.max_num_seqs * (layout.ring_bytes() + layout.tail_floats() * 4) + 8 * layout.page_bytes);
  rig r(o);
  request_spec a;
  for (int i = 0; i < 8; ++i) a.prompt.push_back(3 + i);
  a.max_tokens = 90;  // 98 positions: 7 pages of the 8
  a.ignore_eos = true;
  const uint64_t first = r.sched->submit(a).value();
  for (int n = 0; n < 40; ++n) REQUIRE(r.step());  // a has ~40 tokens generated
  request_spec b = a;
  b.prompt[0] = 50;
  const uint64_t second = r.sched->submit(b).value();
  const int64_t steps_before = r.sched->metrics().steps;
  r.run_all();
  const auto m = r.sched->metrics();
  REQUIRE(m.preemptions > 0);
  CHECK(r.out[first] == run_alone(a, small_options()));
  CHECK(r.out[second] == run_alone(b, small_options()));
  // deterministic: 109 steps with the resumed request's generated tokens in chunks of 20, 128
  // when they went a token a step
  MESSAGE("steps after the second arrived: " << m.steps - steps_before << ", preemptions " << m.preemptions);
  CHECK(m.steps - steps_before < 118);
  r.check_nothing_held();
}

TEST_CASE("scheduler: 2,000 requests, random lengths, some with penalties, 20% cancelled mid-stream, KV pressure: no leaks, no loss") {
  engine_options o = small_options();
  o.swa_replay = swa_replay_mode::full;  // resumed requests rebuild their rings exactly
  o.max_num_seqs = 24;
  o.max_batched_tokens = 96;
  const auto layout = kv_layout::make(test::toy_args(), kv_dtype::fp4, 16);
  // 24 ring slots but 30 pages: a prompt of up to 80 tokens plus 30 generated needs up to 7.
  o.kv_budget_bytes = int64_t(24 * (layout.ring_bytes() + layout.tail_floats() * 4) + 30 * layout.page_bytes);
  rig r(o);
  std::mt19937 g(5);
  const int num_requests = 2000;
  std::map<uint64_t, request_spec> specs;
  std::map<uint64_t, int> cancel_after;  // cancel once this many tokens arrived (0: before the first)
  int submitted = 0, cancels_sent = 0;
  while (submitted < num_requests || r.sched->has_work()) {
    while (submitted < num_requests && r.sched->metrics().requests_waiting < 12) {
      auto s = make_spec(g, 80, 30, submitted % 2 == 0);
      if (submitted % 3 == 0) {  // penalties, greedy or sampled: counted across preemptions
        s.sampling.frequency_penalty = 0.5f * float(g() % 5);
        s.sampling.presence_penalty = 1.5f - 0.5f * float(g() % 4);
        if (submitted % 6 == 0) s.sampling.repetition_penalty = 1.0f + 0.25f * float(1 + g() % 4);
      }
      const uint64_t id = r.sched->submit(s).value();
      if (g() % 5 == 0) cancel_after[id] = int(g() % uint32_t(s.max_tokens));
      specs[id] = std::move(s);
      ++submitted;
    }
    r.step();
    for (auto it = cancel_after.begin(); it != cancel_after.end();) {
      const uint64_t id = it->first;
      if (r.reason.count(id)) {
        it = cancel_after.erase(it);
      } else if (int(r.out[id].size()) >= it->second) {
        CHECK(r.sched->cancel(id).ok());
        ++cancels_sent;
        it = cancel_after.erase(it);
      } else {
        ++it;
      }
    }
  }
  r.collect();
  const auto m = r.sched->metrics();
  CHECK(m.preemptions > 0);
  CHECK(m.replay_tokens > 0);
  int completed = 0, cancelled = 0;
  for (auto& [id, s] : specs) {
    REQUIRE(r.reason.count(id));
    const std::vector<int32_t> want = test::toy_alone(s);
    const std::vector<int32_t>& got = r.out[id];
    if (r.reason[id] == "cancelled") {
      ++cancelled;
      REQUIRE(got.size() < want.size());
      CHECK(std::equal(got.begin(), got.end(), want.begin()));  // what streamed before the cancel was right
      continue;
    }
    ++completed;
    CHECK(r.reason[id] == "length");
    CHECK(got == want);
  }
  MESSAGE("2,000-request churn: ", completed, " completed, ", cancelled, " cancelled (", cancels_sent,
          " cancels sent), ", m.preemptions, " preemptions, ", m.replay_tokens, " replayed tokens, ", m.steps, " steps");
  CHECK(completed + cancelled == num_requests);
  CHECK(cancelled == cancels_sent);
  CHECK(cancelled >= num_requests / 10);
  CHECK(completed >= num_requests * 7 / 10);
  r.check_nothing_held();
}

TEST_CASE("scheduler: stop ids, EOS, max tokens and context length end a request") {
  rig r(small_options());
  std::mt19937 g(8);
  request_spec s = make_spec(g, 10, 40, false);
  s.max_tokens = 40;
  const uint64_t a = r.sched->submit(s).value();
  r.run_all();
  REQUIRE(r.out[a].size() >= 3);
  request_spec stop = s;
  stop.stop_ids = {r.out[a][2]};
  const uint64_t b = r.sched->submit(stop).value();
  r.run_all();
  auto first_stop = std::find(r.out[a].begin(), r.out[a].end(), r.out[a][2]) - r.out[a].begin();
  CHECK(int64_t(r.out[b].size()) == first_stop + 1);
  CHECK(r.reason[b] == "stop");
  request_spec eos = s;
  eos.ignore_eos = false;
  const uint64_t c = r.sched->submit(eos).value();
  r.run_all();
  auto eos_at = std::find(r.out[a].begin(), r.out[a].end(), r.args.eos_token_id);
  CHECK(r.reason[c] == (eos_at == r.out[a].end() ? "length" : "stop"));
  CHECK(int64_t(r.out[c].size()) == std::min<int64_t>(40, eos_at - r.out[a].begin() + 1));
  r.check_nothing_held();
}

TEST_CASE("scheduler: banned ids are never sampled; the answer is the free one up to the first of them") {
  rig r(small_options());  // no served vocabulary: a ban needs none
  std::mt19937 g(12);
  request_spec free_run = make_spec(g, 12, 60, false);
  free_run.max_tokens = 60;
  const uint64_t a = r.sched->submit(free_run).value();
  r.run_all();
  REQUIRE(r.out[a].size() == 60);
  std::map<int32_t, int> counts;
  for (int32_t t : r.out[a]) ++counts[t];
  const int32_t common = std::max_element(counts.begin(), counts.end(), [](auto& x, auto& y) {
                           return x.second < y.second;
                         })->first;
  for (bool sampled : {false, true}) {
    request_spec s = free_run;
    if (sampled) s.sampling.temperature = 1.0f, s.sampling.seed = 99;
    s.banned_ids = {common, r.args.vocab_size + 5};  // an id past the vocabulary is ignored
    const uint64_t b = r.sched->submit(s).value();
    r.run_all();
    CAPTURE(sampled);
    REQUIRE(r.out[b].size() == 60);
    CHECK(std::find(r.out[b].begin(), r.out[b].end(), common) == r.out[b].end());
    if (!sampled) {
      const auto first = std::find(r.out[a].begin(), r.out[a].end(), common) - r.out[a].begin();
      CHECK(std::equal(r.out[a].begin(), r.out[a].begin() + first, r.out[b].begin()));
      CHECK(r.out[b][std::size_t(first)] != common);
    }
  }
  r.check_nothing_held();
}

TEST_CASE("scheduler: bad input gets a clear error and leaves the runtime working") {
  rig r(small_options());
  request_spec s;
  s.prompt = {3, 4};
  s.max_tokens = 0;
  auto e = r.sched->submit(s);
  REQUIRE(!e.ok());
  CHECK(e.error().code == engine_errc::bad_params);
  CHECK(e.error().message.find("max_tokens") != std::string::npos);
  s.max_tokens = -3;
  CHECK(r.sched->submit(s).error().code == engine_errc::bad_params);
  s.max_tokens = 4;
  s.prompt.assign(size_t(r.sched->context_tokens()), 3);
  e = r.sched->submit(s);
  REQUIRE(!e.ok());
  CHECK((e.error().code == engine_errc::prompt_too_long || e.error().code == engine_errc::kv_exhausted));
  s.prompt = {3, 1000};
  CHECK(r.sched->submit(s).error().code == engine_errc::bad_params);
  s.prompt = {};
  CHECK(r.sched->submit(s).error().code == engine_errc::bad_params);
  CHECK(r.sched->cancel(12345).error().code == engine_errc::unknown_request);
  s.prompt = {3, 4, 5};
  const uint64_t id = r.sched->submit(s).value();
  r.run_all();
  CHECK(r.out[id].size() > 0);
  CHECK(r.sched->cancel(id).error().code == engine_errc::unknown_request);
  r.check_nothing_held();
}

TEST_CASE("scheduler: a max_tokens past the context window ends the answer with length where the window fills") {
  engine_options o = small_options();
  o.kv_budget_bytes = 1 << 20;  // a window of a few hundred tokens: each prefill chunk publishes them all
  rig r(o);
  const int64_t window = r.sched->context_tokens();
  REQUIRE(window > 8);
  request_spec s;
  s.prompt.assign(size_t(window - 5), 7);
  s.max_tokens = int(window) * 4;  // far past the window: taken, not refused
  s.ignore_eos = true;
  const auto id = r.sched->submit(s);
  REQUIRE(id.ok());
  r.run_all();
  CHECK(r.out[id.value()].size() == 5);  // prompt + answer fill the window exactly
  CHECK(r.reason[id.value()] == "length");
  r.check_nothing_held();
}

namespace {

/// The toy vocabulary as JSON pieces (id 1, the end token, has no bytes), every character of
/// the grammar's texts among them, as in a byte-level vocabulary (no dead ends).
std::shared_ptr<const token_vocab> toy_json_vocab(int vocab) {
  const char* pieces[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\"k\"", "\"b\":", "true", "false", "tr", "ue",
                          "1", "2", "12", "a", "\"a", "b\"", "null", "{\"", "\n  ", "k", "b", "e", "t", "r", "u",
                          "f", "l", "s"};
  std::vector<std::string> bytes(static_cast<std::size_t>(vocab));
  for (int id = 2; id < vocab; ++id) bytes[std::size_t(id)] = pieces[std::size_t(id - 2) % std::size(pieces)];
  return std::make_shared<const token_vocab>(std::move(bytes), std::vector<bool>(std::size_t(vocab), false), 1);
}

/// {"k": 1 or 2, "b": a boolean}, both required, no other key.
output_grammar toy_schema() {
  output_grammar g;
  grammar_node k, b, obj;
  k.kind = b.kind = grammar_node::literal;
  k.names = {"1", "2"};
  b.names = {"true", "false"};
  obj.kind = grammar_node::object;
  obj.names = {"k", "b"};
  obj.children = {g.add(k), g.add(b)};
  obj.required = 3;
  g.root = g.add(obj);
  return g;
}

}  // namespace

TEST_CASE("scheduler: structured output holds every sampled token to the grammar, through preemption") {
  engine_options o = small_options();
  o.vocab = toy_json_vocab(test::toy_args().vocab_size);
  o.kv_budget_bytes = 1 << 20;  // pressure: requests are preempted and resumed mid-value
  rig r(o);
  std::mt19937 g(5);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 24; ++i) {
    request_spec s = make_spec(g, 40, 200, i % 2 == 1);
    s.max_tokens = 200;
    s.ignore_eos = false;
    s.grammar = toy_schema();
    ids.push_back(r.sched->submit(s).value());
  }
  r.run_all();
  for (uint64_t id : ids) {
    REQUIRE(!r.out[id].empty());
    CHECK(r.reason[id] == "stop");
    CHECK(r.out[id].back() == r.args.eos_token_id);
    std::string text;
    for (std::size_t i = 0; i + 1 < r.out[id].size(); ++i) text += o.vocab->bytes(r.out[id][i]);
    const output_grammar schema = toy_schema();
    json_matcher m;
    bool fits = true;
    for (char c : text) fits = fits && m.feed(schema, uint8_t(c));
    CHECK_MESSAGE((fits && m.can_end(schema)), text);
  }
  r.check_nothing_held();
}

TEST_CASE("scheduler: a grammar without the served vocabulary is refused") {
  rig r(small_options());
  request_spec s;
  s.prompt = {3, 4};
  s.max_tokens = 4;
  s.grammar = toy_schema();
  auto e = r.sched->submit(s);
  REQUIRE(!e.ok());
  CHECK(e.error().code == engine_errc::bad_params);
  CHECK(e.error().message.find("structured output") != std::string::npos);
  r.check_nothing_held();
}

TEST_CASE("scheduler: a grammar with a start token holds only what follows it (thinking mode)") {
  engine_options o = small_options();
  o.vocab = toy_json_vocab(test::toy_args().vocab_size);
  rig r(o);
  request_spec free_run;
  free_run.prompt = {7, 8, 9, 10};
  free_run.max_tokens = 3;
  free_run.ignore_eos = true;
  const uint64_t a = r.sched->submit(free_run).value();
  r.run_all();
  REQUIRE(r.out[a].size() == 3);
  request_spec s = free_run;  // greedy: the same first token, which now opens the constraint
  s.max_tokens = 200;
  s.ignore_eos = false;
  s.grammar = toy_schema();
  s.grammar.start_after = r.out[a][0];
  const std::string& opener = o.vocab->bytes(r.out[a][0]);  // a token the grammar itself would refuse
  CHECK((opener.empty() || !value_may_start(s.grammar, s.grammar.root, uint8_t(opener[0]))));
  const uint64_t b = r.sched->submit(s).value();
  r.run_all();
  REQUIRE(r.out[b].size() >= 2);
  CHECK(r.out[b][0] == r.out[a][0]);
  CHECK(r.reason[b] == "stop");
  std::string text;
  for (std::size_t i = 1; i + 1 < r.out[b].size(); ++i) text += o.vocab->bytes(r.out[b][i]);
  json_matcher m;
  bool fits = true;
  for (char c : text) fits = fits && m.feed(s.grammar, uint8_t(c));
  CHECK_MESSAGE((fits && m.can_end(s.grammar)), text);
  r.check_nothing_held();
}

TEST_CASE("scheduler: a forced lead comes first (at once or after its start token), then the answer runs free") {
  engine_options o = small_options();
  o.kv_budget_bytes = 1 << 20;  // pressure: some requests are preempted inside their lead
  rig r(o);
  std::mt19937 g(31);
  const request_spec base = make_spec(g, 30, 1, false);
  request_spec free_run = base;
  free_run.max_tokens = 4;
  const uint64_t a = r.sched->submit(free_run).value();
  r.run_all();
  REQUIRE(r.out[a].size() == 4);
  // Two choices sharing a first token, none of them what the model picks by itself.
  auto unlike = [&](int32_t t) { return 2 + (t + 7) % (r.args.vocab_size - 2); };
  const int32_t x = unlike(r.out[a][0]);
  const std::vector<std::vector<int32_t>> choices = {{x, unlike(x), unlike(unlike(x))}, {x, unlike(x + 1)}};
  struct run {
    uint64_t id;
    int32_t after;
  };
  std::vector<run> runs;
  for (int i = 0; i < 16; ++i) {
    request_spec s = base;
    s.max_tokens = 12;
    if (i % 2) s.sampling.temperature = 1.0f, s.sampling.seed = uint64_t(i);
    s.lead.choices = choices;
    s.lead.after = i % 4 < 2 ? -1 : r.out[a][0];  // greedy or not, the same first token opens it
    if (s.lead.after >= 0) s.sampling.temperature = 0;
    runs.push_back({r.sched->submit(s).value(), s.lead.after});
  }
  r.run_all();
  for (const run& x_run : runs) {
    const auto& out = r.out[x_run.id];
    CAPTURE(x_run.after);
    REQUIRE(out.size() == 12);
    const std::size_t from = x_run.after < 0 ? 0 : 1;
    if (from) CHECK(out[0] == x_run.after);
    int matched = -1;
    for (std::size_t k = 0; k < choices.size(); ++k)
      if (std::equal(choices[k].begin(), choices[k].end(), out.begin() + long(from))) matched = int(k);
    REQUIRE(matched >= 0);
    if (x_run.after < 0) continue;
    // Greedy after the lead: what the model says given the prompt, its opener and the lead.
    request_spec cont = base;
    cont.prompt.insert(cont.prompt.end(), out.begin(), out.begin() + long(from + choices[std::size_t(matched)].size()));
    cont.max_tokens = int64_t(out.size()) - int64_t(from + choices[std::size_t(matched)].size());
    cont.ignore_eos = true;
    const uint64_t c = r.sched->submit(cont).value();
    r.run_all();
    CHECK(std::equal(r.out[c].begin(), r.out[c].end(), out.end() - long(r.out[c].size())));
  }
  r.check_nothing_held();
}

TEST_CASE("scheduler: a forced lead with an empty choice, an id past the vocabulary or a response format is refused") {
  engine_options o = small_options();
  o.vocab = toy_json_vocab(test::toy_args().vocab_size);
  rig r(o);
  request_spec s;
  s.prompt = {3, 4};
  s.max_tokens = 4;
  s.lead.choices = {{5, 6}, {}};
  CHECK(r.sched->submit(s).error().message.find("no token") != std::string::npos);
  s.lead.choices = {{5, r.args.vocab_size}};
  CHECK(r.sched->submit(s).error().message.find("outside the vocabulary") != std::string::npos);
  s.lead.choices = {{5, 6}};
  s.grammar = toy_schema();
  CHECK(r.sched->submit(s).error().code == engine_errc::bad_params);
  s.grammar = {};
  CHECK(r.sched->submit(s).ok());
  r.run_all();
  r.check_nothing_held();
}

TEST_CASE("scheduler: min_tokens keeps the end token and the stop ids out until that many tokens") {
  rig r(small_options());
  std::mt19937 g(44);
  std::vector<std::pair<uint64_t, request_spec>> runs;
  for (int i = 0; i < 40; ++i) {
    request_spec s = make_spec(g, 12, 1, true);
    s.sampling.temperature = 2.0f;  // flat: the end token and the stop ids come early when allowed
    s.ignore_eos = false;
    s.stop_ids = {5, 6, 7};
    s.max_tokens = 30;
    s.min_tokens = 1 + i % 20;
    runs.emplace_back(r.sched->submit(s).value(), s);
  }
  r.run_all();
  int stopped_right_after = 0;
  for (const auto& [id, s] : runs) {
    const auto& out = r.out[id];
    REQUIRE(int64_t(out.size()) > s.min_tokens);
    for (int64_t k = 0; k < s.min_tokens; ++k) {
      CHECK(out[std::size_t(k)] != r.args.eos_token_id);
      CHECK(std::find(s.stop_ids.begin(), s.stop_ids.end(), out[std::size_t(k)]) == s.stop_ids.end());
    }
    stopped_right_after += r.reason[id] == "stop" && int64_t(out.size()) == s.min_tokens + 1;
  }
  CHECK(stopped_right_after > 0);  // allowed again, they do come
  request_spec bad = runs[0].second;
  bad.min_tokens = bad.max_tokens + 1;
  CHECK(r.sched->submit(bad).error().code == engine_errc::bad_params);
  r.check_nothing_held();
}
