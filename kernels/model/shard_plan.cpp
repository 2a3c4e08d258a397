// Layout checks, rank views and the TP head split (see shard_plan.hpp, shard_forward.hpp).
#include "kernels/model/shard_plan.hpp"

#include "kernels/collectives/communicator.hpp"
#include "kernels/cpu/op_check.hpp"
#include "kernels/model/shard_forward.hpp"

namespace cedar {

std::string check_layout(const model_args& args, parallel_mode mode, int size) {
  if (size < 1) return "a layout needs at least one rank";
  if (mode == parallel_mode::tp) {
    if (args.num_attention_heads % size != 0)
      return "TP-" + std::to_string(size) + " does not divide the " + std::to_string(args.num_attention_heads) +
             " query heads";
    if (args.head_dim % 32 != 0) return "TP needs head_dim to be a multiple of 32 (FP8 scale tiles)";
  } else if (size > args.n_routed_experts) {
    return "DEP-" + std::to_string(size) + " has more ranks than the " + std::to_string(args.n_routed_experts) +
           " experts";
  }
  return {};
}

shard_view make_shard_view(const model_args& args, parallel_mode mode, int rank, int size, communicator* comm) {
  CEDAR_OP_CHECK(check_layout(args, mode, size).empty(), "a valid layout");
  CEDAR_OP_CHECK(rank >= 0 && rank < size, "rank within the layout");
  CEDAR_OP_CHECK(size == 1 || (comm != nullptr && comm->size() == size && comm->rank() == rank),
                 "a communicator of the layout's size and this rank");
  shard_view v;
  v.mode = mode;
  v.rank = rank;
  v.size = size;
  v.comm = comm;
  const int per_rank = mode == parallel_mode::tp ? args.num_attention_heads / size : args.num_attention_heads;
  v.head_begin = mode == parallel_mode::tp ? rank * per_rank : 0;
  v.head_end = v.head_begin + per_rank;
  return v;
}

namespace model_detail {

fp8_weight head_rows(const fp8_weight& w, int h0, int nh, int dh) {
  CEDAR_OP_CHECK(dh % 32 == 0 && (h0 + nh) * dh <= w.out, "head rows inside the weight");
  const std::size_t scale_cols = std::size_t(w.in + 31) / 32;
  fp8_weight v = w;
  v.out = nh * dh;
  v.data = w.data + std::size_t(h0) * dh * w.in;
  v.scale = w.scale + std::size_t(h0) * dh / 32 * scale_cols;
  if (w.bf16) v.bf16 = w.bf16 + std::size_t(h0) * dh * w.in;
  return v;
}

void gather_heads(const shard_view& s, std::vector<float>& o, int n, int dh) {
  const std::size_t block = std::size_t(s.num_heads()) * dh;  // one row's heads on one rank
  CEDAR_OP_CHECK(o.size() == std::size_t(n) * block, "o holds this rank's heads");
  std::vector<float> all(std::size_t(s.size) * o.size());     // [size, n, block]
  s.comm->all_gather(o.data(), o.size(), all.data());
  o.resize(all.size());                                       // [n, size, block]
  for (int p = 0; p < s.size; ++p)
    for (int r = 0; r < n; ++r) {
      const float* src = all.data() + (std::size_t(p) * n + r) * block;
      std::copy(src, src + block, o.data() + (std::size_t(r) * s.size + p) * block);
    }
}

}  // namespace model_detail
}  // namespace cedar
