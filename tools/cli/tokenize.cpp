// `cedar tokenize` and `cedar detokenize`: text <-> ids with a tokenizer.json, for scripts and
// the tokenizer corpus test (tests/integration/tokenizer_corpus.sh).
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "net/py_json.hpp"
#include "net/tokenizer.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/registry.hpp"

namespace {

struct tok_args {
  std::string path = cedar::net::tokenizer::default_path();
  std::string text, jsonl, ids, ids_jsonl;
  bool has_text = false, bos = false, v41 = false, json_out = false, no_added = false, bench = false;
};

void usage_tokenize(FILE* out) {
  std::fprintf(out,
               "usage: cedar tokenize [--tokenizer PATH] (--text T | --jsonl FILE) [--bos] [--v41] [--no-added]\n"
               "  prints the ids as a JSON array; with --jsonl each line of FILE is a JSON string and\n"
               "  each output line the array of its ids (no BOS).\n"
               "  --v41: serve-time table (the file's BPE with DeepSeek-V4.1's added tokens)\n"
               "  --no-added: do not match added tokens in the text\n"
               "  --bench (with --jsonl): print encode throughput instead of ids (best of 3 rounds)\n"
               "  default tokenizer: $CEDAR_TOKENIZER or the npm DeepSeek-V3 tokenizer.json\n");
}

void usage_detokenize(FILE* out) {
  std::fprintf(out,
               "usage: cedar detokenize [--tokenizer PATH] (--ids 1,2,3 | --ids-jsonl FILE) [--v41] [--json]\n"
               "  prints the decoded text (--json: as a JSON string); with --ids-jsonl each line of FILE\n"
               "  is a JSON array of ids and each output line the JSON string it decodes to\n");
}

/// Empty when the arguments are taken; otherwise why not, naming the flag. `encode`: tokenize's
/// flags, else detokenize's.
std::string parse(cedar::cli::arg_reader& r, bool encode, tok_args* a) {
  while (r.next()) {
    const std::string& k = r.flag();
    if (k == "--tokenizer") r.value(a->path);
    else if (k == "--v41") a->v41 = true;
    else if (encode && k == "--text") a->has_text = r.value(a->text);
    else if (encode && k == "--jsonl") r.value(a->jsonl);
    else if (encode && k == "--bos") a->bos = true;
    else if (encode && k == "--no-added") a->no_added = true;
    else if (encode && k == "--bench") a->bench = true;
    else if (!encode && k == "--ids") r.value(a->ids);
    else if (!encode && k == "--ids-jsonl") r.value(a->ids_jsonl);
    else if (!encode && k == "--json") a->json_out = true;
    else r.unknown();
  }
  if (r.help() || !r.error().empty()) return r.error();
  if (encode && a->has_text && !a->jsonl.empty()) return "give --text or --jsonl, not both";
  if (encode && !a->has_text && a->jsonl.empty()) return "--text or --jsonl is required";
  if (encode && a->bench && a->jsonl.empty()) return "--bench needs --jsonl";
  if (!encode && !a->ids.empty() && !a->ids_jsonl.empty()) return "give --ids or --ids-jsonl, not both";
  if (!encode && a->ids.empty() && a->ids_jsonl.empty()) return "--ids or --ids-jsonl is required";
  return "";
}

std::unique_ptr<cedar::net::tokenizer> open_tokenizer(const tok_args& a) {
  std::string error;
  auto tok = a.v41 ? cedar::net::tokenizer::load_dsv41(a.path, &error) : cedar::net::tokenizer::load(a.path, &error);
  if (!tok) std::fprintf(stderr, "cedar: %s\n", error.c_str());
  return tok;
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string line = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ',';
    line += std::to_string(ids[i]);
  }
  line += "]\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
}

int run_jsonl(const cedar::net::tokenizer& tok, const tok_args& a) {
  std::ifstream in(a.jsonl, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cedar: cannot read '%s'\n", a.jsonl.c_str());
    return 1;
  }
  simdjson::dom::parser parser;
  std::string line;
  int num_errors = 0;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    std::string_view text;
    std::string error;
    if (parser.parse(line).get(text)) {
      std::fprintf(stderr, "cedar: %s:%zu: not a JSON string\n", a.jsonl.c_str(), line_no);
      std::fputs("null\n", stdout);
      ++num_errors;
      continue;
    }
    auto ids = tok.try_encode(text, false, &error, !a.no_added);
    if (!ids) {
      std::fprintf(stderr, "cedar: %s:%zu: %s\n", a.jsonl.c_str(), line_no, error.c_str());
      std::fputs("null\n", stdout);
      ++num_errors;
      continue;
    }
    print_ids(*ids);
  }
  return num_errors ? 1 : 0;
}

int run_bench(const cedar::net::tokenizer& tok, const tok_args& a) {
  std::ifstream in(a.jsonl, std::ios::binary);
  simdjson::dom::parser parser;
  std::vector<std::string> texts;
  size_t num_bytes = 0;
  for (std::string line; std::getline(in, line);) {
    std::string_view text;
    if (parser.parse(line).get(text)) continue;
    texts.emplace_back(text);
    num_bytes += text.size();
  }
  size_t num_ids = 0;
  for (auto& t : texts) num_ids += tok.encode(t, false).size();  // warm-up, as the reference does
  double best_s = 1e30;
  for (int round = 0; round < 3; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    for (auto& t : texts) num_ids += tok.encode(t, false).size();
    best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("{\"strings\": %zu, \"bytes\": %zu, \"seconds\": %.6f, \"mb_per_s\": %.3f}\n", texts.size(), num_bytes,
              best_s, static_cast<double>(num_bytes) / best_s / 1e6);
  return num_ids ? 0 : 1;
}

int tokenize_main(int argc, char** argv) {
  tok_args a;
  cedar::cli::arg_reader reader(argc, argv);
  const std::string refused = parse(reader, true, &a);
  if (reader.help()) return usage_tokenize(stdout), 0;
  if (!refused.empty()) return cedar::cli::refuse("tokenize", refused, usage_tokenize);
  auto tok = open_tokenizer(a);
  if (!tok) return 1;
  if (!a.jsonl.empty()) return a.bench ? run_bench(*tok, a) : run_jsonl(*tok, a);
  std::string error;
  auto ids = tok->try_encode(a.text, a.bos, &error, !a.no_added);
  if (!ids) {
    std::fprintf(stderr, "cedar: %s\n", error.c_str());
    return 1;
  }
  print_ids(*ids);
  return 0;
}

int run_ids_jsonl(const cedar::net::tokenizer& tok, const tok_args& a) {
  std::ifstream in(a.ids_jsonl, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cedar: cannot read '%s'\n", a.ids_jsonl.c_str());
    return 1;
  }
  simdjson::dom::parser parser;
  std::string line;
  int num_errors = 0;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    simdjson::dom::array arr;
    std::vector<int32_t> ids;
    bool ok = !parser.parse(line).get(arr);
    for (auto v : ok ? arr : simdjson::dom::array()) {
      int64_t id;
      ok = ok && !v.get(id) && id >= 0 && id < tok.vocab_size();
      if (ok) ids.push_back(static_cast<int32_t>(id));
    }
    std::string out;
    if (ok) {
      cedar::net::append_python_json_string(&out, tok.decode(ids));
    } else {
      std::fprintf(stderr, "cedar: %s:%zu: not an array of ids\n", a.ids_jsonl.c_str(), line_no);
      out = "null";
      ++num_errors;
    }
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return num_errors ? 1 : 0;
}

int detokenize_main(int argc, char** argv) {
  tok_args a;
  cedar::cli::arg_reader reader(argc, argv);
  const std::string refused = parse(reader, false, &a);
  if (reader.help()) return usage_detokenize(stdout), 0;
  if (!refused.empty()) return cedar::cli::refuse("detokenize", refused, usage_detokenize);
  if (!a.ids_jsonl.empty()) {
    auto tok = open_tokenizer(a);
    return tok ? run_ids_jsonl(*tok, a) : 1;
  }
  std::vector<int32_t> ids;
  for (const char* p = a.ids.c_str(); *p;) {
    char* end = nullptr;
    long v = std::strtol(p, &end, 10);
    if (end == p || v < 0 || v > INT32_MAX) {
      std::fprintf(stderr, "cedar: --ids must be comma-separated non-negative integers\n");
      return 2;
    }
    ids.push_back(static_cast<int32_t>(v));
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') {
      std::fprintf(stderr, "cedar: --ids must be comma-separated non-negative integers\n");
      return 2;
    }
  }
  auto tok = open_tokenizer(a);
  if (!tok) return 1;
  for (int32_t id : ids)
    if (id >= tok->vocab_size()) {
      std::fprintf(stderr, "cedar: id %d is outside the vocabulary (size %d)\n", id, tok->vocab_size());
      return 1;
    }
  std::string text = tok->decode(ids);
  if (a.json_out) {
    std::string out;
    cedar::net::append_python_json_string(&out, text);
    text = out;
  }
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

CEDAR_COMMAND("tokenize", "text to token ids with a tokenizer.json", tokenize_main);
CEDAR_COMMAND("detokenize", "token ids to text", detokenize_main);
