// The model's side of a roofline, from the tensor inventory (kernels/model/inventory.hpp) and
// the KV layout: the bytes one decode step must read from HBM (the step's floor at a measured
// copy rate) and the linear-layer FLOPs of a row in each layer (prefill's matrix work, next to
// a measured tensor-core rate). Used by `cedar kernel-lab` and `cedar gpu-bench`. Plain C++.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_args.hpp"
#include "kernels/model/kv_layout.hpp"

namespace cedar::cli {

/// One part of a decode step's HBM traffic.
struct step_bytes_part {
  std::string what;
  double bytes = 0;
};

/// Expected distinct routed experts a layer touches when `batch` tokens each pick top-k of E
/// independently and uniformly: E * (1 - (1 - k/E)^batch) (k at batch 1).
double expected_experts_touched(const model_args& a, int batch);

/// Bytes one decode step reads with `batch` requests of `context` cached tokens each: every
/// dense weight once (attn.wo_a as the FP8 it is stored in, the bf16 head), the routed experts
/// expected_experts_touched() picks, and per request one embedding row, the Engram rows it
/// gathers and its KV (each layer's window ring, the top-k compressed records of compressed
/// layers, every index key of the indexer layers). Parts in this order: FP8 linears, wo_a,
/// routed experts, head, bf16 linears, small fp32, gathers, KV.
std::vector<step_bytes_part> decode_step_bytes(const model_args& a, const kv_layout& layout, int64_t context,
                                               int batch);

/// Linear-layer FLOPs (2 per weight element used) of one row.
struct linear_flops {
  std::vector<double> per_layer_row;  ///< [num_hidden_layers]: FP8, bf16, mHC fp32 and the
                                      ///< top-k share of the routed experts
  double head_row = 0;                ///< one row of logits (bf16 head)
};
linear_flops linear_flops_per_row(const model_args& a);

/// FLOPs of a forward call from the rows each layer ran and the rows that returned logits.
double linear_flops_of(const linear_flops& f, const std::vector<int64_t>& rows_per_layer, int64_t logits_rows);

}  // namespace cedar::cli
