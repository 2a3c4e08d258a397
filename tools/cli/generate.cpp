// `cedar generate`: greedy generation on the CPU or the GPU model (--device), for smoke tests
// and timings. Prefills the prompt (whole, or in --chunk pieces), then decodes one token per
// call; prints the ids (and text when a tokenizer is at hand) and the load, prefill and decode
// times.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "config/engine_options.hpp"
#include "net/json_writer.hpp"
#include "net/tokenizer.hpp"
#include "tools/cli/device_model.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct generate_args {
  std::string model = cedar::cli::default_model;
  uint64_t seed = cedar::cli::default_seed;
  std::string prompt_ids, prompt;
  int max_tokens = 16;
  int chunk = 0;  ///< 0: the whole prompt in one call
  bool truncate = false, json = false, ignore_eos = false, progress = false;
  double max_prefill_s = 0;  ///< > 0: stop prefilling after this long (the prompt is cut there)
  cedar::kv_dtype kv = cedar::kv_dtype::fp4;
  cedar::cli::device_kind device = cedar::cli::device_kind::cpu;
  cedar::gpu_kernels kernels = cedar::gpu_kernels::fast;
  bool dense_bf16 = false;
  std::optional<bool> batch_invariant;  ///< --gpu-batch-invariant (absent: the process default)
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: cedar generate [--model DIR|PRESET] [--seed S] (--prompt-ids 1,2,3 | --prompt TEXT)\n"
               "                      [--max-tokens N] [--chunk N] [--truncate on|off] [--kv-dtype fp4|fp8]\n"
               "                      [--ignore-eos] [--json] [--device cpu|cuda] [--gpu-kernels exact|fast]\n"
               "                      [--gpu-dense-bf16] [--gpu-batch-invariant on|off] [--progress]\n"
               "                      [--max-prefill-s S]\n"
               "  greedy decoding on the CPU backend (default) or the GPU model (--device cuda: weights\n"
               "  and KV on the device; --gpu-kernels fast runs the tensor-core kernels, within stated bounds\n"
               "  of the CPU model, exact gives the CPU's bits; default fast; --gpu-dense-bf16 keeps bf16\n"
               "  copies of the dense linears on the device, for faster many-row steps at twice their\n"
               "  memory; --gpu-batch-invariant off lets a row's bits depend on its batch for faster\n"
               "  decode at 1-2 rows, as cedar serve). Default model: preset '%s' with random\n"
               "  weights from seed %llu (--seed changes it). --max-tokens: tokens to generate (default\n"
               "  16). --truncate on runs the decoder's late layers on the prompt's last window only\n"
               "  (approximate, as in serving). --progress: load progress and per-chunk / per-16-token\n"
               "  times on stderr. --max-prefill-s S: stop prefilling at the first chunk boundary after\n"
               "  S seconds and decode from there (the prompt is cut; the token count prefilled is\n"
               "  reported; not with --truncate on, whose window is the whole prompt's end).\n",
               cedar::cli::default_model, static_cast<unsigned long long>(cedar::cli::default_seed));
}

/// Empty when the arguments are taken; otherwise why not, naming the flag.
std::string parse(cedar::cli::arg_reader& r, generate_args& a) {
  const auto on_off = [](const std::string& v) {
    bool on = true;
    return cedar::parse_on_off(v, on) ? std::optional(on) : std::nullopt;
  };
  while (r.next()) {
    const std::string& k = r.flag();
    if (k == "--json") a.json = true;
    else if (k == "--ignore-eos") a.ignore_eos = true;
    else if (k == "--progress") a.progress = true;
    else if (k == "--gpu-dense-bf16") a.dense_bf16 = true;
    else if (k == "--model") r.value(a.model);
    else if (k == "--seed") r.integer(a.seed);
    else if (k == "--prompt-ids") r.value(a.prompt_ids);
    else if (k == "--prompt") r.value(a.prompt);
    else if (k == "--max-tokens") r.integer(a.max_tokens, 1);
    else if (k == "--chunk") r.integer(a.chunk, 0);
    else if (k == "--max-prefill-s") r.number(a.max_prefill_s, 0, std::numeric_limits<double>::max(), "a number >= 0");
    else if (k == "--device") r.parsed(a.device, cedar::cli::parse_device, "cpu or cuda");
    else if (k == "--gpu-kernels") r.parsed(a.kernels, cedar::cli::parse_gpu_kernels, "exact or fast");
    else if (k == "--truncate") r.parsed(a.truncate, cedar::cli::read_on_off, "on or off");
    else if (k == "--gpu-batch-invariant") r.parsed(a.batch_invariant, on_off, "on or off");
    else if (k == "--kv-dtype") r.parsed(a.kv, cedar::cli::parse_kv_dtype, "fp4 or fp8");
    else r.unknown();
  }
  if (r.help() || !r.error().empty()) return r.error();
  const bool fast_cuda = a.device == cedar::cli::device_kind::cuda && a.kernels == cedar::gpu_kernels::fast;
  if (a.dense_bf16 && !fast_cuda) return "--gpu-dense-bf16 needs --device cuda and --gpu-kernels fast";
  if (a.batch_invariant == false && !fast_cuda)
    return "--gpu-batch-invariant off needs --device cuda and --gpu-kernels fast";
  if (a.max_prefill_s > 0 && a.truncate) return "--max-prefill-s does not go with --truncate on";
  if (!a.prompt_ids.empty() && !a.prompt.empty()) return "give --prompt-ids or --prompt, not both";
  if (a.prompt_ids.empty() && a.prompt.empty()) return "--prompt-ids or --prompt is required";
  return "";
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

int32_t argmax(std::span<const float> v) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return int32_t(best);
}

struct run_result {
  std::vector<int32_t> output;
  int prefilled = 0;  ///< prompt tokens run (all of them unless --max-prefill-s cut the prompt)
  double load_s = 0, prefill_s = 0, decode_s = 0;
};

run_result generate(cedar::cli::cli_model& m, const generate_args& a, const std::vector<int32_t>& prompt) {
  int n = int(prompt.size());
  const auto kv = m.new_request(n + a.max_tokens);
  std::vector<int32_t> history;
  std::vector<float> logits;
  run_result r;
  const int chunk = a.chunk > 0 ? a.chunk : n;
  const auto t0 = clock_type::now();
  double chunk_s = 0;  // the previous chunk's time
  for (int p = 0; p < n; p += chunk) {
    // --max-prefill-s: the chunk expected to end past the limit is the prompt's last.
    const double elapsed = seconds_since(t0);
    const bool last = p + chunk >= n || (a.max_prefill_s > 0 && elapsed + 2 * chunk_s > a.max_prefill_s);
    cedar::forward_item it;
    it.kv = kv.get();
    it.history = history;
    it.tokens = std::span(prompt).subspan(p, std::min(chunk, n - p));
    it.logits = last ? cedar::logits_mode::last : cedar::logits_mode::none;
    it.truncate_below = a.truncate ? std::max(0, n - m.args().sliding_window) : -1;
    logits.clear();
    m.forward(std::span(&it, 1), logits);
    history.insert(history.end(), it.tokens.begin(), it.tokens.end());
    chunk_s = seconds_since(t0) - elapsed;
    if (a.progress)
      std::fprintf(stderr, "cedar: prefilled %zu of %d tokens, %.2f s\n", history.size(), n, seconds_since(t0));
    if (last) break;
  }
  r.prefilled = int(history.size());
  r.prefill_s = seconds_since(t0);
  const auto t1 = clock_type::now();
  for (int step = 0; step < a.max_tokens; ++step) {
    const int32_t next = argmax(logits);
    r.output.push_back(next);
    if ((next == m.args().eos_token_id && !a.ignore_eos) || step + 1 == a.max_tokens) break;
    cedar::forward_item it;
    it.kv = kv.get();
    it.history = history;
    it.tokens = std::span(&r.output.back(), 1);
    logits.clear();
    m.forward(std::span(&it, 1), logits);
    history.push_back(next);
    if (a.progress && (step + 1) % 16 == 0)
      std::fprintf(stderr, "cedar: decoded %d tokens, %.2f s\n", step + 1, seconds_since(t1));
  }
  r.decode_s = seconds_since(t1);
  return r;
}

void print(const generate_args& a, const std::vector<int32_t>& prompt, const run_result& r,
           const std::string& text) {
  const double prefill_tps = r.prefilled / std::max(r.prefill_s, 1e-9);
  const int decoded = int(r.output.size()) - 1;  // the first token comes from the prefill
  const double decode_tps = decoded > 0 ? decoded / std::max(r.decode_s, 1e-9) : 0.0;
  if (a.json) {
    cedar::net::json_writer w;
    w.obj().kv("model", a.model).kv("device", a.device == cedar::cli::device_kind::cuda ? "cuda" : "cpu")
        .kv("prompt_tokens", int64_t(prompt.size())).kv("prefilled_tokens", int64_t(r.prefilled)).key("output_ids").arr();
    for (int32_t id : r.output) w.num(int64_t{id});
    w.end_arr().kv("text", text).kv("load_s", r.load_s).kv("prefill_s", r.prefill_s).kv("decode_s", r.decode_s)
        .kv("prefill_tok_s", prefill_tps).kv("decode_tok_s", decode_tps).end_obj();
    std::printf("%s\n", w.str().c_str());
    return;
  }
  std::string ids;
  for (int32_t id : r.output) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  std::printf("output ids: %s\n", ids.c_str());
  if (!text.empty()) std::printf("text: %s\n", text.c_str());
  std::printf("load: %.1f s\n", r.load_s);
  if (r.prefilled < int(prompt.size()))
    std::printf("prefill cut by --max-prefill-s: %d of %zu prompt tokens run\n", r.prefilled, prompt.size());
  std::printf("prefill: %d tokens in %.3f s (%.1f tok/s)\n", r.prefilled, r.prefill_s, prefill_tps);
  std::printf("decode: %d tokens in %.3f s (%.1f tok/s)\n", decoded, r.decode_s, decode_tps);
}

int generate_main(int argc, char** argv) {
  generate_args a;
  cedar::cli::arg_reader reader(argc, argv);
  const std::string refused = parse(reader, a);
  if (reader.help()) return usage(stdout), 0;
  if (!refused.empty()) return cedar::cli::refuse("generate", refused, usage);
  std::string error;
  std::unique_ptr<cedar::net::tokenizer> tok;
  std::vector<int32_t> prompt;
  if (!a.prompt.empty()) {
    tok = cedar::net::tokenizer::load_dsv41(cedar::net::tokenizer::path_for_model(a.model), &error);
    if (!tok) {
      std::fprintf(stderr, "cedar: --prompt needs a tokenizer (%s); use --prompt-ids\n", error.c_str());
      return 1;
    }
    prompt = tok->encode(a.prompt, true);
  } else if (auto ids = cedar::cli::parse_ids(a.prompt_ids)) {
    prompt = *ids;
  } else {
    std::fprintf(stderr, "cedar: --prompt-ids must be comma-separated non-negative integers\n");
    return 2;
  }
  if (std::string why = cedar::cli::device_unavailable(a.device); !why.empty()) {
    std::fprintf(stderr, "cedar: %s\n", why.c_str());
    return 1;
  }
  const auto t_load = clock_type::now();
  if (a.batch_invariant) cedar::cli::set_gpu_batch_invariant(*a.batch_invariant);
  auto m = cedar::cli::open_cli_model(a.model, a.seed, a.kv, a.device, a.kernels, a.dense_bf16, a.progress, &error);
  const double load_s = seconds_since(t_load);
  if (!m) {
    std::fprintf(stderr, "cedar: %s\n", error.c_str());
    return 1;
  }
  for (int32_t id : prompt)
    if (id >= m->args().vocab_size) {
      std::fprintf(stderr, "cedar: token id %d is outside the vocabulary (%d)\n", id, m->args().vocab_size);
      return 2;
    }
  run_result r = generate(*m, a, prompt);
  r.load_s = load_s;
  print(a, prompt, r, tok ? tok->decode(r.output) : std::string());
  return 0;
}

}  // namespace

CEDAR_COMMAND("generate", "greedy generation on the CPU or GPU model (prints ids and tok/s)", generate_main);
