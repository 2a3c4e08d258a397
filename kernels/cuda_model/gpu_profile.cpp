// The GPU model's phase profile (gpu_forward.hpp, phase_profile): wall time per phase of the
// forward calls when $CEDAR_GPU_PROFILE is set, synchronized around each phase, printed when the
// model is destroyed. The forward call's thread.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda_model/gpu_forward.hpp"

namespace cedar {

namespace gpu_detail {

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

phase_profile::phase_profile() {
  const char* env = std::getenv("CEDAR_GPU_PROFILE");
  on_ = env != nullptr && std::string(env) != "0" && std::string(env) != "";
  if (const char* w = std::getenv("CEDAR_CUDA_PROFILER_CALLS")) {
    long long a = 0, b = 0;
    if (std::sscanf(w, "%lld..%lld", &a, &b) == 2 && a >= 1 && b >= a) window_first_ = a, window_last_ = b;
    else std::fprintf(stderr, "cedar: CEDAR_CUDA_PROFILER_CALLS='%s' is not A..B (1 <= A <= B); ignored\n", w);
  }
}

void phase_profile::begin_call(bool decode, int rows) {
  key_ = {decode ? 0 : 1, rows};
  if (++call_ == window_first_) cuda::profiler_start();
}

void phase_profile::count_call() {
  if (on_) ++by_call_[key_].calls;
  if (call_ == window_last_) {
    cuda::synchronize();
    cuda::profiler_stop();
  }
}

phase_profile::~phase_profile() {
  static const char* names[num_phases] = {"embed",  "engram", "mhc",     "attn_proj", "compressor", "indexer",
                                          "attend", "out_proj", "route", "experts",   "head"};
  for (const auto& [key, t] : by_call_) {
    if (t.calls == 0) continue;
    double total = 0;
    for (double v : t.ms) total += v;
    std::fprintf(stderr, "cedar: GPU phases of %lld %s calls of %d rows, ms per call (synchronized), total %.3f:",
                 static_cast<long long>(t.calls), key.first == 0 ? "decode" : "prefill", key.second,
                 total / double(t.calls));
    for (int p = 0; p < num_phases; ++p)
      std::fprintf(stderr, " %s %.3f (%.0f%%)", names[p], t.ms[p] / double(t.calls),
                   100.0 * t.ms[p] / std::max(total, 1e-9));
    std::fprintf(stderr, "\n");
  }
}

phase_profile::scope::scope(phase_profile& prof, phase p) : prof_(prof), p_(p) {
  if (!prof_.on_) return;
  cuda::synchronize();
  t0_ = now_ms();
}

phase_profile::scope::~scope() {
  if (!prof_.on_) return;
  cuda::synchronize();
  prof_.by_call_[prof_.key_].ms[p_] += now_ms() - t0_;
}

}  // namespace gpu_detail

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
