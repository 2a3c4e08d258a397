// The checkpoint's tensor inventory: for a model_args, every tensor the forward pass binds,
// with its real checkpoint name, dtype and shape (spec §4.2, §4.3). The safetensors loader
// checks a checkpoint against it, the random-checkpoint generator fills it, `cedar info`
// counts parameters from it. DSpark (`mtp.*`) and vision tensors are not listed; a checkpoint
// that has them still passes check_tensors (extra tensors are ignored, but for layers the
// config does not have and Engram tables of layers it does not give Engram).
//
// Naming and dtypes (kept stable; the model binds by these names):
//   embed.weight, head.weight                         BF16 [vocab, dim]
//   norm.weight and every `*norm.weight`              BF16 [n]   (attn_norm, ffn_norm, attn.q_norm,
//                                                      attn.kv_norm, attn.compressor.norm, attn.indexer.k_norm)
//   layers.L.hc_{attn,ffn}_{fn,base,scale}            F32 [24, 4*dim], [24], [3]  (no .weight suffix)
//   layers.L.attn.attn_sink                           F32 [heads]
//   FP8 linears X: X.weight F8_E4M3 [out, in], X.scale F8_E8M0 [ceil(out/32), ceil(in/32)]
//     attn.wq_a, attn.wq_b, attn.wkv, attn.wo_a, attn.wo_b, attn.indexer.wq_b,
//     ffn.shared_experts.w{1,2,3}, engram.wkv
//     (wo_a stays FP8 here as in the real files; the model dequantizes it to bf16 at load)
//   FP4 experts: ffn.experts.E.w{1,2,3}.weight I8 [out, in/2] (packed E2M1, low nibble = even
//     column), .scale F8_E8M0 [out, in/32]
//   BF16 linears: attn.compressor.{wkv,wgate}.weight, attn.indexer.{wk,weights_proj}.weight,
//     ffn.gate.weight
//   ffn.gate.bias, ffn.gate.bias_vl                   F32 [experts]
//   engram.embed.weight F8_E4M3 [rows, engram_head_dim], engram.embed.scale F8_E8M0
//     [rows, engram_head_dim/32], engram.q_weight / engram.k_weight F32 [hc_mult, dim]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_args.hpp"
#include "kernels/checkpoint/tensor_map.hpp"

namespace cedar {

/// What a tensor is for: lets the random generator pick a distribution and `cedar info`
/// count parameters without parsing names.
enum class tensor_role : uint8_t {
  embedding,      ///< bf16 [vocab, dim] token embedding
  head,           ///< bf16 [vocab, dim] output projection
  norm,           ///< bf16 RMSNorm weight
  hc_fn,          ///< f32 [24, hc*dim] mHC mixing projection
  hc_base,        ///< f32 [24]
  hc_scale,       ///< f32 [3]
  attn_sink,      ///< f32 [heads]
  fp8_weight,     ///< e4m3 [out, in]
  fp8_scale,      ///< e8m0 [ceil(out/32), ceil(in/32)]
  fp4_weight,     ///< i8 [out, in/2] packed e2m1 (routed experts)
  fp4_scale,      ///< e8m0 [out, in/32]
  bf16_linear,    ///< bf16 [out, in]
  gate_bias,      ///< f32 [experts]
  engram_table,   ///< e4m3 [rows, engram_head_dim]
  engram_scale,   ///< e8m0 [rows, engram_head_dim/32]
  engram_qk,      ///< f32 [hc_mult, dim]
};

/// One expected tensor.
struct tensor_spec {
  std::string name;
  st_dtype dtype = st_dtype::f32;
  std::vector<int64_t> shape;
  tensor_role role = tensor_role::norm;
  int layer_idx = -1;   ///< -1 for embed / norm / head
  int expert_idx = -1;  ///< routed expert index, -1 otherwise
  /// True for a linear that writes into the residual stream (wo_b, expert and shared w2,
  /// engram.wkv): the random generator keeps their outputs small.
  bool residual_out = false;

  int64_t num_elements() const;
  std::size_t num_bytes() const;
  /// Logical parameters: elements, x2 for packed FP4, 0 for scale tensors.
  int64_t num_params() const;
};

/// Every tensor the forward pass needs, in a fixed order (embed, layers 0.., norm, head).
/// `args` must have its layer map derived.
std::vector<tensor_spec> model_inventory(const model_args& args);

/// One line per problem: a missing tensor, a wrong dtype or a wrong shape, each naming the
/// tensor with expected vs found; tensors of layers past num_hidden_layers, and Engram tensors
/// of a layer not in engram_layer_ids (a config that would serve a different model). Empty
/// when `weights` holds everything (other extra tensors, such as mtp.* and vision.*, are
/// allowed).
std::vector<std::string> check_tensors(const model_args& args, const tensor_map& weights);

/// The first `shown` problems, each on its own indented line, then "... and N more".
std::string list_problems(const std::vector<std::string>& problems, std::size_t shown = 8);

/// "[a, b, c]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace cedar
