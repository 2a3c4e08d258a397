// `cedar info`: what a model costs: parameters (total, backbone, Engram, active per prompt and
// per generated token), KV bytes (global per token, SWA per request, page), checkpoint bytes.
// For a checkpoint directory it also checks the tensors against the inventory and builds the
// Engram token map from its tokenizer. The Engram hash inputs are printed either way.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "config/model_config.hpp"
#include "kernels/checkpoint/safetensors.hpp"
#include "kernels/model/inventory.hpp"
#include "kernels/model/kv_layout.hpp"
#include "kernels/model/param_count.hpp"
#include "kernels/model/weights.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace {

using namespace cedar;

struct model_info {
  param_counts params;
  kv_layout kv_fp4, kv_fp8;
  uint64_t checkpoint_bytes = 0;
  int checkpoint_tensors = -1;  ///< -1: not a checkpoint directory
  std::vector<std::string> problems;
  std::vector<cpu::engram_hash_params> engram;  ///< one per Engram layer, in engram_layer_ids order
  int engram_classes = 0;                        ///< compressed ids in the token map (0: none)
};

model_info gather(const model_args& a, const std::string& source) {
  model_info m;
  m.params = count_params(a);
  m.kv_fp4 = kv_layout::make(a, kv_dtype::fp4);
  m.kv_fp8 = kv_layout::make(a, kv_dtype::fp8);
  for (const tensor_spec& s : model_inventory(a)) m.checkpoint_bytes += s.num_bytes();
  if (!a.engram_layer_ids.empty()) m.engram = cpu::engram_default_params(model_detail::engram_hash_config_of(a));
  if (a.engram_token_map && !a.engram_token_map->empty())
    m.engram_classes = *std::max_element(a.engram_token_map->begin(), a.engram_token_map->end()) + 1;
  if (std::filesystem::is_directory(source)) {
    tensor_map weights;
    std::string error;
    if (!read_safetensors(source, weights, &error)) m.problems.push_back(error);
    else m.problems = check_tensors(a, weights);
    m.checkpoint_tensors = int(weights.tensors.size());
  }
  return m;
}

std::string billions(int64_t n) {
  char buf[32];
  if (n >= 10000000000) std::snprintf(buf, sizeof buf, "%.1fB", n / 1e9);
  else if (n >= 1000000000) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  return buf;
}

void print_text(const std::string& source, const model_args& a, const model_info& m) {
  const param_counts& p = m.params;
  std::printf("model            %s (%d layers, %d routed experts top-%d, dim %d, vocab %d)\n", source.c_str(),
              a.num_hidden_layers, a.n_routed_experts, a.num_experts_per_tok, a.hidden_size, a.vocab_size);
  std::printf("parameters       total %s = backbone %s + Engram tables %s (DSpark and vision not counted)\n",
              billions(p.total).c_str(), billions(p.backbone).c_str(), billions(p.engram_tables).c_str());
  std::printf("                 routed experts %s, embed %s, head %s\n", billions(p.routed_experts).c_str(),
              billions(p.embed).c_str(), billions(p.head).c_str());
  std::printf("active/token     prompt %s: layers 0-%d (later layers run only the last %d rows at prefill)\n",
              billions(p.active_per_prompt_token).c_str(), a.truncate_from_layer - 1, a.sliding_window);
  std::printf("                 generated %s: all %d layers + head; a layer is %s on average\n",
              billions(p.active_per_generated_token).c_str(), a.num_hidden_layers,
              billions(p.active_per_layer_mean).c_str());
  std::printf("                 (a layer: dense tensors + shared expert + %d routed experts; the embedding is a lookup)\n"
              "                 Engram adds %s per prompt token, %s per generated token (projection + %d rows)\n",
              a.num_experts_per_tok, billions(p.engram_active_per_prompt_token).c_str(),
              billions(p.engram_active_per_token).c_str(), a.engram_rows_per_token());
  if (!m.engram.empty()) {
    if (m.engram_classes)
      std::printf("Engram hash      token map of %d classes from the tokenizer (pad token %d -> %d)\n",
                  m.engram_classes, a.engram_pad_token_id, m.engram[0].pad_id);
    else
      std::printf("Engram hash      token ids as they are (no token map: random weights only; pad %d)\n", m.engram[0].pad_id);
    for (std::size_t i = 0; i < m.engram.size(); ++i) {
      const auto& e = m.engram[i];
      std::printf("                 layer %d: multipliers", a.engram_layer_ids[i]);
      for (int k = 0; k < e.max_ngram; ++k) std::printf(" %lld", (long long)e.multipliers[k]);
      std::printf(", %lld rows\n", (long long)cpu::engram_table_rows(e));
    }
  }
  std::printf("global KV        %.0f B/token (FP4), %.0f B/token (FP8); page of %d tokens = %zu B (FP4)\n",
              m.kv_fp4.bytes_per_token(), m.kv_fp8.bytes_per_token(), m.kv_fp4.page_tokens, m.kv_fp4.page_bytes);
  std::printf("SWA ring         %zu B per request (%d layers x %d x %zu B); compressor tails %zu B\n",
              m.kv_fp4.ring_bytes(), m.kv_fp4.num_layers, m.kv_fp4.window, m.kv_fp4.swa_record_bytes,
              m.kv_fp4.tail_floats() * sizeof(float));
  std::printf("checkpoint       %.2f GiB in the real formats\n", double(m.checkpoint_bytes) / (1ull << 30));
  if (m.checkpoint_tensors >= 0)
    std::printf("tensors          %d on disk, %s\n", m.checkpoint_tensors,
                m.problems.empty() ? "all inventory tensors present and well-formed" : "PROBLEMS:");
  for (const std::string& problem : m.problems) std::printf("  %s\n", problem.c_str());
}

void print_json(const std::string& source, const model_args& a, const model_info& m) {
  const param_counts& p = m.params;
  std::printf("{\"model\": \"%s\", \"num_layers\": %d, \"params\": {\"total\": %lld, \"backbone\": %lld, "
              "\"engram_tables\": %lld, \"routed_experts\": %lld, \"embed\": %lld, \"head\": %lld, "
              "\"active_per_prompt_token\": %lld, \"active_per_generated_token\": %lld, "
              "\"engram_active_per_prompt_token\": %lld, \"engram_active_per_generated_token\": %lld}, "
              "\"kv\": {\"global_bytes_per_token\": %.1f, \"global_bytes_per_token_fp8\": %.1f, \"page_tokens\": %d, "
              "\"page_bytes\": %zu, \"swa_bytes_per_request\": %zu}, \"checkpoint_bytes\": %llu",
              source.c_str(), a.num_hidden_layers, (long long)p.total, (long long)p.backbone,
              (long long)p.engram_tables, (long long)p.routed_experts, (long long)p.embed, (long long)p.head,
              (long long)p.active_per_prompt_token, (long long)p.active_per_generated_token,
              (long long)p.engram_active_per_prompt_token, (long long)p.engram_active_per_token,
              m.kv_fp4.bytes_per_token(), m.kv_fp8.bytes_per_token(), m.kv_fp4.page_tokens, m.kv_fp4.page_bytes,
              m.kv_fp4.ring_bytes(), (unsigned long long)m.checkpoint_bytes);
  if (m.checkpoint_tensors >= 0)
    std::printf(", \"checkpoint_tensors\": %d, \"checkpoint_problems\": %zu", m.checkpoint_tensors, m.problems.size());
  if (!m.engram.empty()) {
    std::printf(", \"engram\": {\"token_map_classes\": ");
    if (m.engram_classes) std::printf("%d", m.engram_classes);
    else std::printf("null");
    std::printf(", \"pad_compressed_id\": %d, \"layers\": [", m.engram[0].pad_id);
    for (std::size_t i = 0; i < m.engram.size(); ++i) {
      const auto& e = m.engram[i];
      std::printf("%s{\"layer\": %d, \"rows\": %lld, \"multipliers\": [", i ? ", " : "", a.engram_layer_ids[i],
                  (long long)cpu::engram_table_rows(e));
      for (int k = 0; k < e.max_ngram; ++k) std::printf("%s%lld", k ? ", " : "", (long long)e.multipliers[k]);
      std::printf("]}");
    }
    std::printf("]}");
  }
  std::printf("}\n");
}

int info_main(int argc, char** argv) {
  std::string source = "deepseek-v4.1-flash";
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) source = argv[++i];
    else if (a == "--json") json = true;
    else {
      std::fprintf(a == "--help" || a == "-h" ? stdout : stderr,
                   "usage: cedar info [--model DIR|PRESET|CONFIG.json] [--json]\n"
                   "  parameter counts, KV bytes, checkpoint size and the Engram hash (token map, multipliers)\n"
                   "  (default model: deepseek-v4.1-flash)\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  std::string error;
  auto args = cli::load_serving_args(source, &error);
  if (!args) return std::fprintf(stderr, "cedar info: %s\n", error.c_str()), 1;
  const model_info m = gather(*args, source);
  json ? print_json(source, *args, m) : print_text(source, *args, m);
  return m.problems.empty() ? 0 : 1;
}

}  // namespace

CEDAR_COMMAND("info", "parameter counts, KV bytes and checkpoint size of a model", info_main);
