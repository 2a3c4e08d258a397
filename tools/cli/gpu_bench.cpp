// `cedar gpu-bench`: the model's serving figures on one device, each next to a ceiling measured
// in the same run: decode steps (batch 1..N on synthetic KV) against the HBM floor, prefill
// against cuBLASLt's FP8 rate, decoder truncation, a prefix hit with bounded replay against a
// cold prefill, and a long prompt with generation. --device cpu runs the same phases on the
// CPU model (no ceilings), which is how CI checks the harness.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "actors/layout.hpp"
#include "config/model_config.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/gpu_bench.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace cedar::cli::gpu_bench {
namespace {

const char* const phase_order[] = {"floor", "decode", "prefill", "truncation", "prefix", "generate"};

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: cedar gpu-bench [--model PRESET|DIR] [--seed S] [--device cpu|cuda] [--gpu-kernels exact|fast]\n"
      "                       [--gpu-dense-bf16] [--gpu-batch-invariant on|off]\n"
      "                       [--kv-dtype fp4|fp8] [--page-tokens 64]\n"
      "                       [--phases floor,decode,prefill,truncation,prefix,generate]\n"
      "                       [--batch 1,64,256] [--context 8192] [--steps 16] [--warmup-steps 2] [--temperature T]\n"
      "                       [--top-p P] [--logprobs K]\n"
      "                       [--prefill 8192,32768] [--chunk N] [--prefix-tokens 32768] [--new-tokens 200]\n"
      "                       [--gen-prompt 32768] [--gen-tokens 256] [--truncate on|off] [--out FILE.json]\n"
      "                       [--layout tpN|depN] [--progress | --no-progress]\n"
      "  --gpu-kernels: the kernel set of --device cuda (default fast, as serving). --gpu-dense-bf16:\n"
      "    keep bf16 copies of the dense linears on the device (as cedar serve --gpu-dense-bf16).\n"
      "  --gpu-batch-invariant off: faster decode tiles at 1-2 rows whose bits depend on the batch\n"
      "    (as cedar serve). --page-tokens: positions per KV page (even; as cedar serve, default 64).\n"
      "  decode: --steps timed calls per batch size on synthetic KV (random well-formed records,\n"
      "    --context tokens per request), against the step's HBM floor at the measured copy rate;\n"
      "    greedy, or sampled at --temperature T (each request its own seed, top-k off, top-p --top-p,\n"
      "    default 1: off);\n"
      "    --logprobs K: the first request of each step also asks for K top logprobs.\n"
      "  prefill: each --prefill prompt in --chunk calls (default: serving's --max-prefill-chunk on the\n"
      "    device: 512 on the CPU, 8192 with --device cuda), no truncation; linear-layer TFLOP/s\n"
      "    against cuBLASLt's FP8 rate. truncation: the same prompts with decoder truncation.\n"
      "  prefix: TTFT of --prefix-tokens cached (whole pages) + --new-tokens new, bounded replay,\n"
      "    against the cold prefill of the whole prompt. generate: --gen-prompt tokens then\n"
      "    --gen-tokens greedy tokens. --truncate applies to prefix and generate (serving's default on).\n"
      "  floor: the decode floor's bytes per batch size and the linear FLOPs per token, from the\n"
      "    inventory only (no model is loaded). Phases run in the order listed above.\n"
      "  --layout tpN|depN (N > 1, --device cuda, fast kernels): the decode phase on N devices, rank r\n"
      "    on device r, each with its own shard and thread; TP-N runs each batch on every rank, DEP-N\n"
      "    splits it into N parts. The floor is the step's bytes at N devices' copy rate. Only the\n"
      "    floor and decode phases run with a layout.\n"
      "  --progress / --no-progress: a line on stderr as each phase goes (default: on when stderr\n"
      "    is a terminal). On the CPU (the default device) the default phases take minutes.\n");
}

template <class T>
bool parse_list(const std::string& text, std::vector<T>& out) {
  const auto ids = parse_ids(text);
  if (!ids || std::any_of(ids->begin(), ids->end(), [](int32_t v) { return v < 1; })) return false;
  out.assign(ids->begin(), ids->end());
  return true;
}

bool parse_phases(const std::string& text, std::vector<std::string>& out) {
  std::set<std::string> want;
  std::stringstream in(text);
  for (std::string p; std::getline(in, p, ',');) {
    if (std::find(std::begin(phase_order), std::end(phase_order), p) == std::end(phase_order)) return false;
    want.insert(p);
  }
  out.clear();
  for (const char* p : phase_order)
    if (want.count(p)) out.push_back(p);
  return !out.empty();
}

/// tpN or depN with N >= 1 (the model's own limits are checked when it is loaded).
bool parse_layout_text(const std::string& v, options& o) {
  const auto spec = parse_layout_name(v);
  if (!spec || spec.value().num_shards < 1) return false;
  o.layout_mode = spec.value().mode;
  o.layout_size = spec.value().num_shards;
  return true;
}

/// Empty when the arguments are taken; otherwise why not, naming the flag.
std::string parse(arg_reader& r, options& o) {
  o.progress = isatty(STDERR_FILENO);  // someone watching: the phases take minutes on the CPU
  // a flag whose reader is read(text, field) -> bool
  const auto read_with = [&r](auto read, auto& field, const char* accepted) {
    if (auto v = r.value(); v && !read(*v, field)) r.bad_value(*v, accepted);
  };
  const auto on_off = [](const std::string& v) {
    bool on = true;
    return parse_on_off(v, on) ? std::optional(on) : std::nullopt;
  };
  const auto even_page = [](const std::string& v, int& out) {
    return read_integer(v, out, 2, 1 << 20) && out % 2 == 0;
  };
  std::string layout;
  while (r.next()) {
    const std::string& k = r.flag();
    double t = 0;
    if (k == "--progress" || k == "--no-progress") o.progress = k == "--progress";
    else if (k == "--gpu-dense-bf16") o.dense_bf16 = true;
    else if (k == "--model") r.value(o.model);
    else if (k == "--seed") r.integer(o.seed);
    else if (k == "--device") r.parsed(o.device, parse_device, "cpu or cuda");
    else if (k == "--gpu-kernels") r.parsed(o.kernels, parse_gpu_kernels, "exact or fast");
    else if (k == "--kv-dtype") r.parsed(o.kv, parse_kv_dtype, "fp4 or fp8");
    else if (k == "--page-tokens") read_with(even_page, o.page_tokens, "an even integer in [2, 1048576]");
    else if (k == "--phases")
      read_with(parse_phases, o.phases, "a comma-separated list of floor, decode, prefill, truncation, prefix,"
                                        " generate");
    else if (k == "--batch") read_with(parse_list<int>, o.batches, "a comma-separated list of integers >= 1");
    else if (k == "--prefill") read_with(parse_list<int64_t>, o.prefills, "a comma-separated list of integers >= 1");
    else if (k == "--context") r.integer(o.context, 1);
    else if (k == "--chunk") r.integer(o.chunk, 1);
    else if (k == "--steps") r.integer(o.steps, 1);
    else if (k == "--temperature") r.number(t, 0, 100, "a number in [0, 100]"), o.temperature = float(t);
    else if (k == "--top-p") r.number(t, 1e-6, 1, "a number in [1e-6, 1]"), o.top_p = float(t);
    else if (k == "--logprobs") r.integer(o.logprobs, 0, 20);
    else if (k == "--warmup-steps") r.integer(o.warmup_steps, 0);
    else if (k == "--prefix-tokens") r.integer(o.prefix_tokens, 1);
    else if (k == "--new-tokens") r.integer(o.new_tokens, 1);
    else if (k == "--gen-prompt") r.integer(o.gen_prompt, 1);
    else if (k == "--gen-tokens") r.integer(o.gen_tokens, 1);
    else if (k == "--truncate") r.parsed(o.truncate, read_on_off, "on or off");
    else if (k == "--gpu-batch-invariant") r.parsed(o.batch_invariant, on_off, "on or off");
    else if (k == "--out") r.value(o.out);
    else if (k == "--layout") {
      if (r.value(layout) && !parse_layout_text(layout, o)) r.bad_value(layout, "tpN or depN");
    } else r.unknown();
  }
  if (r.help() || !r.error().empty()) return r.error();
  const bool fast_cuda = o.device == device_kind::cuda && o.kernels == gpu_kernels::fast;
  if (o.dense_bf16 && !fast_cuda) return "--gpu-dense-bf16 needs --device cuda and --gpu-kernels fast";
  if (o.batch_invariant == false && !fast_cuda)
    return "--gpu-batch-invariant off needs --device cuda and --gpu-kernels fast";
  if (o.layout_size > 1 && !fast_cuda) return "--layout " + layout + " needs --device cuda and --gpu-kernels fast";
  if (o.layout_size > 1 && std::any_of(o.phases.begin(), o.phases.end(), [](const std::string& p) {
        return p != "floor" && p != "decode";
      }))
    return "--layout " + layout + " runs the floor and decode phases only (--phases floor,decode)";
  if (o.chunk == 0)
    o.chunk = o.device == device_kind::cuda ? engine_options::gpu_step_tokens
                                            : engine_options{}.max_prefill_tokens_per_request;
  return "";
}

/// The model as a shard's step_model, as `cedar serve` opens it: the CPU model, or the GPU
/// model with its KV arena on the device.
std::unique_ptr<step_model> open_step_model(const options& o, std::string* error) {
  if (o.device == device_kind::cpu) {
    auto m = open_model(o.model, o.seed, o.kv, error, o.page_tokens);
    return m ? wrap_model(std::shared_ptr<const model>(std::move(m))) : nullptr;
  }
  const auto args = cli::load_serving_args(o.model, error);
  if (!args) return nullptr;
  auto weights = load_weights(o.model, *args, o.seed, o.progress, error);
  if (!weights) return nullptr;
  if (o.batch_invariant) set_gpu_batch_invariant(*o.batch_invariant);
  return make_gpu_step_model(*args, std::move(weights), o.kv, o.page_tokens, o.kernels, o.dense_bf16, o.progress,
                             error);
}

bool wants(const options& o, const char* phase) {
  return std::find(o.phases.begin(), o.phases.end(), phase) != o.phases.end();
}

/// The floor phase: bytes per decode step for each batch size, from the inventory alone.
void add_floor(report& r, const model_args& args) {
  const kv_layout layout = kv_layout::make(args, r.opts.kv, r.opts.page_tokens);
  for (int batch : r.opts.batches) {
    decode_result d;
    d.batch = batch, d.context = r.opts.context;
    d.experts_touched = expected_experts_touched(args, batch);
    d.parts = decode_step_bytes(args, layout, r.opts.context, batch);
    for (const step_bytes_part& p : d.parts) d.floor_bytes += p.bytes;
    r.floor.push_back(d);
  }
}

void print_floor(const report& r) {
  std::printf("linear FLOPs per prompt token (every layer, head excluded): %.2f GFLOP\n", r.linear_flops_per_token / 1e9);
  for (const decode_result& d : r.floor) {
    std::printf("decode step, batch %d, %lld context: %.1f MB (%.1f routed experts per layer, expected)\n", d.batch,
                (long long)d.context, d.floor_bytes / 1e6, d.experts_touched);
    for (const step_bytes_part& p : d.parts) std::printf("  %-62s %10.1f MB\n", p.what.c_str(), p.bytes / 1e6);
  }
}

/// Runs the timed phases, writing the JSON after each so that a run cut short keeps what it did.
void run_phases(runner& run, report& r) {
  const options& o = r.opts;
  const auto save = [&] {
    if (!o.out.empty()) write_json(r, o.out);
  };
  if (wants(o, "decode"))
    for (int batch : o.batches) r.decode.push_back(run.decode(batch)), save();
  if (wants(o, "prefill"))
    for (int64_t tokens : o.prefills) r.prefill.push_back(run.prefill(tokens, false)), save();
  if (wants(o, "truncation"))
    for (int64_t tokens : o.prefills) r.truncation.push_back(run.truncation(tokens)), save();
  if (wants(o, "prefix")) r.prefix.push_back(run.prefix()), save();
  if (wants(o, "generate")) r.generate.push_back(run.generate(r.load_s)), save();
}

int gpu_bench_main(int argc, char** argv) {
  report r;
  arg_reader reader(argc, argv);
  const std::string refused = parse(reader, r.opts);
  if (reader.help()) return usage(stdout), 0;
  if (!refused.empty()) return refuse("gpu-bench", refused, usage);
  const options& o = r.opts;
  std::string error;
  const auto args = cli::load_serving_args(o.model, &error);
  if (!args) {
    std::fprintf(stderr, "gpu-bench: %s\n", error.c_str());
    return 1;
  }
  const linear_flops f = linear_flops_per_row(*args);
  for (double x : f.per_layer_row) r.linear_flops_per_token += x;
  r.device = o.device == device_kind::cuda ? "cuda" : "cpu";
  if (wants(o, "floor")) add_floor(r, *args);
  if (o.layout_size > 1 && wants(o, "decode")) {
    if (std::string why = run_layout_decode(r, *args); !why.empty()) {
      std::fprintf(stderr, "gpu-bench: %s\n", why.c_str());
      print_table(r);
      return 1;
    }
  } else if (o.phases.size() > std::size_t(wants(o, "floor"))) {
    if (std::string why = device_unavailable(o.device); !why.empty()) {
      std::fprintf(stderr, "gpu-bench: %s\n", why.c_str());
      return 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto m = open_step_model(o, &error);
    r.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!m) {
      std::fprintf(stderr, "gpu-bench: %s\n", error.c_str());
      return 1;
    }
    r.ceil = measure_ceilings(o.device);
    if (o.device == device_kind::cuda) r.device = r.ceil.device;
    const kv_capacity cap = bench_capacity(o, m->layout());
    std::unique_ptr<shard> s;
    try {
      s = std::make_unique<shard>(std::move(m), cap);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpu-bench: %s\n", e.what());
      return 1;
    }
    runner run(*s, cap, o, r.ceil);
    try {
      run_phases(run, r);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpu-bench: %s\n", e.what());
      print_table(r);
      return 1;
    }
  }
  if (!r.floor.empty()) print_floor(r);
  print_table(r);
  if (!o.out.empty() && !write_json(r, o.out)) return 1;
  return 0;
}

}  // namespace

CEDAR_COMMAND("gpu-bench", "serving figures on one device (decode, prefill, truncation, prefix hit) vs its ceilings",
              gpu_bench_main);

}  // namespace cedar::cli::gpu_bench
