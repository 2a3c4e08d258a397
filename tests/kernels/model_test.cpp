// The whole forward pass on the CPU backend, with random weights in the checkpoint formats
// (presets micro and tiny). What a user relies on: decode after prefill gives the same logits
// as one long prefill, chunking and batching change nothing, truncation touches only what it
// should, replay rebuilds a usable window, and 40 random layers stay numerically sane.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"
#include "model_reference.hpp"
#include "op_reference.hpp"
#include "model_test_util.hpp"

namespace cedar::test {
namespace {

constexpr uint64_t weight_seed = 1234;

struct loaded {
  std::shared_ptr<const tensor_map> weights;
  std::unique_ptr<model> m;
};

/// One model per (preset, kv dtype), built once: random weights for tiny take a while.
const loaded& load_with_weights(const std::string& preset, kv_dtype dtype = kv_dtype::fp4) {
  static std::map<std::pair<std::string, int>, loaded> cache;
  loaded& slot = cache[{preset, int(dtype)}];
  if (!slot.m) {
    std::string error;
    const auto args = load_model_args(preset, &error);
    REQUIRE_MESSAGE(args.has_value(), error);
    slot.weights = std::make_shared<tensor_map>(make_random_weights(*args, weight_seed));
    slot.m = std::make_unique<model>(*args, slot.weights, dtype);
  }
  return slot;
}

const model& load(const std::string& preset, kv_dtype dtype = kv_dtype::fp4) {
  return *load_with_weights(preset, dtype).m;
}

std::span<const float> row(const std::vector<float>& logits, int vocab, int r) {
  return std::span<const float>(logits).subspan(std::size_t(r) * vocab, vocab);
}

/// Prefills `prefill` tokens, then decodes the rest one by one; each decode step's logits
/// must equal that position's row of a one-shot forward over the whole sequence.
void check_decode_equals_prefill(const model& m, int total, int prefill, uint32_t seed) {
  const int vocab = m.args().vocab_size;
  const auto tokens = random_tokens(total, vocab, seed);
  test_request full(m.layout(), total);
  const auto all = run(m, full, tokens, logits_mode::all);
  REQUIRE(all.size() == std::size_t(total) * vocab);

  test_request inc(m.layout(), total);
  const auto first = run(m, inc, std::span(tokens).first(prefill));
  CHECK(std::ranges::equal(first, row(all, vocab, prefill - 1)));
  for (int t = prefill; t < total; ++t) {
    const auto step = run(m, inc, std::span(tokens).subspan(t, 1));
    INFO("position " << t);
    CHECK(std::ranges::equal(step, row(all, vocab, t)));
  }
  CHECK(full.ring == inc.ring);
  CHECK(full.page_mem == inc.page_mem);
}

}  // namespace

TEST_CASE("model: decode after prefill equals one long prefill, bit for bit") {
  const model& micro = load("micro");
  const int W = micro.args().sliding_window;
  // > 3 windows (ring wraps); ratio-2 entries (14, 15) > index_topk (8); ratio-1 entries
  // (29, 30) > candidate positions (4 blocks x 2), so both top-k levels engage.
  REQUIRE(29 > 3 * W);
  REQUIRE(29 / 2 > micro.args().index_topk);
  REQUIRE(29 > micro.args().candidate_topk_blocks * micro.args().candidate_block_size);
  SUBCASE("micro, odd length") { check_decode_equals_prefill(micro, 29, 13, 1); }
  SUBCASE("micro, even length") { check_decode_equals_prefill(micro, 30, 10, 2); }
  SUBCASE("tiny, 40 layers") { check_decode_equals_prefill(load("tiny"), 29, 12, 3); }
  SUBCASE("micro, FP8 global KV") {
    check_decode_equals_prefill(load("micro", kv_dtype::fp8), 27, 11, 4);
  }
}

TEST_CASE("model: wo_a stored FP8 is bound as its bf16 dequantization") {
  const loaded& l = load_with_weights("micro");
  const auto w = model_detail::bind_weights(l.m->args(), l.weights);
  for (int layer : {0, l.m->args().num_hidden_layers - 1}) {
    const std::string prefix = "layers." + std::to_string(layer) + ".attn.wo_a.";
    const tensor_entry* q = l.weights->find(prefix + "weight");
    REQUIRE(q != nullptr);
    REQUIRE(q->dtype == st_dtype::f8_e4m3);
    const fp8_weight stored{int(q->shape[0]), int(q->shape[1]), q->data,
                            l.weights->find(prefix + "scale")->data};
    const std::vector<float> want = op_reference::dequant(stored);
    const bf16_weight& got = w.layers[layer].attn.wo_a;
    REQUIRE(std::size_t(got.out) * got.in == want.size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      mismatches += fmt::bf16_to_f32(got.data[i]) != fmt::round_bf16(want[i]);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("model: every position's logits equal a whole-sequence reference, bit for bit") {
  // The reference has no ring, page, record, tail or chunk: it assembles each query's window
  // and compressed candidates from whole-sequence arrays, read straight from the spec.
  for (const auto& [preset, dtype, total] :
       {std::tuple{"micro", kv_dtype::fp4, 29}, std::tuple{"micro", kv_dtype::fp8, 30},
        std::tuple{"tiny", kv_dtype::fp4, 29}}) {
    INFO(preset << (dtype == kv_dtype::fp8 ? " fp8" : " fp4") << " T=" << total);
    const loaded& l = load_with_weights(preset, dtype);
    const model_args& a = l.m->args();
    const auto tokens = random_tokens(total, a.vocab_size, 13);
    const auto w = model_detail::bind_weights(a, l.weights);
    reference_model ref(a, w, dtype == kv_dtype::fp8);
    const auto want = ref.logits(tokens);
    // Chunks of 5 so rows read earlier chunks' window from the ring and entries from pages.
    test_request r(l.m->layout(), total);
    std::vector<float> got;
    for (int p = 0; p < total; p += 5) {
      const auto part = run(*l.m, r, std::span(tokens).subspan(p, std::min(5, total - p)), logits_mode::all);
      got.insert(got.end(), part.begin(), part.end());
    }
    REQUIRE(got.size() == want.size());
    CHECK(max_abs_diff(got, want) == 0.0f);

    // Decoder truncation: the kept rows' logits equal the reference's with the window floor.
    const int cut = total - a.sliding_window;
    const auto want_cut = ref.logits(tokens, cut);
    test_request rc(l.m->layout(), total);
    const auto got_cut = run(*l.m, rc, tokens, logits_mode::all, cut);
    REQUIRE(got_cut.size() == std::size_t(a.sliding_window) * a.vocab_size);
    CHECK(std::ranges::equal(got_cut, std::span(want_cut).last(got_cut.size())));
  }
}

TEST_CASE("model: tokens far outside the window still reach the last position") {
  // Window attention alone carries a token at most layers x (window - 1) positions forward;
  // beyond that only the compressed entries (chosen by the indexers) can carry it.
  const model& m = load("micro");
  const int total = m.args().num_hidden_layers * (m.args().sliding_window - 1) + 10;
  auto tokens = random_tokens(total, m.args().vocab_size, 12);
  test_request a(m.layout(), total), b(m.layout(), total);
  const auto la = run(m, a, tokens);
  tokens[0] = tokens[0] == 5 ? 6 : 5;
  const auto lb = run(m, b, tokens);
  CHECK(max_abs_diff(la, lb) > 1e-4f);
}

TEST_CASE("model: small KV pages give the same logits as one page") {
  // Pages of 4 positions: entries, keys and their visibility cross many page boundaries.
  const loaded& l = load_with_weights("micro");
  const model small(l.m->args(), l.weights, kv_dtype::fp4, 4);
  REQUIRE(small.layout().page_tokens == 4);
  const int total = 29;
  const auto tokens = random_tokens(total, small.args().vocab_size, 17);
  test_request one_page(l.m->layout(), total), many(small.layout(), total);
  REQUIRE(many.kv.pages.size() > 7);
  const auto want = run(*l.m, one_page, std::span(tokens).first(11));
  CHECK(run(small, many, std::span(tokens).first(11)) == want);
  for (int t = 11; t < total; ++t) {
    INFO("position " << t);
    CHECK(run(small, many, std::span(tokens).subspan(t, 1)) ==
          run(*l.m, one_page, std::span(tokens).subspan(t, 1)));
  }
}

TEST_CASE("model: chunked prefill equals one-shot prefill") {
  const model& m = load("micro");
  const int total = 29;
  const auto tokens = random_tokens(total + 1, m.args().vocab_size, 5);
  const auto prompt = std::span(tokens).first(total);
  test_request one(m.layout(), total + 1);
  const auto expect = run(m, one, prompt);
  const auto ring = one.ring;
  const auto pages = one.page_mem;
  const auto expect_next = run(m, one, std::span(tokens).subspan(total, 1));
  for (int chunk : {1, 3, 7, 64}) {
    INFO("chunk " << chunk);
    test_request r(m.layout(), total + 1);
    std::vector<float> got;
    for (int p = 0; p < total; p += chunk)
      got = run(m, r, prompt.subspan(p, std::min(chunk, total - p)));
    CHECK(got == expect);
    CHECK(r.ring == ring);
    CHECK(r.page_mem == pages);
    CHECK(run(m, r, std::span(tokens).subspan(total, 1)) == expect_next);
  }
}

TEST_CASE("model: chunked prefill with decoder truncation equals one-shot truncation") {
  const model& m = load("micro");
  const int total = 29, cut = total - m.args().sliding_window;
  const auto tokens = random_tokens(total, m.args().vocab_size, 14);
  test_request one(m.layout(), total);
  const auto expect = run(m, one, tokens, logits_mode::last, cut);
  for (int chunk : {3, 7, 22}) {
    INFO("chunk " << chunk);
    test_request r(m.layout(), total);
    std::vector<float> got;
    for (int p = 0; p < total; p += chunk) {
      // Only the last chunk asks for logits: earlier ones may lie wholly below the cut.
      const auto mode = p + chunk >= total ? logits_mode::last : logits_mode::none;
      got = run(m, r, std::span(tokens).subspan(p, std::min(chunk, total - p)), mode, cut);
    }
    CHECK(got == expect);
    CHECK(r.ring == one.ring);
  }
}

TEST_CASE("model: a request's logits do not depend on the rest of the batch") {
  const model& m = load("micro");
  const int vocab = m.args().vocab_size, W = m.args().sliding_window;
  const auto ta = random_tokens(21, vocab, 6), tb = random_tokens(7, vocab, 7),
             tc = random_tokens(18, vocab, 8), td = random_tokens(27, vocab, 15),
             te = random_tokens(24, vocab, 16);
  // a decodes its 21st token; b prefills 7 tokens (all logits); c runs a 5-token chunk;
  // d prefills 27 tokens with decoder truncation; e replays its last window over cached pages.
  struct requests {
    test_request a, b, c, d, e;
    explicit requests(const kv_layout& l) : a(l, 32), b(l, 32), c(l, 32), d(l, 32), e(l, 32) {}
  };
  const auto prepare = [&](requests& r) {
    run(m, r.a, std::span(ta).first(20));
    run(m, r.c, std::span(tc).first(13));
    run(m, r.e, te);  // fills e's pages; the replay below rewrites only its ring
    r.e.kv.num_tokens = int64_t(te.size()) - W;
    r.e.history.resize(te.size() - W);
  };
  const auto make_items = [&](requests& r) {
    std::vector<forward_item> items = {
        r.a.item(std::span(ta).subspan(20, 1)), r.b.item(tb, logits_mode::all),
        r.c.item(std::span(tc).subspan(13, 5)), r.d.item(td),
        r.e.item(std::span(te).last(W), logits_mode::last)};
    items[3].truncate_below = int64_t(td.size()) - W;
    items[4].replay = true;
    return items;
  };
  requests alone_r(m.layout()), together_r(m.layout());
  prepare(alone_r);
  prepare(together_r);
  std::vector<float> alone;
  for (forward_item& item : make_items(alone_r)) m.forward(std::span(&item, 1), alone);
  auto items = make_items(together_r);
  std::vector<float> together;
  m.forward(items, together);
  CHECK(together.size() == std::size_t(1 + 7 + 1 + 1 + 1) * vocab);
  CHECK(together == alone);
  CHECK(together_r.a.ring == alone_r.a.ring);
  CHECK(together_r.b.ring == alone_r.b.ring);
  CHECK(together_r.c.page_mem == alone_r.c.page_mem);
  CHECK(together_r.d.ring == alone_r.d.ring);
  CHECK(together_r.e.ring == alone_r.e.ring);
  CHECK(together_r.e.tails == alone_r.e.tails);
}

TEST_CASE("model: decoder truncation runs the late layers on the last window only") {
  for (const std::string preset : {"micro", "tiny"}) {
    const model& m = load(preset);
    const model_args& a = m.args();
    const int W = a.sliding_window, vocab = a.vocab_size;
    for (int total : {5, 27}) {
      INFO(preset << ", " << total << " tokens");
      const auto tokens = random_tokens(total + 2, vocab, 9);
      const auto prompt = std::span(tokens).first(total);
      test_request plain(m.layout(), total + 2), cut(m.layout(), total + 2),
          zero(m.layout(), total + 2);
      forward_stats stats;
      const auto expect = run(m, plain, prompt);
      const auto got = run(m, cut, prompt, logits_mode::last, std::max(0, total - W), &stats);
      for (int l = 0; l < a.num_hidden_layers; ++l)
        CHECK(stats.rows_per_layer[l] == (l < a.truncate_from_layer ? total : std::min(total, W)));
      // Truncation that drops nothing is the untruncated forward, bit for bit.
      CHECK(run(m, zero, prompt, logits_mode::last, 0) == expect);
      if (total <= W) CHECK(got == expect);
      // Decoding after a truncated prefill reads only ring records it wrote.
      const auto next_plain = run(m, plain, std::span(tokens).subspan(total, 1));
      const auto next_cut = run(m, cut, std::span(tokens).subspan(total, 1));
      CHECK(std::isfinite(max_abs_diff(next_cut, next_plain)));
      MESSAGE(preset << " T=" << total << " truncated vs full, last prefill position: max |diff| "
                     << max_abs_diff(got, expect) << ", top-1 "
                     << std::string(argmax(got) == argmax(expect) ? "agrees" : "differs")
                     << "; next decode: max |diff| " << max_abs_diff(next_cut, next_plain)
                     << ", top-1 " << std::string(argmax(next_cut) == argmax(next_plain) ? "agrees" : "differs"));
    }
  }
}

TEST_CASE("model: replay rebuilds the window from shared pages without writing them") {
  const model& m = load("micro");
  const model_args& a = m.args();
  const int W = a.sliding_window, H = 24;
  const int steps = 8;
  const auto tokens = random_tokens(H + steps, a.vocab_size, 10);
  test_request orig(m.layout(), H + steps);
  run(m, orig, std::span(tokens).first(H));

  test_request re(m.layout(), H + steps);
  re.page_mem = orig.page_mem;  // the prefix cache hands over the global pages only
  for (std::size_t p = 0; p < re.page_mem.size(); ++p) re.kv.pages[p] = re.page_mem[p].data();
  re.kv.num_tokens = H - W;
  re.history.assign(tokens.begin(), tokens.begin() + (H - W));
  forward_item replay = re.item(std::span(tokens).subspan(H - W, W), logits_mode::none);
  replay.replay = true;
  std::vector<float> none;
  m.forward(std::span(&replay, 1), none);
  re.history.insert(re.history.end(), tokens.begin() + (H - W), tokens.begin() + H);
  CHECK(none.empty());
  CHECK(re.kv.num_tokens == H);
  CHECK(re.page_mem == orig.page_mem);
  const std::size_t layer_bytes = std::size_t(W) * m.layout().swa_record_bytes;
  CHECK(std::equal(re.ring.begin(), re.ring.begin() + layer_bytes, orig.ring.begin()));

  float worst = 0.0f;
  int agree = 0;
  for (int t = H; t < H + steps; ++t) {
    const auto want = run(m, orig, std::span(tokens).subspan(t, 1));
    const auto got = run(m, re, std::span(tokens).subspan(t, 1));
    CHECK(std::isfinite(max_abs_diff(got, want)));
    worst = std::max(worst, max_abs_diff(got, want));
    agree += argmax(got) == argmax(want);
  }
  MESSAGE("replay of the last " << W << " of " << H << " tokens, then " << steps
                                << " decode steps: max |logit diff| " << worst << ", top-1 agrees on "
                                << agree << "/" << steps);
}

TEST_CASE("model: 40 random layers keep the residual finite and bounded") {
  const model& m = load("tiny");
  const auto tokens = random_tokens(30, m.args().vocab_size, 11);
  test_request r(m.layout(), 30);
  forward_stats stats;
  const auto logits = run(m, r, tokens, logits_mode::last, -1, &stats);
  for (int l = 0; l < m.args().num_hidden_layers; ++l) {
    INFO("layer " << l << " max |X| " << stats.max_abs_residual[l]);
    CHECK(std::isfinite(stats.max_abs_residual[l]));
    CHECK(stats.max_abs_residual[l] < 1e3f);
    CHECK(stats.max_abs_residual[l] > 1e-3f);
  }
  for (float v : logits) REQUIRE(std::isfinite(v));
  MESSAGE("tiny max |X| after layers 0, 19, 39: " << stats.max_abs_residual[0] << ", "
                                                  << stats.max_abs_residual[19] << ", "
                                                  << stats.max_abs_residual[39]);
}

}  // namespace cedar::test
