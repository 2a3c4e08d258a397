// Replay planning: after a prefix-cache hit of H tokens the request's global KV for [0, H) is
// in cached pages, but its SWA rings and ratio-2 compressor tails are not (they are never
// cached). The replay scheduler decides whether to take the hit and which positions to run
// again in replay mode (rings/tails rebuilt, cached pages untouched). Plain C++.
#pragma once

#include <cstdint>

#include "config/engine_options.hpp"

namespace cedar {

struct replay_plan {
  int64_t cached_tokens = 0;   ///< hit adopted (0 = recompute from the start)
  int64_t replay_from = 0;     ///< replay positions [replay_from, cached_tokens)
  int64_t replay_tokens() const { return cached_tokens - replay_from; }
};

/// For a page-aligned hit of `hit_tokens`, a window of `window` and `num_layers` layers:
/// bounded: replay [H - W, H); a hit no longer than the window is not taken (replaying it
///   would cost as much as computing it).
/// full: replay [H - W - L*(W-1), H) rounded down to an even position (clipped at 0), the
///   rows every layer's ring at [H - W, H) depends on, so the rebuilt rings are exact.
replay_plan plan_replay(int64_t hit_tokens, int window, int num_layers, swa_replay_mode mode);

}  // namespace cedar
