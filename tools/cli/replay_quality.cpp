// `cedar replay-quality`: how close SWA bounded replay comes to an exact recompute. For each
// random conversation of N tokens with a page-aligned prefix hit H (its global KV computed by
// an earlier request), the last position's logits after (a) bounded replay of [H-W, H) then
// prefill of [H, N), and (b) full replay (the layer-deep halo), are compared with (c) a cold
// prefill of all N tokens. Prints max |diff| and top-1 agreement. Decoder truncation is off in
// all three so only replay differs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "actors/replay.hpp"
#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace {

using namespace cedar;

std::vector<float> last_logits(const model& m, request_kv& kv, std::span<const int32_t> all, int64_t begin,
                               int64_t end, bool replay) {
  forward_item it;
  kv.num_tokens = begin;
  it.kv = &kv;
  it.history = all.first(begin);
  it.tokens = all.subspan(begin, end - begin);
  it.replay = replay;
  it.logits = replay ? logits_mode::none : logits_mode::last;
  std::vector<float> logits;
  m.forward({&it, 1}, logits);
  return logits;
}

/// Logits of the last position when [0, hit) comes from another request's pages and the ring
/// is rebuilt by replaying [from, hit).
std::vector<float> with_replay(const model& m, const std::vector<int32_t>& toks, int64_t hit, int64_t from) {
  const kv_layout& l = m.layout();
  cli::owned_request first(l, int64_t(toks.size()));
  last_logits(m, first.kv, toks, 0, hit, false);
  cli::owned_request second(l, int64_t(toks.size()));
  for (int64_t p = 0; p < hit / l.page_tokens; ++p) second.kv.pages[p] = first.kv.pages[p];
  std::fill(second.ring.begin(), second.ring.end(), uint8_t(0x5a));  // stale bytes must never be read
  last_logits(m, second.kv, toks, from, hit, true);
  return last_logits(m, second.kv, toks, hit, int64_t(toks.size()), false);
}

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

int replay_quality_main(int argc, char** argv) {
  std::string preset = "tiny";
  int convs = 100, page_tokens = 32, max_len = 160;
  uint64_t seed = 1;
  const char* usage = "usage: cedar replay-quality [--model tiny] [--conversations 100] [--page-tokens 32] "
                      "[--max-len 160] [--seed 1]\n"
                      "  bounded SWA replay's logits against full replay's on random conversations\n";
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") return std::fputs(usage, stdout), 0;
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    bool ok = i + 1 < argc;
    if (!ok) {}
    else if (k == "--model") preset = v;
    else if (k == "--conversations") ok = cli::read_integer(v, convs, 1);
    else if (k == "--page-tokens") ok = cli::read_integer(v, page_tokens, 2) && page_tokens % 2 == 0;
    else if (k == "--max-len") ok = cli::read_integer(v, max_len, 1);
    else if (k == "--seed") ok = cli::read_integer(v, seed);
    else ok = false;
    if (!ok) return std::fprintf(stderr, "cedar replay-quality: bad or incomplete option '%s'\n%s", k.c_str(), usage), 2;
  }
  std::string error;
  auto args = load_model_args(preset, &error);
  if (!args) return std::fprintf(stderr, "replay-quality: %s\n", error.c_str()), 1;
  auto weights = std::make_shared<tensor_map>(make_random_weights(*args, seed));
  const model m(*args, weights, kv_dtype::fp4, page_tokens);
  const int W = args->sliding_window, P = page_tokens;
  std::mt19937 g{uint32_t(seed)};
  double bounded_max = 0, full_max = 0, bounded_sum = 0;
  int bounded_top1 = 0, full_top1 = 0, n = 0;
  for (int c = 0; c < convs; ++c) {
    const int len = P + W + 2 + int(g() % std::max(1, max_len - P - W - 2));
    std::vector<int32_t> toks(len);
    for (auto& t : toks) t = int32_t(3 + g() % 100000);
    const int64_t hit = (len - 1) / P * P;
    const replay_plan b = plan_replay(hit, W, args->num_hidden_layers, swa_replay_mode::bounded);
    const replay_plan f = plan_replay(hit, W, args->num_hidden_layers, swa_replay_mode::full);
    if (b.cached_tokens == 0) continue;
    cli::owned_request cold(m.layout(), len);
    const auto exact = last_logits(m, cold.kv, toks, 0, len, false);
    const auto lb = with_replay(m, toks, hit, b.replay_from);
    const auto lf = with_replay(m, toks, hit, f.replay_from);
    double db = 0, df = 0;
    for (std::size_t v = 0; v < exact.size(); ++v)
      db = std::max(db, double(std::abs(lb[v] - exact[v]))), df = std::max(df, double(std::abs(lf[v] - exact[v])));
    bounded_max = std::max(bounded_max, db), full_max = std::max(full_max, df), bounded_sum += db;
    bounded_top1 += argmax(lb) == argmax(exact), full_top1 += argmax(lf) == argmax(exact);
    ++n;
  }
  std::printf("model %s (window %d, %d layers), %d conversations of %d-%d tokens, pages of %d, hits page-aligned\n",
              preset.c_str(), W, args->num_hidden_layers, n, P + W + 2, max_len, P);
  std::printf("bounded replay [H-%d, H): max |logit diff| %.4g (mean of per-conversation max %.4g), top-1 agreement "
              "%d/%d\n",
              W, bounded_max, bounded_sum / std::max(1, n), bounded_top1, n);
  std::printf("full replay (halo %d rows): max |logit diff| %.4g, top-1 agreement %d/%d\n",
              W + args->num_hidden_layers * (W - 1), full_max, full_top1, n);
  return 0;
}

}  // namespace

CEDAR_COMMAND("replay-quality", "bounded vs full SWA replay against a cold recompute (last-position logits)",
              replay_quality_main);
