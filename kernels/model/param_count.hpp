// Parameter counts of a model, from its tensor inventory (scales are not parameters; a packed
// FP4 byte holds two). "Active" counts what one token multiplies through (spec §2.6): per layer
// every dense tensor, the shared expert and num_experts_per_tok routed experts; the embedding
// is a lookup, not counted. A prompt token runs layers [0, truncate_from_layer) (the decoder
// layers after the cut run only the last window at prefill); a generated token runs every
// layer and the head. Engram (projection + the rows a token gathers) is counted apart, as the
// spec's 7.9B / 15.7B leave it out.
#pragma once

#include <cstdint>

#include "config/model_args.hpp"

namespace cedar {

struct param_counts {
  int64_t total = 0;             ///< every inventory tensor (no DSpark, no vision)
  int64_t engram_tables = 0;     ///< engram.embed rows
  int64_t backbone = 0;          ///< total - engram_tables (the "552B" of the real model)
  int64_t embed = 0, head = 0;
  int64_t routed_experts = 0;    ///< all routed expert weights
  int64_t active_per_prompt_token = 0;     ///< without Engram
  int64_t active_per_generated_token = 0;  ///< without Engram
  int64_t active_per_layer_mean = 0;       ///< mean over layers of one layer's (without Engram)
  int64_t engram_active_per_token = 0;     ///< Engram projections + gathered rows, all Engram layers
  int64_t engram_active_per_prompt_token = 0;  ///< the part on layers below truncate_from_layer
};

/// Counts for `args` (layer map derived).
param_counts count_params(const model_args& args);

}  // namespace cedar
