// Bounded and full (exact) SWA replay windows (see replay.hpp).
#include "actors/replay.hpp"

#include <algorithm>

namespace cedar {

replay_plan plan_replay(int64_t hit_tokens, int window, int num_layers, swa_replay_mode mode) {
  replay_plan r;
  if (hit_tokens <= window) return r;
  r.cached_tokens = hit_tokens;
  if (mode == swa_replay_mode::bounded) {
    r.replay_from = hit_tokens - window;
  } else {
    const int64_t halo = int64_t(window) + int64_t(num_layers) * (window - 1);
    r.replay_from = std::max<int64_t>(0, hit_tokens - halo);
  }
  r.replay_from -= r.replay_from % 2;  // the ratio-2 tail is empty at an even position
  return r;
}

}  // namespace cedar
