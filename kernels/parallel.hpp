// A process-wide pool of worker threads and parallel_for, used by every CPU op to spread rows
// (or output columns) over all cores. Work is split into disjoint chunks; each index is handled
// by exactly one thread, so an op whose per-index work has a fixed order is deterministic.
// Thread count: CEDAR_THREADS if set, else std::thread::hardware_concurrency().
#pragma once

#include <cstdint>
#include <type_traits>

namespace cedar {

/// Threads that take part in a parallel_for (the calling thread included).
int num_threads();

/// Type-erased core of parallel_for: calls call(ctx, lo, hi) on disjoint chunks of at most
/// `grain` indices covering [begin, end), on the pool's threads and the caller's.
/// Blocks until every chunk is done. Calls from inside a chunk run inline (no nesting);
/// calls from several outside threads at once take turns.
void parallel_run(int64_t begin, int64_t end, int64_t grain,
                  void (*call)(void* ctx, int64_t lo, int64_t hi), void* ctx);

/// fn(lo, hi) for disjoint chunks of [begin, end) of at most `grain` indices each
/// (grain <= 0: about four chunks per thread).
template <class Fn>
void parallel_for_chunks(int64_t begin, int64_t end, int64_t grain, Fn&& fn) {
  using F = std::remove_reference_t<Fn>;
  parallel_run(begin, end, grain,
               [](void* ctx, int64_t lo, int64_t hi) { (*static_cast<F*>(ctx))(lo, hi); },
               const_cast<void*>(static_cast<const void*>(&fn)));
}

/// fn(i) for every i in [begin, end), each i on exactly one thread.
template <class Fn>
void parallel_for(int64_t begin, int64_t end, Fn&& fn) {
  parallel_for_chunks(begin, end, 0, [&fn](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) fn(i);
  });
}

}  // namespace cedar
