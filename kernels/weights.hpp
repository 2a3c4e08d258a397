// Non-owning views of weight tensors in the checkpoint formats (spec §4.2). The bytes live in
// a memory-mapped safetensors file or in a host buffer owned by the model's weights struct.
#pragma once

#include <cstdint>

namespace cedar {

/// Dense FP8 weight: y = W x with W [out, in] E4M3 and one UE8M0 scale per 32x32 tile.
struct fp8_weight {
  int out = 0, in = 0;
  const uint8_t* data = nullptr;   // [out, in] e4m3
  const uint8_t* scale = nullptr;  // [ceil(out/32), ceil(in/32)] ue8m0
  /// Optional: the same values as bf16 [out, in] (exact: e4m3 times a UE8M0 scale is a bf16
  /// value), kept on the device by the GPU model so that many-row products skip dequantizing.
  const uint16_t* bf16 = nullptr;
};

/// Routed-expert FP4 weight: W [out, in] packed E2M1 (low nibble = even column) with one
/// UE8M0 scale per 32 columns of each row.
struct fp4_weight {
  int out = 0, in = 0;
  const uint8_t* data = nullptr;   // [out, in/2] packed e2m1
  const uint8_t* scale = nullptr;  // [out, in/32] ue8m0
};

/// BF16 weight [out, in].
struct bf16_weight {
  int out = 0, in = 0;
  const uint16_t* data = nullptr;  // [out, in] bf16
};

}  // namespace cedar
