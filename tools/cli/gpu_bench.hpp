// `cedar gpu-bench`: what its files share. gpu_bench.cpp is the command (options, load,
// ceilings, phase order), gpu_bench_phases.cpp runs the phases through a shard the way the
// serving scheduler drives it (chunked prefill, decoder truncation, a prefix hit with bounded
// replay, decode on synthetic KV), gpu_bench_kv.cpp fills synthetic KV with well-formed records
// and measures the device's ceilings, gpu_bench_report.cpp prints the table and writes the JSON.
// One thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/shard.hpp"
#include "config/engine_options.hpp"
#include "kernels/model/shard_plan.hpp"
#include "tools/cli/device_model.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/roofline.hpp"

namespace cedar::cli::gpu_bench {

struct options {
  std::string model = default_model;
  uint64_t seed = default_seed;
  device_kind device = device_kind::cpu;
  gpu_kernels kernels = gpu_kernels::fast;
  bool dense_bf16 = false;  ///< --gpu-dense-bf16: the GPU model keeps bf16 copies of its dense linears
  std::optional<bool> batch_invariant;  ///< --gpu-batch-invariant (absent: the process default)
  kv_dtype kv = kv_dtype::fp4;
  int page_tokens = default_page_tokens;  ///< --page-tokens: positions per KV page
  /// Any of floor (the decode floor and FLOPs from the inventory alone: no model is loaded),
  /// decode, prefill, truncation, prefix, generate; they run in that order.
  std::vector<std::string> phases = {"decode", "prefill", "truncation", "prefix", "generate"};
  std::vector<int> batches = {1, 64, 256};        ///< decode batch sizes
  int64_t context = 8192;                         ///< decode: cached tokens per request
  std::vector<int64_t> prefills = {8192, 32768};  ///< prefill and truncation prompt lengths
  int chunk = 0;  ///< prefill tokens per step; 0: serving's default on the device (resolved by parse)
  int steps = 16;                                 ///< timed decode steps per batch size
  float temperature = 0;                          ///< decode: 0 greedy; > 0 sampled (top-k off)
  float top_p = 1;                                ///< decode, sampled: the top-p cut (1 = off)
  int logprobs = 0;  ///< decode: the first request of each step asks for this many top logprobs
  int warmup_steps = 2;                           ///< untimed decode steps first
  int64_t prefix_tokens = 32768;                  ///< prefix phase: cached prefix (whole pages)
  int new_tokens = 200;                           ///< prefix phase: new tokens of the turn
  int64_t gen_prompt = 32768;                     ///< generate phase: prompt tokens
  int gen_tokens = 256;                           ///< generate phase: generated tokens
  bool truncate = true;  ///< decoder truncation in the prefix and generate phases (serving's default)
  std::string out;       ///< JSON path ("" = none)
  bool progress = false;  ///< progress lines on stderr (parse: on when stderr is a terminal)
  /// --layout tpN / depN (N > 1): the decode phase on N devices, rank r on device r.
  parallel_mode layout_mode = parallel_mode::tp;
  int layout_size = 1;
};

/// The device's own ceilings, measured in the same run (zero on the CPU).
struct ceilings {
  std::string device;
  double copy_gbps = 0;    ///< device-to-device copy of 1 GiB, read + write bytes per second
  double blas_tflops = 0;  ///< cuBLASLt 8192 x 8192 x 8192
  std::string blas_dtype;  ///< "fp8" (e4m3 inputs) or "bf16" when FP8 is not offered
};

struct decode_result {
  int batch = 0;
  int64_t context = 0;
  int steps = 0;
  double fill_s = 0;        ///< writing the synthetic KV
  double step_ms = 0;       ///< mean over the timed steps
  double min_step_ms = 0;
  double tok_s = 0;         ///< batch / step time
  double experts_touched = 0;  ///< expected distinct routed experts per layer (not observed)
  std::vector<step_bytes_part> parts;
  double floor_bytes = 0;
  double floor_ms = 0;      ///< floor_bytes at the measured copy rate
  double floor_fraction = 0;  ///< floor_ms / step_ms
};

struct prefill_result {
  int64_t tokens = 0;
  bool truncated = false;
  int chunk = 0;
  double seconds = 0;
  double tok_s = 0;
  std::vector<int64_t> rows_per_layer;  ///< rows each layer ran (decoder truncation drops some)
  int64_t rows_total = 0;
  double linear_flops = 0;  ///< from rows_per_layer and the inventory
  double tflops = 0;        ///< linear_flops / seconds
  double blas_fraction = 0;
};

struct truncation_result {
  prefill_result full, truncated;
  double speedup = 0;  ///< full.seconds / truncated.seconds
};

struct prefix_result {
  int64_t prefix_tokens = 0, new_tokens = 0, replay_tokens = 0;
  bool truncated = false;
  double cold_ttft_s = 0;  ///< prefill of the whole prefix + new tokens
  double replay_s = 0;     ///< the replay call (rings and tails rebuilt, pages reused)
  double new_s = 0;        ///< the new tokens' call (first token's logits)
  double hit_ttft_s = 0;   ///< replay_s + new_s
  double speedup = 0;      ///< cold / hit
  bool first_token_equal = false;  ///< greedy: the hit's first token is the cold prefill's
};

struct generate_result {
  int64_t prompt_tokens = 0;
  int gen_tokens = 0;
  bool truncated = false;
  double load_s = 0;
  double prefill_s = 0, prefill_tok_s = 0;
  double decode_s = 0, decode_tok_s = 0;  ///< gen_tokens - 1 steps (greedy, batch 1)
};

struct report {
  options opts;
  std::string device;
  double load_s = 0;
  ceilings ceil;
  double linear_flops_per_token = 0;  ///< every layer, no truncation, head excluded
  std::vector<decode_result> floor;   ///< floor phase: bytes only, nothing timed
  std::vector<decode_result> decode;
  std::vector<prefill_result> prefill;
  std::vector<truncation_result> truncation;
  std::vector<prefix_result> prefix;
  std::vector<generate_result> generate;
};

/// A request as the bench's scheduler keeps it: its pages and ring slot in the shard's arena
/// (never reused, so every slot starts zeroed), its tokens, how many the KV holds.
struct bench_request {
  uint64_t id = 0;
  std::vector<int32_t> page_ids;
  int32_t slot = -1;
  std::vector<int32_t> tokens;  ///< prompt, then every generated token
  int64_t num_computed = 0;     ///< positions in the KV
  int64_t num_generated = 0;
};

/// KV a run of `o` needs in one shard: pages and ring slots for every request of every phase.
kv_capacity bench_capacity(const options& o, const kv_layout& layout);

/// Runs the phases through one shard (actors/shard.hpp: the serving runtime's step, the
/// model's own KV arena, sampling where the model samples); prefill runs are kept so that a
/// later phase asking for the same prompt length and truncation reuses them.
class runner {
 public:
  /// `cap`: the capacity the shard's arena was made with (bench_capacity).
  runner(shard& s, const kv_capacity& cap, const options& o, const ceilings& c);
  decode_result decode(int batch);
  /// The decode phase in parts, for layouts that step several runners at once: requests
  /// [first, first + count) of a decode batch (each one's tokens and synthetic KV depend on its
  /// index alone, so every rank that holds request b holds the same one), then one greedy step of
  /// them (their tokens appended).
  std::vector<bench_request> decode_requests(int first, int count);
  void decode_step(std::vector<bench_request>& reqs);
  prefill_result prefill(int64_t tokens, bool truncate);
  truncation_result truncation(int64_t tokens);
  prefix_result prefix();
  generate_result generate(double load_s);

 private:
  struct prefill_run {
    bench_request req;
    int32_t first_token = -1;
    prefill_result result;
  };
  prefill_run& prefill_cached(int64_t tokens, bool truncate);
  /// A request with `tokens` and room for max_tokens positions (pages and a slot taken now).
  bench_request new_request(std::vector<int32_t> tokens, int64_t max_tokens);
  /// The scheduler's item for positions [req.num_computed, end_pos) (make_item's fields).
  step_item make_item(const bench_request& req, int64_t end_pos, bool sample, int64_t truncate_below) const;
  /// Runs one step on the shard; throws when the step fails.
  step_output run(std::vector<step_item> items);

  shard& shard_;
  const model_args& args_;
  const kv_layout& layout_;
  kv_capacity cap_;
  options o_;
  ceilings ceil_;
  linear_flops flops_;
  int32_t next_page_ = 0, next_slot_ = 0;
  uint64_t next_id_ = 1, next_step_ = 1;
  std::map<std::pair<int64_t, bool>, prefill_run> runs_;
};

/// Random tokens in [3, vocab) from `seed` (ids 0-2 are BOS, EOS and padding).
std::vector<int32_t> random_tokens(int64_t n, int vocab, uint64_t seed);

/// Fills requests' KV for positions [0, context) in `arena` with random well-formed records
/// (pages: compressed latents and index keys of every source; each layer's SWA ring; finite
/// compressor tails). first_index: the decode batch index of requests[0] (the records depend on
/// the index). A device arena is filled on the calling thread's current device.
void fill_synthetic_kv(const kv_layout& layout, kv_arena& arena, const std::vector<bench_request>& requests,
                       int64_t context, uint64_t seed, int first_index = 0);

/// A decode result's floor: the step's bytes (from the inventory), at the measured copy rate
/// of `devices` devices together.
void finish_decode_result(decode_result& r, const model_args& args, const kv_layout& layout, const ceilings& c,
                          int devices);

/// `cedar gpu-bench --layout`: the decode phase of every batch size on N devices
/// (gpu_bench_layout.cpp), into r.decode; r.load_s is set. Returns an error, or "".
std::string run_layout_decode(report& r, const model_args& args);

/// The device's copy and cuBLASLt rates (empty on the CPU or in a build without CUDA).
ceilings measure_ceilings(device_kind device);

void print_table(const report& r);
/// Writes every figure as JSON; false (and a message on stderr) when the file cannot be written.
bool write_json(const report& r, const std::string& path);

}  // namespace cedar::cli::gpu_bench
