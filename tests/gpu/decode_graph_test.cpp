// Decode steps under CUDA graphs (fast kernel set: MoE halves, and whole layers that neither
// compress nor index): a model with graphs gives the same logits, bit for bit, as the same model
// with graphs off ($CEDAR_GPU_GRAPHS=0), over enough steps that every layer's graph is run
// eagerly, captured and replayed, for two batch sizes; a prefill between decode steps leaves the
// replays correct, and so does a page table that outgrows its array; and so do three prefills
// with decoder truncation, whose truncated layers run the window's row count under graphs; all
// of it again with the routed experts on the wgmma kernel, and with the MoE halves alone graphed
// ($CEDAR_GPU_LAYER_GRAPHS=0). And the captures' scratch buffer (kernels/cuda/runtime.cu): a
// graph's scratch stays its own, valid after the thread that captured it ends, and is freed with
// the last graph that uses it. Also the queries rotated as the attention loads them
// (tuning::attention_rotates_q), eagerly and under graphs, against the kv chain's rotation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "config/model_config.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#include "kernels/model/random_weights.hpp"
#include "tests/gpu/gpu_test_util.hpp"

using namespace cedar;
using namespace cedar::gpu_test;

namespace {

/// Runs prompts then `steps` greedy decode steps (batch = all requests), with two more
/// requests prefilled midway; returns every logit row of every call, in order.
std::vector<float> run(const gpu_model& m, int steps) {
  gpu_kv_arena arena(m.layout(), 0.02);
  std::vector<std::vector<int32_t>> seqs = {{5, 9, 13, 200, 7}, {42, 43}, {1000, 3, 3, 3, 9}};
  std::vector<request_kv> kvs;
  for (size_t i = 0; i < seqs.size(); ++i) kvs.push_back(*arena.allocate(128));
  std::vector<int64_t> truncate_below(seqs.size(), -1);  // a request's, on each of its calls
  std::vector<float> all, logits;
  const int vocab = m.args().vocab_size;
  const auto step = [&](std::vector<size_t> which, bool prefill) {
    std::vector<forward_item> batch(which.size());
    for (size_t j = 0; j < which.size(); ++j) {
      auto& s = seqs[which[j]];
      batch[j].kv = &kvs[which[j]];
      const size_t done = size_t(kvs[which[j]].num_tokens);
      batch[j].history = std::span<const int32_t>(s).first(done);
      batch[j].tokens = prefill ? std::span<const int32_t>(s).subspan(done) : std::span<const int32_t>(s).last(1);
      batch[j].truncate_below = truncate_below[which[j]];
    }
    logits.clear();
    m.forward(batch, logits);
    all.insert(all.end(), logits.begin(), logits.end());
    for (size_t j = 0; j < which.size(); ++j) {
      const float* row = logits.data() + j * vocab;
      int32_t best = 0;
      for (int v = 1; v < vocab; ++v) best = row[v] > row[best] ? v : best;
      seqs[which[j]].push_back(best);
    }
  };
  step({0, 1}, true);
  for (int t = 0; t < steps; ++t) step({0, 1}, false);
  step({2}, true);
  for (int t = 0; t < steps; ++t) step({0, 1, 2}, false);
  // two rows again, one of them a request of many more pages: the workspace's page table grows
  // into a new array, and the whole-layer graphs of two rows are captured again over it; its
  // prompt, past the window, is prefilled with decoder truncation, and its decode rows carry
  // the truncation point as the scheduler's do
  std::vector<int32_t> long_prompt;
  for (int t = 0; t < 3 * m.args().sliding_window; ++t) long_prompt.push_back(int32_t(11 + 17 * t % 3000));
  seqs.push_back(long_prompt);
  truncate_below.push_back(int64_t(long_prompt.size()) - m.args().sliding_window);
  kvs.push_back(*arena.allocate(2000));
  step({3}, true);
  for (int t = 0; t < steps; ++t) step({0, 3}, false);
  for (auto& kv : kvs) arena.release(kv);
  // a prompt past the sliding window with decoder truncation, three times (eager, captured,
  // replayed): the truncated layers' window rows run the window's row count's graphs
  std::vector<int32_t> prompt;
  for (int t = 0; t < 3 * m.args().sliding_window - 3; ++t) prompt.push_back(int32_t(7 + 31 * t % 5000));
  for (int rep = 0; rep < 3; ++rep) {
    request_kv kv = *arena.allocate(128);
    std::vector<forward_item> batch(1);
    batch[0].kv = &kv;
    batch[0].tokens = prompt;
    batch[0].truncate_below = int64_t(prompt.size()) - m.args().sliding_window;
    logits.clear();
    m.forward(batch, logits);
    all.insert(all.end(), logits.begin(), logits.end());
    arena.release(kv);
  }
  return all;
}

}  // namespace

TEST_CASE("gpu model: decode steps and truncated layers under CUDA graphs give the logits of eager steps, bit for bit") {
  if (!have_gpu()) return;
  std::string error;
  const auto args = load_model_args("micro", &error);
  REQUIRE_MESSAGE(args.has_value(), error);
  const auto weights = std::make_shared<tensor_map>(make_random_weights(*args, 91));
  ::setenv("CEDAR_GPU_GRAPHS", "0", 1);
  const gpu_model eager(*args, weights, kv_dtype::fp4, {}, gpu_kernels::fast);
  ::unsetenv("CEDAR_GPU_GRAPHS");
  // graphs from one row (the default; set so that the test keeps covering small counts)
  ::setenv("CEDAR_GPU_GRAPHS_FROM", "1", 1);
  ::setenv("CEDAR_GPU_LAYER_GRAPHS", "0", 1);
  const gpu_model moe_graphed(*args, weights, kv_dtype::fp4, {}, gpu_kernels::fast);
  ::unsetenv("CEDAR_GPU_LAYER_GRAPHS");
  const gpu_model graphed(*args, weights, kv_dtype::fp4, {}, gpu_kernels::fast);
  ::unsetenv("CEDAR_GPU_GRAPHS_FROM");
  const auto compare = [&](const char* what, const gpu_model& m) {
    const auto a = run(eager, 4), b = run(m, 4);
    REQUIRE(a.size() == b.size());
    size_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += std::memcmp(&a[i], &b[i], sizeof(float)) == 0;
    std::printf("  decode graphs%s: %zu of %zu logits bit-identical to eager steps\n", what, same, a.size());
    CHECK_MESSAGE(same == a.size(), what);
  };
  compare("", graphed);
  compare(" (MoE halves only)", moe_graphed);
  // the routed experts on the wgmma kernel at every row count (where the device runs it), so
  // that its launches are captured and replayed too
  cuda::fast::tuning& tune = cuda::fast::tuning_now();
  const cuda::fast::tuning saved = tune;
  tune.expert_wg_min_rows = 1;
  compare(" (wgmma experts)", graphed);
  tune = saved;
}

TEST_CASE("gpu model, fast kernels: queries rotated as the attention loads them give the other order's logits") {
  if (!have_gpu()) return;
  std::string error;
  const auto args = load_model_args("micro", &error);
  REQUIRE_MESSAGE(args.has_value(), error);
  const auto weights = std::make_shared<tensor_map>(make_random_weights(*args, 92));
  cuda::fast::tuning& tune = cuda::fast::tuning_now();
  const bool saved = tune.attention_rotates_q;
  // each model captures its graphs under the setting in force for its own runs
  const auto logits = [&](bool rotates_q, bool graphs) {
    if (!graphs) ::setenv("CEDAR_GPU_GRAPHS", "0", 1);
    const gpu_model m(*args, weights, kv_dtype::fp4, {}, gpu_kernels::fast);
    ::unsetenv("CEDAR_GPU_GRAPHS");
    tune.attention_rotates_q = rotates_q;
    auto out = run(m, 4);
    tune.attention_rotates_q = saved;
    return out;
  };
  const auto before = logits(false, false);
  for (const bool graphs : {false, true}) {
    const auto in_attention = logits(true, graphs);
    REQUIRE(in_attention.size() == before.size());
    size_t same = 0;
    for (size_t i = 0; i < before.size(); ++i) same += std::memcmp(&before[i], &in_attention[i], sizeof(float)) == 0;
    std::printf("  queries rotated in the attention%s: %zu of %zu logits bit-identical\n", graphs ? " (graphs)" : "",
                same, before.size());
    CHECK_MESSAGE(same == before.size(), (graphs ? "under graphs" : "eager"));
  }
}

TEST_CASE("graph capture scratch: each graph's own, valid after its capturing thread ends, freed with its graphs") {
  if (!have_gpu()) return;
  constexpr std::size_t n = std::size_t(1) << 20;
  std::vector<void*> outputs = {cuda::device_alloc(n), cuda::device_alloc(n), cuda::device_alloc(n)};
  // a graph that fills capture scratch with `byte`, copies it to `y` and frees it
  const auto capture = [&](int byte, void* y) {
    cuda::graph_capture_begin();
    void* s = cuda::scratch_alloc(n);
    cuda::fill_bytes(s, byte, n);
    cuda::copy_rows_device(y, n, s, n, n, 1);
    cuda::scratch_free(s);
    return cuda::graph_capture_end();
  };
  std::size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  cuda::memory_info(&free0, &total);
  void* elsewhere = nullptr;  // captured on a thread that then ends
  std::thread([&] {
    cuda::set_device(0);
    elsewhere = capture(0x11, outputs[0]);
  }).join();
  void* first = capture(0x22, outputs[1]);
  void* second = capture(0x33, outputs[2]);  // the same thread's buffer as `first`, run after it
  for (int round = 0; round < 2; ++round)
    for (void* g : {elsewhere, first, second, elsewhere}) cuda::graph_launch(g);
  cuda::synchronize();
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> got(n);
    cuda::copy_to_host(got.data(), outputs[i], n);
    const uint8_t want = uint8_t(0x11 * (i + 1));
    CHECK_MESSAGE(std::all_of(got.begin(), got.end(), [&](uint8_t b) { return b == want; }),
                  ("graph " + std::to_string(i)));
  }
  cuda::memory_info(&free1, &total);
  cuda::graph_destroy(elsewhere);  // the ended thread's buffer had this graph alone
  cuda::memory_info(&free2, &total);
  const char* mb = std::getenv("CEDAR_GPU_GRAPH_ARENA_MB");
  if (!mb || std::atoi(mb) > 0) {
    CHECK(free1 < free0);            // two buffers in use
    CHECK(free2 >= free1 + (32u << 20));  // the ended thread's is back
  }
  cuda::graph_destroy(first);
  cuda::graph_destroy(second);
  for (void* p : outputs) cuda::device_free(p);
}
