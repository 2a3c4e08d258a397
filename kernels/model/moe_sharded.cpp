// The MoE sublayer of one rank of a TP or DEP layout (see shard_plan.hpp). Routing is
// replicated; each rank runs only the experts it owns. TP: every rank holds every row, so it
// writes its experts' per-slot outputs (and, on the shared expert's owner, the shared output)
// into a zeroed [rows, topk + 1, dim] buffer that an all-reduce fills in (one nonzero term per
// value: exact). DEP: a row's slots travel to their experts' owners with all-to-all, are run
// there and travel back. Either way a rank ends with the single-rank per-slot outputs and
// combines them in moe_ffn's order, so the result has the same bits as one rank.
#include <algorithm>
#include <vector>

#include "kernels/collectives/communicator.hpp"
#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/model/shard_forward.hpp"
#include "kernels/parallel.hpp"

namespace cedar::model_detail {
namespace {

/// Runs expert `e` over gathered rows: rows [k, d], weights [k] -> out [k, d].
std::vector<float> run_expert_rows(const cpu::expert_weights& e, const std::vector<float>& rows,
                                   const std::vector<float>& weights, int d, float limit) {
  const int k = int(weights.size());
  std::vector<float> out(std::size_t(k) * d, 0.0f);
  cpu::expert_ffn_fp4(rows.data(), k, e, weights.data(), limit, out.data());
  return out;
}

/// out[r] = sum of slots [r, 0..topk) in top-k order, then + shared [r] (moe_ffn's combine),
/// rounded to bf16 as moe_sublayer stores it. slots [n, stride, d]; the shared output is
/// `shared` [n, d], or slot `topk` of each row when shared is null.
void combine(const float* slots, int stride, int n, int topk, int d, const float* shared, float* out) {
  parallel_for(0, n, [&](int64_t r) {
    float* o = out + r * d;
    std::fill(o, o + d, 0.0f);
    for (int i = 0; i < topk; ++i) {
      const float* p = slots + (r * stride + i) * d;
      for (int c = 0; c < d; ++c) o[c] += p[c];
    }
    const float* s = shared ? shared + r * d : slots + (r * stride + topk) * d;
    for (int c = 0; c < d; ++c) o[c] += s[c];
    for (int c = 0; c < d; ++c) o[c] = fmt::round_bf16(o[c]);
  });
}

/// TP: this rank's experts over every row, summed over ranks. slots [n, topk + 1, d].
void tp_slots(const layer_context& c, const shard_view& s, const float* y, int n, const std::vector<int32_t>& sel,
              const std::vector<float>& w, std::vector<float>& slots) {
  const int k = c.args.num_experts_per_tok, d = c.args.hidden_size, stride = k + 1;
  const float limit = float(c.args.swiglu_limit);
  const auto& experts = c.w.ffn.experts;
  std::vector<std::vector<int>> by_expert(experts.size());  // slot ids r * k + i
  for (int slot = 0; slot < n * k; ++slot)
    if (sel[slot] >= 0 && s.owns_expert(sel[slot])) by_expert[sel[slot]].push_back(slot);
  for (std::size_t e = 0; e < experts.size(); ++e) {
    if (by_expert[e].empty()) continue;
    std::vector<float> rows, weights;
    for (int slot : by_expert[e]) {
      rows.insert(rows.end(), y + std::size_t(slot / k) * d, y + std::size_t(slot / k + 1) * d);
      weights.push_back(w[slot]);
    }
    const auto out = run_expert_rows(experts[e], rows, weights, d, limit);
    for (std::size_t i = 0; i < by_expert[e].size(); ++i) {
      const int slot = by_expert[e][i];
      std::copy_n(out.data() + i * d, d, slots.data() + (std::size_t(slot / k) * stride + slot % k) * d);
    }
  }
  // The shared expert runs on one rank, like one more expert placed round-robin.
  if (c.args.n_shared_experts > 0 && s.owns_expert(int(experts.size())) && n > 0) {
    std::vector<float> shared(std::size_t(n) * d, 0.0f);
    cpu::expert_ffn_fp8(y, n, c.w.ffn.shared, limit, shared.data());
    for (int r = 0; r < n; ++r)
      std::copy_n(shared.data() + std::size_t(r) * d, d, slots.data() + (std::size_t(r) * stride + k) * d);
  }
  s.comm->all_reduce_sum(slots.data(), slots.size());
}

/// One dispatched slot on the wire: [expert id, routing weight, y row (d)].
constexpr int record_header = 2;

/// DEP: sends each slot to its expert's owner, runs the slots it receives, and returns the
/// outputs to their senders. slots [n, topk, d].
void dep_slots(const layer_context& c, const shard_view& s, const float* y, int n, const std::vector<int32_t>& sel,
               const std::vector<float>& w, std::vector<float>& slots) {
  const int k = c.args.num_experts_per_tok, d = c.args.hidden_size, N = s.size;
  const std::size_t rec = std::size_t(d) + record_header;
  // Outgoing records grouped by destination rank, slot order within each.
  std::vector<std::vector<int>> to(N);
  for (int slot = 0; slot < n * k; ++slot)
    if (sel[slot] >= 0) to[s.expert_owner(sel[slot])].push_back(slot);
  std::vector<float> send;
  std::vector<std::size_t> send_counts(N), recv_counts(N);
  for (int p = 0; p < N; ++p) {
    for (int slot : to[p]) {
      send.push_back(float(sel[slot]));
      send.push_back(w[slot]);
      send.insert(send.end(), y + std::size_t(slot / k) * d, y + std::size_t(slot / k + 1) * d);
    }
    send_counts[p] = to[p].size() * rec;
  }
  s.comm->exchange_counts(send_counts.data(), recv_counts.data());
  std::size_t num_recv = 0;
  for (std::size_t x : recv_counts) num_recv += x / rec;
  std::vector<float> recv(num_recv * rec);
  s.comm->all_to_all(send.data(), send_counts.data(), recv.data(), recv_counts.data());

  // Run the received records expert by expert; results keep the records' order.
  const auto& experts = c.w.ffn.experts;
  std::vector<std::vector<std::size_t>> by_expert(experts.size());
  for (std::size_t i = 0; i < num_recv; ++i) {
    const int e = int(recv[i * rec]);
    CEDAR_OP_CHECK(e >= 0 && e < int(experts.size()) && s.owns_expert(e), "a dispatched slot's expert is ours");
    by_expert[e].push_back(i);
  }
  std::vector<float> results(num_recv * d);
  for (std::size_t e = 0; e < experts.size(); ++e) {
    if (by_expert[e].empty()) continue;
    std::vector<float> rows, weights;
    for (std::size_t i : by_expert[e]) {
      rows.insert(rows.end(), recv.begin() + i * rec + record_header, recv.begin() + (i + 1) * rec);
      weights.push_back(recv[i * rec + 1]);
    }
    const auto out = run_expert_rows(experts[e], rows, weights, d, float(c.args.swiglu_limit));
    for (std::size_t j = 0; j < by_expert[e].size(); ++j)
      std::copy_n(out.data() + j * d, d, results.data() + by_expert[e][j] * d);
  }

  // Combine: the way back swaps the counts (d values per record instead of rec).
  std::vector<std::size_t> back_send(N), back_recv(N);
  for (int p = 0; p < N; ++p) {
    back_send[p] = recv_counts[p] / rec * d;
    back_recv[p] = send_counts[p] / rec * d;
  }
  std::vector<float> mine(std::size_t(n) * k * d);
  s.comm->all_to_all(results.data(), back_send.data(), mine.data(), back_recv.data());
  std::size_t at = 0;
  for (int p = 0; p < N; ++p)
    for (int slot : to[p]) std::copy_n(mine.data() + (at++) * d, d, slots.data() + std::size_t(slot) * d);
}

}  // namespace

void sharded_moe_sublayer(const layer_context& c, const float* y, int n, float* out) {
  const shard_view& s = *c.shard;
  const model_args& a = c.args;
  const int k = a.num_experts_per_tok, d = a.hidden_size;
  std::vector<int32_t> sel(std::size_t(n) * k);   // [n, topk] expert ids
  std::vector<float> weights(std::size_t(n) * k); // [n, topk] routing weights
  if (n > 0)
    cpu::moe_route(y, n, c.w.ffn.gate, c.w.ffn.gate_bias.data(), k, float(a.routed_scaling_factor), sel.data(),
                   weights.data());
  if (s.mode == parallel_mode::tp) {
    std::vector<float> slots(std::size_t(n) * (k + 1) * d, 0.0f);  // [n, topk + shared, d]
    tp_slots(c, s, y, n, sel, weights, slots);  // the shared slot stays zero without a shared expert
    combine(slots.data(), k + 1, n, k, d, nullptr, out);
    return;
  }
  std::vector<float> slots(std::size_t(n) * k * d, 0.0f);  // [n, topk, d]
  dep_slots(c, s, y, n, sel, weights, slots);
  std::vector<float> shared(std::size_t(n) * d, 0.0f);
  if (a.n_shared_experts > 0 && n > 0) cpu::expert_ffn_fp8(y, n, c.w.ffn.shared, float(a.swiglu_limit), shared.data());
  if (n > 0) combine(slots.data(), k, n, k, d, shared.data(), out);
}

}  // namespace cedar::model_detail
