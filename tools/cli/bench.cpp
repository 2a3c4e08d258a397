// `cedar bench`: agentic load generator for any OpenAI-compatible server (trace replay, sweep over
// concurrency), and `cedar bench compare` for A/B at an interactivity bound. Parses options only;
// the work is in tools/bench/.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tools/bench/bench_run.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/registry.hpp"

namespace {

using namespace cedar::bench;
using cedar::cli::arg_reader;
using cedar::cli::read_integer;
using cedar::cli::read_number;
using cedar::cli::refuse;

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

void usage(FILE* out) { std::fputs(kUsage, out); }

bool parse_list(const std::string& s, std::vector<std::string>& out) {
  out.clear();
  for (size_t start = 0; start <= s.size();) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return !out.empty();
}

bool parse_concurrency(const std::string& text, std::vector<int>& out) {
  std::vector<std::string> items;
  if (!parse_list(text, items)) return false;
  out.clear();
  for (auto& c : items)
    if (int n = 0; read_integer(c, n, 1)) out.push_back(n);
    else return false;
  return true;
}

bool parse_apis(const std::string& text, std::vector<api_kind>& out) {
  std::vector<std::string> items;
  if (!parse_list(text, items)) return false;
  out.clear();
  for (auto& a : items)
    if (auto api = parse_api(a)) out.push_back(*api);
    else return false;
  return true;
}

/// Empty when the arguments are taken; otherwise why not, naming the flag.
std::string parse_bench_args(arg_reader& r, bench_options& o) {
  constexpr double no_limit = std::numeric_limits<double>::max();
  while (r.next()) {
    const std::string& arg = r.flag();
    std::string v;
    if (arg == "--no-random-start") o.random_start = false;
    else if (arg == "--url") r.value(o.url);
    else if (arg == "--api-key") r.value(o.api_key);
    else if (arg == "--model") r.value(o.model);
    else if (arg == "--traces") r.value(o.traces);
    else if (arg == "--sessions") r.integer(o.num_synthetic_sessions, 1);
    else if (arg == "--scale") r.number(o.scale, 1e-9, no_limit, "a number > 0");
    else if (arg == "--warmup") r.number(o.warmup_s, 0, no_limit, "a number >= 0");
    else if (arg == "--duration") r.number(o.duration_s, 1e-9, no_limit, "a number > 0");
    else if (arg == "--label") r.value(o.label);
    else if (arg == "--out") r.value(o.out_dir);
    else if (arg == "--think-scale") r.number(o.think_scale, 0, no_limit, "a number >= 0");
    else if (arg == "--max-think") r.number(o.max_think_s, 0, no_limit, "a number >= 0");
    else if (arg == "--max-context") r.integer(o.max_context_tokens, 0);
    else if (arg == "--timeout") r.number(o.request_timeout_s, 1e-9, no_limit, "a number > 0");
    else if (arg == "--seed") r.integer(o.seed);
    else if (arg == "--metrics-path") r.value(o.metrics_path);
    else if (arg == "--concurrency" || arg == "--sweep") {
      if (r.value(v) && !parse_concurrency(v, o.concurrency)) r.bad_value(v, "a comma-separated list of integers >= 1");
    } else if (arg == "--api") {
      if (r.value(v) && !parse_apis(v, o.apis)) r.bad_value(v, "a comma-separated list of chat, responses, ws");
    } else r.unknown();
  }
  if (r.help() || !r.error().empty()) return r.error();
  if (o.url.empty()) return "--url is required";
  if (o.out_dir.empty()) return "--out is required";
  return "";
}

/// Empty when the arguments are taken; otherwise why not, naming the flag.
std::string parse_compare_args(arg_reader& r, compare_options& o) {
  std::vector<std::string> dirs;
  while (r.next()) {
    const std::string& arg = r.flag();
    double bound = 0;
    if (arg == "--out") r.value(o.out_dir);
    else if (arg == "--bound") {
      r.number(bound, 0, std::numeric_limits<double>::max(), "a number >= 0 (tok/s per user)");
      o.bound = bound;
    } else if (arg.rfind("--", 0) == 0) r.unknown();
    else dirs.push_back(arg);
  }
  if (r.help() || !r.error().empty()) return r.error();
  if (o.out_dir.empty()) return "--out is required";
  if (dirs.size() != 2)
    return "give two result directories, A_DIR and B_DIR (" + std::to_string(dirs.size()) + " given)";
  o.a_dir = dirs[0];
  o.b_dir = dirs[1];
  return "";
}

int bench_command(int argc, char** argv) {
  const bool compare = argc > 1 && !std::strcmp(argv[1], "compare");
  arg_reader reader(argc, argv, compare ? 2 : 1);
  compare_options c;
  bench_options o;
  const std::string refused = compare ? parse_compare_args(reader, c) : parse_bench_args(reader, o);
  if (reader.help()) return usage(stdout), 0;
  if (!refused.empty()) return refuse(compare ? "bench compare" : "bench", refused, usage);
  return compare ? run_compare(c) : run_bench(o);
}

}  // namespace

CEDAR_COMMAND("bench", "agentic trace-replay benchmark against an OpenAI-compatible server",
              bench_command);
