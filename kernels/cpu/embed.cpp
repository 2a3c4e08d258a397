// CPU reference embedding lookup (ops.hpp): a bf16 table row per token, widened to fp32.
#include <cstddef>

#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"

namespace cedar::cpu {

void embed(const int32_t* tokens, int m, const bf16_weight& table, float* out) {
  const int d = table.in;
  for (int r = 0; r < m; ++r) {
    CEDAR_OP_CHECK(tokens[r] >= 0 && tokens[r] < table.out, "embed: token id inside the table");
    const uint16_t* row = table.data + std::size_t(tokens[r]) * d;
    for (int i = 0; i < d; ++i) out[std::size_t(r) * d + i] = fmt::bf16_to_f32(row[i]);
  }
}

}  // namespace cedar::cpu
