// The order in which both samplers (actors/sampler.cpp on the host, kernels/cuda/sampling.cu on
// the device) add up a row's terms, so that both get the same bits and the device can add in
// parallel: the terms are cut into chunks of `chunk`, each chunk is summed from 0 in index order,
// and the chunk sums are added in chunk order. The running sum at term i is the sum of the
// chunks before i's plus i's chunk summed up to i. Header-only, host code.
#pragma once

#include <algorithm>
#include <cstddef>

namespace cedar::sampling_order {

inline constexpr int chunk = 256;

/// The chunk starting at c (of n terms) summed from 0 in index order.
template <class Term>
double chunk_sum(std::size_t c, std::size_t n, Term& term) {
  double part = 0;
  for (std::size_t i = c, end = std::min(n, c + chunk); i < end; ++i) part += term(i);
  return part;
}

/// Sum of term(i) for i in [0, n).
template <class Term>
double sum(std::size_t n, Term term) {
  double total = 0;
  for (std::size_t c = 0; c < n; c += chunk) total += chunk_sum(c, n, term);
  return total;
}

/// The first i in [0, n) whose running sum satisfies stop (a predicate that, once true, stays
/// true as the sum grows); n if none does.
template <class Term, class Stop>
std::size_t find(std::size_t n, Term term, Stop stop) {
  double prefix = 0;
  for (std::size_t c = 0; c < n; c += chunk) {
    const std::size_t end = std::min(n, c + chunk);
    const double part = chunk_sum(c, n, term);
    if (!stop(prefix + part)) {
      prefix += part;
      continue;
    }
    double within = 0;  // at end - 1 this is `part` again, so the walk below always stops
    for (std::size_t i = c; i < end; ++i)
      if (stop(prefix + (within += term(i)))) return i;
  }
  return n;
}

}  // namespace cedar::sampling_order
