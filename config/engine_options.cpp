// Parses and validates engine options (see engine_options.hpp).
#include "config/engine_options.hpp"

#include <charconv>
#include <functional>
#include <map>

namespace cedar {

bool parse_on_off(const std::string& v, bool& out) {
  if (v == "on" || v == "true" || v == "1") return out = true, true;
  if (v == "off" || v == "false" || v == "0") return out = false, true;
  return false;
}

namespace {

using setter = std::function<bool(engine_options&, const std::string&)>;

template <class T>
bool parse_int(const std::string& v, T& out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && p == v.data() + v.size();
}

const std::map<std::string, setter>& setters() {
  static const std::map<std::string, setter> table = {
      {"--prefix-cache", [](engine_options& o, const std::string& v) { return parse_on_off(v, o.prefix_cache); }},
      {"--decoder-truncation",
       [](engine_options& o, const std::string& v) { return parse_on_off(v, o.decoder_truncation); }},
      {"--swa-replay",
       [](engine_options& o, const std::string& v) {
         if (v == "bounded") return o.swa_replay = swa_replay_mode::bounded, true;
         if (v == "full") return o.swa_replay = swa_replay_mode::full, true;
         return false;
       }},
      {"--kv-dtype",
       [](engine_options& o, const std::string& v) {
         if (v == "fp4") return o.kv_fp8 = false, true;
         if (v == "fp8") return o.kv_fp8 = true, true;
         return false;
       }},
      {"--max-num-seqs", [](engine_options& o, const std::string& v) { return parse_int(v, o.max_num_seqs); }},
      {"--max-batched-tokens",
       [](engine_options& o, const std::string& v) { return parse_int(v, o.max_batched_tokens); }},
      {"--max-prefill-chunk",
       [](engine_options& o, const std::string& v) { return parse_int(v, o.max_prefill_tokens_per_request); }},
      {"--kv-budget-bytes", [](engine_options& o, const std::string& v) { return parse_int(v, o.kv_budget_bytes); }},
      {"--page-tokens", [](engine_options& o, const std::string& v) { return parse_int(v, o.page_tokens); }},
      {"--step-timeout-ms", [](engine_options& o, const std::string& v) { return parse_int(v, o.step_timeout_ms); }},
      {"--layout", [](engine_options& o, const std::string& v) { return o.layout = v, !v.empty(); }},
      {"--shard-port", [](engine_options& o, const std::string& v) { return parse_int(v, o.shard_port); }},
      {"--shard-host", [](engine_options& o, const std::string& v) { return o.shard_host = v, !v.empty(); }},
  };
  return table;
}

}  // namespace

std::string engine_options::help() {
  return "  --prefix-cache on|off          reuse global KV of earlier prompts (default on)\n"
         "  --swa-replay bounded|full      rebuild SWA rings after a hit from the last window only\n"
         "                                 (bounded, default) or exactly from a layer-deep halo (full)\n"
         "  --decoder-truncation on|off    run decoder layers only on each prompt's last window (default on)\n"
         "  --kv-dtype fp4|fp8             global KV storage (default fp4: 890 B/token real config)\n"
         "  --max-num-seqs N               running requests at once (default 64)\n"
         "  --max-batched-tokens N         tokens per step (default 2048; 8192 with --device cuda)\n"
         "  --max-prefill-chunk N          prefill tokens of one request per step (default 512; 8192\n"
         "                                 with --device cuda)\n"
         "  --kv-budget-bytes N            memory for KV pages, SWA rings and tails, per shard (default\n"
         "                                 1 GiB). CPU shards take it from host memory: a layout whose\n"
         "                                 shards would need more than the host has is refused, and so\n"
         "                                 is a switch (both layouts' arenas exist while it runs)\n"
         "  --page-tokens N                token positions per KV page (default 64)\n"
         "  --step-timeout-ms N            fail a step whose shard reply is later (default 60000)\n"
         "  --layout tpN|depN              shards: TP-N splits heads and experts, DEP-N runs N\n"
         "                                 schedulers with experts split (default tp1; switchable live).\n"
         "                                 CPU: any N; --device cuda: rank r on device r, and a live\n"
         "                                 switch only between tpN and depN of the same N\n"
         "  --shard-port N                 accept a shard process (cedar shard --connect) on port N\n"
         "                                 (0: any free one, printed at start); a tp1 layout then runs\n"
         "                                 on it (default off). A shard sees every prompt: the port\n"
         "                                 has no key, so keep it on a trusted network\n"
         "  --shard-host ADDR              the address the shard port listens on (default 127.0.0.1;\n"
         "                                 0.0.0.0 for shards on other machines)\n";
}

engine_options_parse parse_engine_options(const std::vector<std::string>& args, engine_options defaults) {
  engine_options_parse r;
  r.options = defaults;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const auto eq = flag.find('=');
    if (eq != std::string::npos) value = flag.substr(eq + 1), flag.resize(eq);
    auto it = setters().find(flag);
    if (it == setters().end()) {
      r.rest.push_back(args[i]);
      continue;
    }
    if (eq == std::string::npos) {
      if (i + 1 >= args.size()) {
        r.errors.push_back(flag + ": missing value");
        continue;
      }
      value = args[++i];
    }
    if (!it->second(r.options, value)) r.errors.push_back(flag + ": bad value '" + value + "'");
    r.given.insert(flag);
  }
  for (auto& e : validate(r.options)) r.errors.push_back(e);
  return r;
}

std::vector<std::string> validate(const engine_options& o) {
  std::vector<std::string> errors;
  if (o.max_num_seqs < 1) errors.push_back("--max-num-seqs must be >= 1");
  if (o.max_batched_tokens < 1) errors.push_back("--max-batched-tokens must be >= 1");
  if (o.max_prefill_tokens_per_request < 1) errors.push_back("--max-prefill-chunk must be >= 1");
  if (o.kv_budget_bytes < 1) errors.push_back("--kv-budget-bytes must be >= 1");
  if (o.page_tokens < 2 || o.page_tokens % 2) errors.push_back("--page-tokens must be even and >= 2");
  if (o.step_timeout_ms < 1) errors.push_back("--step-timeout-ms must be >= 1");
  if (o.shard_port < -1 || o.shard_port > 65535) errors.push_back("--shard-port must be -1 (off) or 0..65535");
  return errors;
}

}  // namespace cedar
