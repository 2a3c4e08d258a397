// Weights to the device (gpu_model.hpp): every view bound by model_detail::bind_weights is
// copied into its own device allocation, with a progress callback over the bytes. Runs once, in
// the gpu_model constructor.
#ifdef CEDAR_HAVE_CUDA

#include "kernels/cuda_model/gpu_forward.hpp"

namespace cedar {

namespace {

uint64_t view_bytes(const fp8_weight& w) {
  return uint64_t(w.out) * w.in + uint64_t((w.out + 31) / 32) * ((w.in + 31) / 32);
}
uint64_t view_bytes(const fp4_weight& w) { return uint64_t(w.out) * w.in / 2 + uint64_t(w.out) * (w.in / 32); }
uint64_t view_bytes(const bf16_weight& w) { return uint64_t(w.out) * w.in * 2; }

}  // namespace

void gpu_model::impl::bind(const model_detail::model_weights& w) {
  // Total first, for the progress callback (the big matrices dominate).
  total = view_bytes(w.embed) + view_bytes(w.head);
  for (const auto& lw : w.layers) {
    const auto& at = lw.attn;
    total += view_bytes(at.wq_a) + view_bytes(at.wq_b) + view_bytes(at.wkv) + view_bytes(at.wo_b) +
             view_bytes(at.wo_a) + view_bytes(lw.ffn.gate);
    for (const auto& e : lw.ffn.experts)
      if (e.w1.data) total += view_bytes(e.w1) + view_bytes(e.w3) + view_bytes(e.w2);
  }
  embed = upload(w.embed);
  head = upload(w.head);
  norm = upload(w.norm);
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const model_detail::layer_weights& lw = w.layers[l];
    const layer_info& li = args.layers[l];
    dev_layer d;
    d.hc_attn = upload(lw.hc_attn);
    d.hc_ffn = upload(lw.hc_ffn);
    d.attn_norm = upload(lw.attn_norm);
    d.ffn_norm = upload(lw.ffn_norm);
    const auto& at = lw.attn;
    d.wq_a = upload(at.wq_a);
    d.wq_b = upload(at.wq_b);
    d.wkv = upload(at.wkv);
    d.wo_b = upload(at.wo_b);
    d.wo_a = upload(at.wo_a);
    d.q_norm = upload(at.q_norm);
    d.kv_norm = upload(at.kv_norm);
    d.sink = upload(at.sink);
    if (li.is_kv_source) {
      d.c_wkv = upload(at.compressor.wkv);
      d.c_wgate = upload(at.compressor.wgate);
      d.c_index_wk = upload(at.compressor.index_wk);
      d.c_norm = upload(at.compressor.norm);
      d.c_index_k_norm = upload(at.compressor.index_k_norm);
    }
    if (li.is_index_source) {
      d.i_wq_b = upload(at.indexer.wq_b);
      d.i_weights_proj = upload(at.indexer.weights_proj);
    }
    d.gate = upload(lw.ffn.gate);
    d.gate_bias = upload(lw.ffn.gate_bias);
    for (const auto& e : lw.ffn.experts) {
      if (e.w1.data == nullptr) d.experts.push_back({});
      else d.experts.push_back({upload(e.w1), upload(e.w3), upload(e.w2)});
    }
    if (args.n_shared_experts > 0)
      d.shared = {upload(lw.ffn.shared.w1), upload(lw.ffn.shared.w3), upload(lw.ffn.shared.w2)};
    if (li.has_engram) {
      const cpu::engram_weights& e = lw.engram;
      d.engram = e;
      d.engram.table = upload(e.table, std::size_t(e.num_rows) * e.head_dim);
      d.engram.table_scale = upload(e.table_scale, std::size_t(e.num_rows) * (e.head_dim / 32));
      d.engram.wkv = upload(e.wkv);
      d.engram.q_weight = upload(lw.engram_q);
      d.engram.k_weight = upload(lw.engram_k);
    }
    layers.push_back(std::move(d));
  }
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
