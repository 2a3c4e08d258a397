// `cedar bench`: agentic load generator for any OpenAI-compatible server (trace replay, sweep over
// concurrency), and `cedar bench compare` for A/B at an interactivity bound. Parses options only;
// the work is in tools/bench/.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tools/bench/bench_run.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/registry.hpp"

namespace {

using namespace cedar::bench;
using cedar::cli::read_integer;
using cedar::cli::read_number;

constexpr const char* kUsage =
    "usage: cedar bench --url URL --out DIR [options]\n"
    "       cedar bench compare --out DIR A_DIR B_DIR [--bound TOK_S_PER_USER]\n\n"
    "  --url URL            server, e.g. http://127.0.0.1:8000 (API under /v1)\n"
    "  --api-key KEY        bearer token for servers started with an API key\n"
    "  --model NAME         model field of requests (default: the server's first model)\n"
    "  --traces SRC         synthetic | FILE | DIR of Weka JSON traces (default: synthetic)\n"
    "  --sessions N         synthetic sessions to generate (default: 64)\n"
    "  --scale F            scale token counts by F, e.g. 0.01 for CPU runs (default: 1)\n"
    "  --concurrency LIST   the sweep: session lanes per point, e.g. 1,2,4,8 (default: 1,2,4,8;\n"
    "                       --sweep is the same option)\n"
    "  --warmup S           warm-up seconds per point (default: 5)\n"
    "  --duration S         measured seconds per point (default: 30)\n"
    "  --api LIST           chat | responses | ws, or several: one curve each (default: chat)\n"
    "  --label NAME         configuration name in reports (default: the API)\n"
    "  --think-scale F      multiply recorded think times by F (default: 1)\n"
    "  --max-think S        cap one think time at S seconds (default: 10)\n"
    "  --max-context N      end a session before a request over N tokens (default: none)\n"
    "  --timeout S          per-request timeout (default: 600)\n"
    "  --seed N             session markers, start points, synthetic traces (default: 1)\n"
    "  --no-random-start    start every session at its first turn\n"
    "  --metrics-path P     Prometheus endpoint for the prefix-cache hit rate (default: /metrics)\n";

bool parse_list(const char* text, std::vector<std::string>& out) {
  std::string s = text;
  out.clear();
  for (size_t start = 0; start <= s.size();) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return !out.empty();
}

bool parse_bench_args(int argc, char** argv, bench_options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--no-random-start") {
      o.random_start = false;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    std::vector<std::string> items;
    if (arg == "--url") o.url = v;
    else if (arg == "--api-key") o.api_key = v;
    else if (arg == "--model") o.model = v;
    else if (arg == "--traces") o.traces = v;
    else if (arg == "--sessions" && read_integer(v, o.num_synthetic_sessions, 1)) {}
    else if (arg == "--scale" && read_number(v, o.scale, 1e-9)) {}
    else if (arg == "--warmup" && read_number(v, o.warmup_s, 0)) {}
    else if (arg == "--duration" && read_number(v, o.duration_s, 1e-9)) {}
    else if (arg == "--label") o.label = v;
    else if (arg == "--out") o.out_dir = v;
    else if (arg == "--think-scale" && read_number(v, o.think_scale, 0)) {}
    else if (arg == "--max-think" && read_number(v, o.max_think_s, 0)) {}
    else if (arg == "--max-context" && read_integer(v, o.max_context_tokens, 0)) {}
    else if (arg == "--timeout" && read_number(v, o.request_timeout_s, 1e-9)) {}
    else if (arg == "--seed" && read_integer(v, o.seed)) {}
    else if (arg == "--metrics-path") o.metrics_path = v;
    else if ((arg == "--concurrency" || arg == "--sweep") && parse_list(v, items)) {
      o.concurrency.clear();
      for (auto& c : items)
        if (int n = 0; read_integer(c, n, 1)) o.concurrency.push_back(n);
        else return false;
    } else if (arg == "--api" && parse_list(v, items)) {
      o.apis.clear();
      for (auto& a : items)
        if (auto api = parse_api(a)) o.apis.push_back(*api);
        else return false;
    } else {
      return false;
    }
  }
  return !o.url.empty() && !o.out_dir.empty() && o.scale > 0 && o.duration_s > 0 &&
         o.num_synthetic_sessions > 0;
}

bool parse_compare_args(int argc, char** argv, compare_options& o) {
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--out" || arg == "--bound") && i + 1 < argc) {
      const char* v = argv[++i];
      if (arg == "--out") o.out_dir = v;
      else o.bound = std::atof(v);
    } else if (arg.rfind("--", 0) == 0) {
      return false;
    } else {
      dirs.push_back(arg);
    }
  }
  if (dirs.size() != 2 || o.out_dir.empty()) return false;
  o.a_dir = dirs[0];
  o.b_dir = dirs[1];
  return true;
}

int bench_command(int argc, char** argv) {
  if (argc > 1 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc > 1 && !std::strcmp(argv[1], "compare")) {
    compare_options o;
    if (!parse_compare_args(argc - 1, argv + 1, o)) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    return run_compare(o);
  }
  bench_options o;
  if (!parse_bench_args(argc, argv, o)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  return run_bench(o);
}

}  // namespace

CEDAR_COMMAND("bench", "agentic trace-replay benchmark against an OpenAI-compatible server",
              bench_command);
