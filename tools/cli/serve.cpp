// `cedar serve`: the OpenAI-compatible HTTP + WebSocket server. Parses flags (server flags here,
// engine flags via config/engine_options.hpp) and hands over to net::run_server.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <filesystem>
#include <stdexcept>

#include "actors/engine.hpp"
#include "actors/layout.hpp"
#include "config/engine_options.hpp"
#include "config/model_config.hpp"
#include "kernels/checkpoint/safetensors.hpp"
#include "kernels/model/random_weights.hpp"
#include "net/response_format.hpp"
#include "net/server.hpp"
#include "tools/cli/device_model.hpp"
#include "tools/cli/flags.hpp"
#include "net/engram_map.hpp"
#include "net/tokenizer.hpp"
#include "tools/cli/registry.hpp"

namespace {

/// What --model names: a preset or config file (random weights from the seed), or a checkpoint
/// directory (its safetensors).
struct model_choice {
  std::string model = "tiny";
  uint64_t seed = 1234;
  int null_step_us = 1000;
  std::string null_output;  ///< null model: this text (then EOS) instead of a repeated token
  int null_fail_after = 0;  ///< null model: end each request with an engine error after N tokens
  int null_load_ms = 0;     ///< null model: how long its "load" takes (the start-up window in tests)
  cedar::cli::device_kind device = cedar::cli::device_kind::cpu;
  cedar::gpu_kernels kernels = cedar::gpu_kernels::fast;
  bool dense_bf16 = false;           ///< --gpu-dense-bf16
  std::optional<bool> batch_invariant;  ///< --gpu-batch-invariant (absent: the process default)
  double gpu_memory_fraction = 0.9;  ///< --device cuda: share of the free device memory for KV
  bool kv_budget_given = false;      ///< --kv-budget-bytes was on the command line
  cedar::engine_options options;
};

/// --device cuda --layout tpN|depN: one GPU model per device under the runtime. Every device's KV
/// budget is the smallest device's, halved: a switch builds the other layout's arenas before it
/// frees the old ones.
cedar::outcome<std::unique_ptr<cedar::engine>> start_gpu_layout(const model_choice& c, const cedar::model_args& args,
                                                                std::shared_ptr<const cedar::tensor_map> weights) {
  std::string error;
  auto spec = cedar::parse_layout(c.options.layout, args);
  if (!spec) return spec.error();
  auto src = cedar::cli::make_gpu_layout_source(args, std::move(weights),
                                                c.options.kv_fp8 ? cedar::kv_dtype::fp8 : cedar::kv_dtype::fp4,
                                                c.options.page_tokens, c.kernels, c.dense_bf16,
                                                spec.value().num_shards, true, &error);
  if (!src) throw std::runtime_error(error);
  cedar::engine_options options = c.options;
  const int64_t reserve = cedar::gpu_step_reserve_bytes(args, options.max_batched_tokens);
  int64_t budget = -1;
  for (int r = 0; r < spec.value().num_shards; ++r) {
    cedar::cli::select_gpu(r);
    const auto b = cedar::cli::gpu_kv_budget(src->layout(), c.gpu_memory_fraction / 2,
                                             c.kv_budget_given ? options.kv_budget_bytes : 0, options.max_num_seqs,
                                             reserve, r == 0, &error);
    if (!b) throw std::runtime_error("device " + std::to_string(r) + ": " + error);
    budget = budget < 0 ? *b : std::min(budget, *b);
  }
  options.kv_budget_bytes = budget;
  return cedar::engine::start(std::move(src), options);
}

std::unique_ptr<cedar::net::engine_bridge> build_engine(const model_choice& given, const cedar::net::prompt_codec& codec,
                                                        cedar::runtime_event_log events) {
  model_choice c = given;
  c.options.on_event = std::move(events);  // shard joins and losses, rebuilds: to the request log
  if (c.model == "null") {
    std::this_thread::sleep_for(std::chrono::milliseconds(c.null_load_ms));
    std::vector<int32_t> script;
    if (!c.null_output.empty()) {
      auto ids = codec.encode_text(c.null_output).ids;
      script.assign(ids.begin() + 1, ids.end());  // without the BOS encode_text puts first
    }
    return cedar::net::make_null_engine(c.null_step_us, codec.filler_token_id(), std::move(script),
                                        c.null_fail_after);
  }
  std::string error;
  auto args = cedar::load_model_args(c.model, &error);
  if (!args) throw std::runtime_error(error);
  // a checkpoint must hash Engram n-grams as it was trained; random weights may keep token ids
  c.options.vocab = cedar::net::make_token_vocab(codec.text_tokenizer(), args->eos_token_id);  // structured output
  if (!cedar::net::attach_engram_token_map(*args, codec.text_tokenizer(), &error) &&
      std::filesystem::is_directory(c.model))
    throw std::runtime_error(error);
  if (auto l = cedar::parse_layout(c.options.layout, *args); !l)
    throw std::runtime_error("--layout " + c.options.layout + ": " + l.error().message);
  // The weights, checked against the config, with progress on stderr.
  auto weights = cedar::cli::load_weights(c.model, *args, c.seed, true, &error);
  if (!weights) throw std::runtime_error(error);
  args->weights_digest = weights->digest();  // a remote shard with other weights is refused
  auto started = [&] {
    if (c.device == cedar::cli::device_kind::cpu) return cedar::engine::start(*args, std::move(weights), c.options);
    // GPU: one shard under one scheduler; its KV lives in device memory, sized from what the
    // weights leave free.
    if (c.batch_invariant) cedar::cli::set_gpu_batch_invariant(*c.batch_invariant);
    if (c.options.layout != "tp1") return start_gpu_layout(c, *args, std::move(weights));
    auto gpu = cedar::cli::make_gpu_step_model(*args, std::move(weights),
                                               c.options.kv_fp8 ? cedar::kv_dtype::fp8 : cedar::kv_dtype::fp4,
                                               c.options.page_tokens, c.kernels, c.dense_bf16, true, &error);
    if (!gpu) throw std::runtime_error(error);
    cedar::engine_options options = c.options;
    const int64_t reserve = cedar::gpu_step_reserve_bytes(*args, options.max_batched_tokens);
    const auto budget = cedar::cli::gpu_kv_budget(gpu->layout(), c.gpu_memory_fraction,
                                                  c.kv_budget_given ? options.kv_budget_bytes : 0,
                                                  options.max_num_seqs, reserve, true, &error);
    if (!budget) throw std::runtime_error(error);
    options.kv_budget_bytes = *budget;
    return cedar::engine::start(std::move(gpu), options);
  }();
  if (!started) throw std::runtime_error(started.error().message);
  if (const int port = started.value()->shard_port(); port > 0)
    std::fprintf(stderr, "cedar serve: shards join at %s:%d (cedar shard --connect %s:%d)\n",
                 c.options.shard_host.c_str(), port, c.options.shard_host.c_str(), port);
  // A directory's own name, however it was written ("ckpt/", "./ckpt/.", ".").
  std::error_code ec;
  std::filesystem::path model_path = std::filesystem::path(c.model).lexically_normal();
  if (std::filesystem::is_directory(model_path, ec)) model_path = std::filesystem::weakly_canonical(model_path, ec);
  if (!model_path.has_filename()) model_path = model_path.parent_path();
  std::string name = model_path.filename().string();
  if (name.empty() || name.find(".json") != std::string::npos) name = "model";
  const bool cuda = c.device == cedar::cli::device_kind::cuda;
  const std::string variant = c.batch_invariant == false ? ", batch-invariant off" : "";
  std::string layout = (cuda && c.options.layout != "tp1" ? std::string("rank r on device r, ")
                                                       : std::string()) +
                       std::string(!cuda ? ""
                                   : c.kernels == cedar::gpu_kernels::exact ? "cuda (exact kernels), "
                                   : c.dense_bf16 ? "cuda (fast kernels, dense bf16 kept" + variant + "), "
                                                  : "cuda (fast kernels" + variant + "), ") +
                       "KV " + (c.options.kv_fp8 ? "fp8" : "fp4") + ", " +
                       std::to_string(c.options.max_batched_tokens) + "-token steps, " +
                       std::to_string(args->num_hidden_layers) + " layers, hidden " +
                       std::to_string(args->hidden_size) +
                       (args->engram_token_map ? ", Engram over the tokenizer's " +
                                                     std::to_string(args->engram_compressed_vocab_size) + " classes"
                                               : std::string());
  return cedar::net::make_runtime_bridge(std::move(started.value()), name, layout, c.options.page_tokens);
}

void print_help(FILE* out) {
  cedar::net::serve_options d;
  std::fprintf(out,
      "usage: cedar serve [options]\n\n"
      "Serves the OpenAI API (chat completions, completions, responses incl. WebSocket mode),\n"
      "/health, /metrics and a chat page at /. With no --model: the embedded tiny preset with\n"
      "random weights from a fixed seed, on 127.0.0.1:8000.\n\n"
      "model:\n"
      "  --model NAME                   a checkpoint directory (config.json, *.safetensors and, when\n"
      "                                 present, tokenizer.json); a preset with random weights:\n"
      "                                 tiny (default) | micro | bench-40L-E64 | deepseek-v4.1-flash;\n"
      "                                 a CONFIG.json (random weights); or null, which returns a\n"
      "                                 fixed token at once (measures streaming cost)\n"
      "  --seed N                       random-weight seed for presets (default 1234)\n"
      "  --device cpu|cuda              where the model runs (default cpu). cuda: weights and KV on the\n"
      "                                 GPU; --layout tpN|depN with N > 1: rank r on device r (fast\n"
      "                                 kernels), each device's KV budget half of what one shard gets,\n"
      "                                 so that a live switch (tpN <-> depN) can hold both layouts' KV\n"
      "  --gpu-memory-fraction F        --device cuda: the share of the device memory left free by the\n"
      "                                 weights and a step's activations (estimated from the model\n"
      "                                 and --max-batched-tokens) that the KV takes (default 0.9);\n"
      "                                 --kv-budget-bytes, when given, sets it instead\n"
      "  --gpu-kernels exact|fast       --device cuda: fast runs the tensor-core kernels, within stated\n"
      "                                 bounds of the CPU model (default); exact gives the CPU's bits\n"
      "  --gpu-dense-bf16               --device cuda, fast kernels: also keep the dense FP8 linears as\n"
      "                                 bf16 on the device (twice their bytes again, taken from the KV),\n"
      "                                 so steps of more than 64 rows skip dequantizing them each call\n"
      "  --gpu-batch-invariant on|off   --device cuda, fast kernels: on (default), a request gets the\n"
      "                                 same bits in any step of up to 8 rows; off trades that for\n"
      "                                 faster decode at 1-2 rows ($CEDAR_GPU_BATCH_INVARIANT=0 too)\n"
      "  --served-model-name NAME       the model id clients use (default: the model's name)\n"
      "  --tokenizer PATH               tokenizer.json (default: the checkpoint directory's own, else\n"
      "                                 $CEDAR_TOKENIZER, else the bundled copy)\n"
      "  --null-step-us N               null model: microseconds between steps (default 1000; 0 = no wait)\n"
      "  --null-output TEXT             null model: answer with the tokens of TEXT, then EOS (default: the\n"
      "                                 token \" hi\" until max_tokens); drives the output parser in tests\n"
      "  --null-load-ms N               null model: take N ms to load (default 0); drives the start-up\n"
      "                                 window in tests\n"
      "  --null-fail-after N            null model: fail each request with an engine error after N\n"
      "                                 tokens (default 0 = never); drives the error paths in tests\n"
      "server:\n"
      "  --host ADDR                    listen address (default %s)\n"
      "  --port N                       listen port, 0 = any free port (default %d)\n"
      "  --threads N                    I/O threads (default %d)\n"
      "  --api-key KEY                  require 'Authorization: Bearer KEY' on /v1/* (default: none;\n"
      "                                 also read from $CEDAR_API_KEY; a WebSocket upgrade may pass\n"
      "                                 ?api_key=KEY instead, as browsers cannot set its headers)\n"
      "  --admin-key KEY                enable /admin/* with this bearer key: GET /admin/state (load,\n"
      "                                 KV capacity, draining), GET /admin/status (layout, shards),\n"
      "                                 POST /admin/layout {\"layout\":\"dep2\"} (default: off, 404)\n"
      "  --max-body-bytes N             request body limit, 413 beyond (default %lld)\n"
      "  --max-header-bytes N           request header limit, 431 beyond (default %lld)\n"
      "  --max-ws-message-bytes N       WebSocket message limit, close 1009 beyond (default %lld)\n"
      "  --max-queued-bytes N           unsent output per connection before it is dropped (default %lld)\n"
      "  --max-connections N            open connections; more are refused (default %d)\n"
      "  --max-active N                 generations in flight; more get 429 (default %d)\n"
      "  --idle-timeout-s N             keep-alive / header read / WebSocket idle timeout (default %d)\n"
      "  --write-timeout-s N            a write stalled this long closes the connection (default %d)\n"
      "  --drain-timeout-s N            on SIGTERM, wait this long for running requests (default %d)\n"
      "  --default-max-tokens N         max_tokens of a chat or Responses request that gives none\n"
      "                                 (default %d; /v1/completions keeps OpenAI's 16)\n"
      "  --max-stored-responses N       Responses turns kept for previous_response_id (default %d)\n"
      "  --max-stored-mib N             and the memory they may take; each holds its whole chain's\n"
      "                                 text and token ids (default %lld)\n"
      "  --log-format kv|json           request log format on stderr (default kv)\n"
      "  --no-request-log               do not log one line per request\n"
      "engine:\n%s",
      d.host.c_str(), d.port, d.num_threads, (long long)d.max_body_bytes, (long long)d.max_header_bytes,
      (long long)d.max_ws_message_bytes, (long long)d.max_queued_bytes, d.max_connections,
      d.max_active_generations, d.idle_timeout_s, d.write_timeout_s, d.drain_timeout_s,
      d.default_max_tokens, d.max_stored_responses, (long long)d.max_stored_mib,
      cedar::engine_options::help().c_str());
}

int serve_main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (auto& a : args)
    if (a == "--help" || a == "-h") { print_help(stdout); return 0; }
  auto parsed = cedar::parse_engine_options(args);
  std::vector<std::string> errors = parsed.errors;  // validated as they were parsed
  cedar::net::serve_options o;
  model_choice engine;
  engine.options = parsed.options;
  engine.kv_budget_given = parsed.given.count("--kv-budget-bytes") > 0;
  if (const char* key = std::getenv("CEDAR_API_KEY")) o.api_key = key;
  auto& rest = parsed.rest;
  for (size_t i = 0; i < rest.size(); ++i) {
    std::string flag = rest[i], value;
    bool has_value = false;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1); flag.resize(eq); has_value = true;
    }
    auto next = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= rest.size()) { errors.push_back(flag + " needs a value"); return false; }
      value = rest[++i];
      return true;
    };
    // lo: the least value that still serves (a limit of 0 would refuse every request)
    auto number = [&](auto& field, long long lo = 0) {
      using T = std::remove_reference_t<decltype(field)>;
      if (next() && !cedar::cli::read_integer(value, field, lo))
        errors.push_back(flag + ": not an integer in [" + std::to_string(lo) + ", " +
                         std::to_string(std::numeric_limits<T>::max()) + "]: " + value);
    };
    // a switch takes no value: "--gpu-dense-bf16=off" is refused, not read as on
    if (flag == "--no-request-log" || flag == "--gpu-dense-bf16") {
      if (has_value) errors.push_back(flag + " takes no value (given " + value + ")");
      else if (flag == "--no-request-log") o.log_requests = false;
      else engine.dense_bf16 = true;
    }
    else if (flag == "--gpu-batch-invariant") {
      if (next()) {
        if (bool on = true; cedar::parse_on_off(value, on)) engine.batch_invariant = on;
        else errors.push_back("--gpu-batch-invariant: on or off, not " + value);
      }
    }
    else if (flag == "--model") { if (next()) engine.model = value; }
    else if (flag == "--seed") number(engine.seed);
    else if (flag == "--device") {
      if (next()) {
        if (auto d = cedar::cli::parse_device(value)) engine.device = *d;
        else errors.push_back("--device: cpu or cuda, not " + value);
      }
    }
    else if (flag == "--gpu-kernels") {
      if (next()) {
        if (auto k = cedar::cli::parse_gpu_kernels(value)) engine.kernels = *k;
        else errors.push_back("--gpu-kernels: exact or fast, not " + value);
      }
    }
    else if (flag == "--gpu-memory-fraction") {
      if (next()) {
        char* end = nullptr;
        const double f = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != 0 || !(f > 0 && f <= 1))
          errors.push_back("--gpu-memory-fraction: a number in (0, 1], not " + value);
        else
          engine.gpu_memory_fraction = f;
      }
    }
    else if (flag == "--served-model-name") { if (next()) o.served_model_name = value; }
    else if (flag == "--tokenizer") { if (next()) o.tokenizer_path = value; }
    else if (flag == "--null-step-us") number(engine.null_step_us);
    else if (flag == "--null-output") { if (next()) engine.null_output = value; }
    else if (flag == "--null-fail-after") number(engine.null_fail_after);
    else if (flag == "--null-load-ms") number(engine.null_load_ms);
    else if (flag == "--host") { if (next()) o.host = value; }
    else if (flag == "--port") number(o.port);
    else if (flag == "--threads") number(o.num_threads, 1);
    else if (flag == "--api-key") { if (next()) o.api_key = value; }
    else if (flag == "--admin-key") { if (next()) o.admin_key = value; }
    else if (flag == "--max-body-bytes") number(o.max_body_bytes, 1024);
    else if (flag == "--max-header-bytes") number(o.max_header_bytes, 1024);
    else if (flag == "--max-ws-message-bytes") number(o.max_ws_message_bytes, 1024);
    else if (flag == "--max-queued-bytes") number(o.max_queued_bytes, 65536);
    else if (flag == "--max-connections") number(o.max_connections, 1);
    else if (flag == "--max-active") number(o.max_active_generations, 1);
    else if (flag == "--idle-timeout-s") number(o.idle_timeout_s, 1);
    else if (flag == "--write-timeout-s") number(o.write_timeout_s, 1);
    else if (flag == "--drain-timeout-s") number(o.drain_timeout_s);
    else if (flag == "--default-max-tokens") number(o.default_max_tokens, 1);
    else if (flag == "--max-stored-responses") number(o.max_stored_responses);
    else if (flag == "--max-stored-mib") number(o.max_stored_mib);
    else if (flag == "--log-format") {
      if (next()) {
        if (value == "json") o.log_json = true;
        else if (value != "kv") errors.push_back("--log-format: kv or json, not " + value);
      }
    } else errors.push_back("unknown option " + flag);
  }
  if (engine.model != "null")  // the name now, the model's shape once its config is read (before the weights)
    if (auto l = cedar::parse_layout_name(engine.options.layout); !l) errors.push_back("--layout: " + l.error().message);
  if (engine.dense_bf16 && (engine.device != cedar::cli::device_kind::cuda || engine.kernels != cedar::gpu_kernels::fast))
    errors.push_back("--gpu-dense-bf16 needs --device cuda and --gpu-kernels fast");
  if (engine.batch_invariant == false &&
      (engine.device != cedar::cli::device_kind::cuda || engine.kernels != cedar::gpu_kernels::fast))
    errors.push_back("--gpu-batch-invariant off needs --device cuda and --gpu-kernels fast");
  if (engine.device == cedar::cli::device_kind::cuda) {
    if (std::string why = cedar::cli::device_unavailable(engine.device); !why.empty()) errors.push_back(why);
    if (engine.model == "null") errors.push_back("--device cuda: the null model has no device");
    if (engine.options.shard_port >= 0) errors.push_back("--device cuda: shards run in this process (no --shard-port)");
    // the GPU defaults for what the command line left out (a chunk no larger than a step)
    auto& eo = engine.options;
    if (!parsed.given.count("--max-batched-tokens")) eo.max_batched_tokens = cedar::engine_options::gpu_step_tokens;
    if (!parsed.given.count("--max-prefill-chunk"))
      eo.max_prefill_tokens_per_request = std::min(cedar::engine_options::gpu_step_tokens, eo.max_batched_tokens);
  }
  if (o.port > 65535) errors.push_back("--port must be below 65536");
  if (o.tokenizer_path.empty() && engine.model != "null")
    o.tokenizer_path = cedar::net::tokenizer::path_for_model(engine.model);
  if (!errors.empty()) {
    for (auto& e : errors) std::fprintf(stderr, "cedar serve: %s\n", e.c_str());
    std::fprintf(stderr, "(cedar serve --help lists the options)\n");
    return 2;
  }
  return cedar::net::run_server(o, [&](const cedar::net::prompt_codec& codec, cedar::runtime_event_log events) {
    return build_engine(engine, codec, std::move(events));
  });
}

}  // namespace

CEDAR_COMMAND("serve", "OpenAI-compatible HTTP + WebSocket server (chat page at /)", serve_main);
