// Every CUDA op against its CPU op on fresh random inputs, outputs poisoned first (0xFF bytes).
// Bounds (max error relative to the largest reference value): 0 where the GPU runs the CPU's
// operations in the CPU's order (linears, norms, mHC collapse/post, scores, records, gathers);
// 1e-5 where a transcendental is involved (mHC mix, attention, compressor merge, routing weights,
// experts, Engram, RoPE): exp and log1p follow the host libm's algorithms (expf_port.hpp), cos and
// sin are rounded from double. Integer outputs (top-k, candidate masks, expert ids, argmax) must
// be identical.
#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "tests/gpu/gpu_test_util.hpp"

using namespace cedar;
using namespace cedar::gpu_test;
namespace ref = cedar::op_reference;

namespace {
constexpr double exact = 0.0;
constexpr double libm_bound = 1e-5;
}  // namespace

TEST_CASE("gpu linear layers equal the CPU's bits, batch-invariant") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(101);
  const int m = 7, in = 512, out = 200;
  const auto x = activations(rng, m, in);
  dev<float> dx(x);
  const auto w8 = ref::random_fp8(rng, out, in);
  const auto w4 = ref::random_fp4(rng, out, in);
  const auto wb = ref::random_bf16(rng, out, in + 7, 0.05f);
  const auto wf = ref::random_floats(rng, size_t(out) * (in + 7), -0.05f, 0.05f);
  const auto xb = activations(rng, m, in + 7);
  dev<float> dxb(xb), dwf(wf);
  dev_fp8 d8(w8);
  dev_fp4 d4(w4);
  dev_bf16 db(wb);
  std::vector<float> ref_y(size_t(m) * out);
  dev<float> y(size_t(m) * out), y1(out);

  cpu::linear_fp8(x.data(), m, w8.view, ref_y.data());
  cuda::linear_fp8(dx.get(), m, d8.view, y.get());
  check_close("linear_fp8", y.host().data(), ref_y.data(), ref_y.size(), exact);
  cuda::linear_fp8(dx.get() + size_t(m - 1) * in, 1, d8.view, y1.get());
  CHECK(ref::same_bits(y1.host().data(), y.host().data() + size_t(m - 1) * out, out));

  cpu::linear_fp4(x.data(), m, w4.view, ref_y.data());
  cuda::linear_fp4(dx.get(), m, d4.view, y.get());
  check_close("linear_fp4", y.host().data(), ref_y.data(), ref_y.size(), exact);

  cpu::linear_bf16(xb.data(), m, wb.view, ref_y.data());
  cuda::linear_bf16(dxb.get(), m, db.view, y.get());
  check_close("linear_bf16 (in % 32 = 7)", y.host().data(), ref_y.data(), ref_y.size(), exact);

  cpu::linear_f32(xb.data(), m, wf.data(), out, in + 7, ref_y.data());
  cuda::linear_f32(dxb.get(), m, dwf.get(), out, in + 7, y.get());
  check_close("linear_f32", y.host().data(), ref_y.data(), ref_y.size(), exact);
}

TEST_CASE("gpu rmsnorm, rope/yarn and inverse rope") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(102);
  const int m = 9, d = 1024;
  const auto x = activations(rng, m, d);
  const auto w = ref::random_floats(rng, d, 0.5f, 1.5f);
  dev<float> dx(x), dw(w), dy(size_t(m) * d);
  std::vector<float> ry(x.size());
  cpu::rmsnorm(x.data(), m, d, w.data(), 1e-6f, ry.data());
  cuda::rmsnorm(dx.get(), m, d, dw.get(), 1e-6f, dy.get());
  check_close("rmsnorm", dy.host().data(), ry.data(), ry.size(), exact);

  const int heads = 8, head_dim = 128;
  std::vector<int32_t> pos(m);
  for (int r = 0; r < m; ++r) pos[r] = int32_t(rng() % 200000);
  dev<int32_t> dpos(pos);
  for (bool yarn : {false, true})
    for (bool inverse : {false, true}) {
      cpu::rope_params p;
      p.yarn = yarn;
      p.theta = yarn ? 160000.0 : 10000.0;
      auto q = ref::random_floats(rng, size_t(m) * heads * head_dim, -1.0f, 1.0f);
      dev<float> dq(q);
      cpu::rope(q.data(), m, heads, head_dim, pos.data(), p, inverse);
      cuda::rope(dq.get(), m, heads, head_dim, dpos.get(), p, inverse);
      check_close(std::string("rope") + (yarn ? " yarn" : "") + (inverse ? " inverse" : ""),
                  dq.host().data(), q.data(), q.size(), libm_bound);
    }
}

TEST_CASE("gpu mHC: hc_mix (Sinkhorn), hc_collapse, hc_post") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(103);
  const int m = 5, hc = 4, d = 256, n_mix = hc * hc + 2 * hc;
  const auto X = activations(rng, m, hc * d);
  const auto fn = ref::random_floats(rng, size_t(n_mix) * hc * d, -0.05f, 0.05f);
  const std::vector<float> scale = {0.7f, 0.9f, 1.1f};
  const auto base = ref::random_floats(rng, n_mix, -0.5f, 0.5f);
  dev<float> dX(X), dfn(fn), dscale(scale), dbase(base), dpre(size_t(m) * hc), dpost(size_t(m) * hc),
      dcomb(size_t(m) * hc * hc);
  std::vector<float> pre(size_t(m) * hc), post(pre.size()), comb(size_t(m) * hc * hc);
  cpu::hc_mix(X.data(), m, hc, d, fn.data(), scale.data(), base.data(), 20, 1e-6f, 1e-6f, pre.data(),
              post.data(), comb.data());
  cuda::hc_mix(dX.get(), m, hc, d, dfn.get(), dscale.get(), dbase.get(), 20, 1e-6f, 1e-6f, dpre.get(),
               dpost.get(), dcomb.get());
  check_close("hc_mix pre", dpre.host().data(), pre.data(), pre.size(), libm_bound);
  check_close("hc_mix post", dpost.host().data(), post.data(), post.size(), libm_bound);
  check_close("hc_mix comb (Sinkhorn 20)", dcomb.host().data(), comb.data(), comb.size(), libm_bound);

  // collapse and post on the CPU's mixing weights, so they are checked on their own
  dev<float> dpre_c(pre), dpost_c(post), dcomb_c(comb), dout(size_t(m) * d);
  std::vector<float> out(size_t(m) * d);
  cpu::hc_collapse(X.data(), pre.data(), m, hc, d, out.data());
  cuda::hc_collapse(dX.get(), dpre_c.get(), m, hc, d, dout.get());
  check_close("hc_collapse", dout.host().data(), out.data(), out.size(), exact);
  const auto f = activations(rng, m, d);
  dev<float> df(f), dXo(X.size());
  std::vector<float> Xo(X.size());
  cpu::hc_post(f.data(), X.data(), post.data(), comb.data(), m, hc, d, Xo.data());
  cuda::hc_post(df.get(), dX.get(), dpost_c.get(), dcomb_c.get(), m, hc, d, dXo.get());
  check_close("hc_post", dXo.host().data(), Xo.data(), Xo.size(), exact);
}

TEST_CASE("gpu sparse attention with the sink, and the grouped output LoRA") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(104);
  const int m = 6, heads = 16, dim = 512, num_kv = 300, num_idx = 200;
  const auto q = ref::random_floats(rng, size_t(m) * heads * dim, -1.0f, 1.0f);
  const auto kv = ref::random_floats(rng, size_t(num_kv) * dim, -1.0f, 1.0f);
  const auto sink = ref::random_floats(rng, heads, -1.0f, 1.0f);
  std::vector<int32_t> idx(size_t(m) * num_idx);
  for (auto& v : idx) v = rng() % 5 == 0 ? -1 : int32_t(rng() % num_kv);
  for (int c = 0; c < num_idx; ++c) idx[c] = -1;  // row 0: nothing but the sink
  dev<float> dq(q), dkv(kv), dsink(sink), dout(q.size());
  dev<int32_t> didx(idx);
  std::vector<float> out(q.size());
  const float scale = 1.0f / std::sqrt(float(dim));
  cpu::sparse_attention(q.data(), m, heads, dim, kv.data(), idx.data(), num_idx, sink.data(), scale, out.data());
  cuda::sparse_attention(dq.get(), m, heads, dim, dkv.get(), didx.get(), num_idx, dsink.get(), scale, dout.get());
  check_close("sparse_attention", dout.host().data(), out.data(), out.size(), libm_bound);

  const int groups = 4, rank = 64, out_dim = 256;
  const auto wo_a = ref::random_bf16(rng, groups * rank, heads / groups * dim, 0.02f);
  const auto wo_b = ref::random_fp8(rng, out_dim, groups * rank);
  dev_bf16 da(wo_a);
  dev_fp8 db(wo_b);
  std::vector<float> g(size_t(m) * out_dim);
  dev<float> dg(g.size());
  cpu::grouped_output(q.data(), m, groups, wo_a.view, wo_b.view, g.data());
  cuda::grouped_output(dq.get(), m, groups, da.view, db.view, dg.get());
  check_close("grouped_output", dg.host().data(), g.data(), g.size(), exact);
}

TEST_CASE("gpu compressors: ratio 2 with the tail across chunks, ratio 1") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(105);
  const int in = 256, d = 128, total = 11;
  const auto x = activations(rng, total, in);
  const auto wkv = ref::random_bf16(rng, d, in, 0.05f), wg = ref::random_bf16(rng, d, in, 0.05f);
  const auto norm = ref::random_floats(rng, d, 0.5f, 1.5f);
  dev<float> dx(x), dnorm(norm), dtail(2 * d), dlat(size_t(total) * d);
  dev_bf16 dkv(wkv), dwg(wg);
  std::vector<float> tail(2 * d, 0.0f), lat(size_t(total) * d);
  // chunks [0,3) [3,4) [4,8) [8,11): odd and even starts, a tail carried three times
  const int cuts[] = {0, 3, 4, 8, 11};
  std::vector<float> all_cpu, all_gpu;
  for (int c = 0; c < 4; ++c) {
    const int first = cuts[c], m = cuts[c + 1] - cuts[c];
    const int n_cpu = cpu::compress_ratio2(x.data() + size_t(first) * in, m, first, wkv.view, wg.view,
                                           norm.data(), 1e-6f, tail.data(), lat.data());
    const int n_gpu = cuda::compress_ratio2(dx.get() + size_t(first) * in, m, first, dkv.view, dwg.view,
                                            dnorm.get(), 1e-6f, dtail.get(), dlat.get());
    REQUIRE(n_cpu == n_gpu);
    const auto h = dlat.host();
    all_cpu.insert(all_cpu.end(), lat.begin(), lat.begin() + size_t(n_cpu) * d);
    all_gpu.insert(all_gpu.end(), h.begin(), h.begin() + size_t(n_gpu) * d);
  }
  check_close("compress_ratio2 (4 chunks)", all_gpu.data(), all_cpu.data(), all_cpu.size(), libm_bound);
  cpu::compress_ratio1(x.data(), total, wkv.view, norm.data(), 1e-6f, lat.data());
  cuda::compress_ratio1(dx.get(), total, dkv.view, dnorm.get(), 1e-6f, dlat.get());
  check_close("compress_ratio1", dlat.host().data(), lat.data(), lat.size(), exact);
}

TEST_CASE("gpu indexer scores, top-k with ties to the lowest index, candidate blocks") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(106);
  const int m = 5, heads = 16, dim = 128, num_keys = 3000, k = 512;
  const auto q = ref::random_floats(rng, size_t(m) * heads * dim, -1.0f, 1.0f);
  const auto w = ref::random_floats(rng, size_t(m) * heads, -1.0f, 1.0f);
  // keys on the FP4 grid with repeats, so exact score ties occur at the cut
  auto keys = ref::random_floats(rng, size_t(num_keys) * dim, -1.0f, 1.0f);
  for (int j = 0; j < num_keys; ++j) {
    fmt::fake_quant_fp4_pow2(keys.data() + size_t(j) * dim, dim);
    if (j % 3 == 2) std::copy_n(keys.data() + size_t(j - 1) * dim, dim, keys.data() + size_t(j) * dim);
  }
  const std::vector<int32_t> visible = {3000, 1, 0, 2049, 700};
  dev<float> dq(q), dw(w), dkeys(keys), dscores(size_t(m) * num_keys);
  dev<int32_t> dvis(visible);
  std::vector<float> scores(size_t(m) * num_keys);
  cpu::index_scores(q.data(), w.data(), m, heads, dim, keys.data(), num_keys, visible.data(), scores.data());
  cuda::index_scores(dq.get(), dw.get(), m, heads, dim, dkeys.get(), num_keys, dvis.get(), dscores.get());
  check_close("index_scores", dscores.host().data(), scores.data(), scores.size(), exact);

  // top-k on the CPU's scores plus a row of all-equal scores and a row with NaNs
  std::vector<float> s2 = scores;
  for (int j = 0; j < num_keys; ++j) s2[size_t(1) * num_keys + j] = 0.25f;
  for (int j = 0; j < num_keys; j += 7) s2[size_t(3) * num_keys + j] = NAN;
  for (int j = 0; j < num_keys; j += 5) s2[size_t(4) * num_keys + j] = -0.0f;
  dev<float> ds2(s2);
  for (int kk : {k, 1, 2048, 4000}) {
    std::vector<int32_t> ti(size_t(m) * kk);
    dev<int32_t> dti(ti.size());
    cpu::topk_indices(s2.data(), m, num_keys, kk, ti.data());
    cuda::topk_indices(ds2.get(), m, num_keys, kk, dti.get());
    check_equal("topk_indices k=" + std::to_string(kk), dti.host(), ti);
  }
  const int block = 64, keep = 8, nb = (num_keys + block - 1) / block;
  std::vector<uint8_t> mask(size_t(m) * nb);
  dev<uint8_t> dmask(mask.size());
  cpu::candidate_blocks(s2.data(), m, num_keys, block, keep, visible.data(), mask.data());
  cuda::candidate_blocks(ds2.get(), m, num_keys, block, keep, dvis.get(), dmask.get());
  check_equal("candidate_blocks", dmask.host(), mask);
}

TEST_CASE("gpu KV records and fake-quant rules are bit-exact") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(107);
  const int m = 33, d = 512;
  auto x = activations(rng, m, d);
  x[5] = 0.0f;
  x[6] = -0.0f;
  for (int i = 0; i < 32; ++i) x[64 + i] = 0.0f;  // an all-zero group
  dev<float> dx(x), dy(x.size());
  struct rule {
    const char* name;
    std::size_t bytes;
    void (*pack)(const float*, int, uint8_t*);
    void (*unpack)(const uint8_t*, int, float*);
    void (*gpack)(const float*, int, int, uint8_t*);
    void (*gunpack)(const uint8_t*, int, int, float*);
  };
  const rule rules[] = {
      {"fp8 record", fmt::fp8_record_bytes(d), fmt::pack_fp8, fmt::unpack_fp8, cuda::pack_fp8_rows, cuda::unpack_fp8_rows},
      {"fp4 e4m3 record", fmt::fp4_e4m3_record_bytes(d), fmt::pack_fp4_e4m3, fmt::unpack_fp4_e4m3,
       cuda::pack_fp4_e4m3_rows, cuda::unpack_fp4_e4m3_rows},
      {"fp4 pow2 record", fmt::fp4_pow2_record_bytes(d), fmt::pack_fp4_pow2, fmt::unpack_fp4_pow2,
       cuda::pack_fp4_pow2_rows, cuda::unpack_fp4_pow2_rows},
  };
  for (const rule& r : rules) {
    std::vector<uint8_t> rec(size_t(m) * r.bytes);
    std::vector<float> back(x.size());
    for (int i = 0; i < m; ++i) {
      r.pack(x.data() + size_t(i) * d, d, rec.data() + i * r.bytes);
      r.unpack(rec.data() + i * r.bytes, d, back.data() + size_t(i) * d);
    }
    dev<uint8_t> drec(rec.size());
    r.gpack(dx.get(), m, d, drec.get());
    check_equal(std::string(r.name) + " pack", drec.host(), rec);
    r.gunpack(drec.get(), m, d, dy.get());
    check_close(std::string(r.name) + " unpack", dy.host().data(), back.data(), back.size(), exact);
  }
  std::vector<float> q8 = x, q4 = x, q4e = x;
  for (int i = 0; i < m; ++i) {
    fmt::fake_quant_fp8(q8.data() + size_t(i) * d, d);
    fmt::fake_quant_fp4_pow2(q4.data() + size_t(i) * d, d);
    fmt::fake_quant_fp4_e4m3(q4e.data() + size_t(i) * d, d);
  }
  dev<float> a(x), b(x), c(x);
  cuda::fake_quant_fp8_rows(a.get(), m, d);
  cuda::fake_quant_fp4_pow2_rows(b.get(), m, d);
  cuda::fake_quant_fp4_e4m3_rows(c.get(), m, d);
  check_close("fake_quant_fp8", a.host().data(), q8.data(), q8.size(), exact);
  check_close("fake_quant_fp4_pow2", b.host().data(), q4.data(), q4.size(), exact);
  check_close("fake_quant_fp4_e4m3", c.host().data(), q4e.data(), q4e.size(), exact);
}

TEST_CASE("gpu MoE: routing, experts, moe_ffn with device permutation") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(108);
  const int m = 37, d = 256, inter = 128, num_experts = 16, topk = 4;
  const auto y = activations(rng, m, d);
  const auto gate = ref::random_bf16(rng, num_experts, d, 0.1f);
  const auto bias = ref::random_floats(rng, num_experts, -0.05f, 0.05f);
  dev<float> dy(y), dbias(bias);
  dev_bf16 dgate(gate);
  std::vector<int32_t> sel(size_t(m) * topk);
  std::vector<float> wts(sel.size());
  dev<int32_t> dsel(sel.size());
  dev<float> dwts(sel.size());
  cpu::moe_route(y.data(), m, gate.view, bias.data(), topk, 1.5f, sel.data(), wts.data());
  cuda::moe_route(dy.get(), m, dgate.view, dbias.get(), topk, 1.5f, dsel.get(), dwts.get());
  check_equal("moe_route experts", dsel.host(), sel);
  check_close("moe_route weights", dwts.host().data(), wts.data(), wts.size(), libm_bound);

  std::vector<ref::owned_fp4> host_w;
  std::vector<std::unique_ptr<dev_fp4>> dev_w;
  std::vector<cpu::expert_weights> cpu_e(num_experts), gpu_e(num_experts);
  for (int e = 0; e < num_experts; ++e) {
    if (e == 3) continue;  // held by another shard: adds nothing
    for (auto [out, in] : {std::pair{inter, d}, {inter, d}, {d, inter}}) {
      host_w.push_back(ref::random_fp4(rng, out, in));
    }
  }
  for (auto& w : host_w) w.view = fp4_weight{w.view.out, w.view.in, w.data.data(), w.scale.data()};
  for (auto& w : host_w) dev_w.push_back(std::make_unique<dev_fp4>(w));
  for (int e = 0, i = 0; e < num_experts; ++e) {
    if (e == 3) continue;
    cpu_e[e] = {host_w[i].view, host_w[i + 1].view, host_w[i + 2].view};
    gpu_e[e] = {dev_w[i]->view, dev_w[i + 1]->view, dev_w[i + 2]->view};
    i += 3;
  }
  const auto s1 = ref::random_fp8(rng, inter, d), s3 = ref::random_fp8(rng, inter, d), s2 = ref::random_fp8(rng, d, inter);
  dev_fp8 g1(s1), g3(s3), g2(s2);
  const cpu::shared_expert_weights shared{s1.view, s3.view, s2.view}, gshared{g1.view, g3.view, g2.view};

  dev<float> dwts_cpu(wts);
  std::vector<float> out(size_t(m) * d, 0.5f);
  dev<float> dout(out);
  cpu::expert_ffn_fp4(y.data(), m, cpu_e[0], wts.data(), 10.0f, out.data());
  cuda::expert_ffn_fp4(dy.get(), m, gpu_e[0], dwts_cpu.get(), 10.0f, dout.get());
  check_close("expert_ffn_fp4", dout.host().data(), out.data(), out.size(), libm_bound);
  cpu::expert_ffn_fp8(y.data(), m, shared, 10.0f, out.data());
  cuda::expert_ffn_fp8(dy.get(), m, gshared, 10.0f, dout.get());
  check_close("expert_ffn_fp8 (shared)", dout.host().data(), out.data(), out.size(), libm_bound);

  dev<int32_t> dsel_cpu(sel);
  dev<float> dmoe(size_t(m) * d), dmoe1(d);
  std::vector<float> moe(size_t(m) * d);
  cpu::moe_ffn(y.data(), m, d, sel.data(), wts.data(), topk, cpu_e.data(), num_experts, &shared, 10.0f, moe.data());
  cuda::moe_ffn(dy.get(), m, d, dsel_cpu.get(), dwts_cpu.get(), topk, gpu_e.data(), num_experts, &gshared, 10.0f,
                dmoe.get());
  const auto gm = dmoe.host();
  check_close("moe_ffn", gm.data(), moe.data(), moe.size(), libm_bound);
  // batch invariance: the last row alone gives the same bits
  cuda::moe_ffn(dy.get() + size_t(m - 1) * d, 1, d, dsel_cpu.get() + size_t(m - 1) * topk,
                dwts_cpu.get() + size_t(m - 1) * topk, topk, gpu_e.data(), num_experts, &gshared, 10.0f, dmoe1.get());
  CHECK(ref::same_bits(dmoe1.host().data(), gm.data() + size_t(m - 1) * d, d));
}

TEST_CASE("gpu Engram, embedding and greedy argmax") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(109);
  const int m = 6, hc = 4, d = 256, per = 6;
  engram_host h(rng, m, hc, d, 64, per, 500);
  engram_device g(h);
  cpu::engram(h.X.data(), m, hc, d, h.rows.data(), per, h.weights(), 1e-6f);
  cuda::engram(g.X.get(), m, hc, d, g.rows.get(), per, g.weights(), 1e-6f);
  check_close("engram", g.X.host().data(), h.X.data(), h.X.size(), libm_bound);

  const int vocab = 1000;
  const auto emb = ref::random_bf16(rng, vocab, d, 1.0f);
  std::vector<int32_t> tok = {0, 999, 5, 5, 123};
  dev_bf16 demb(emb);
  dev<int32_t> dtok(tok);
  std::vector<float> e(tok.size() * d);
  dev<float> de(e.size());
  cpu::embed(tok.data(), int(tok.size()), emb.view, e.data());
  cuda::embed(dtok.get(), int(tok.size()), demb.view, de.get());
  check_close("embed", de.host().data(), e.data(), e.size(), exact);

  const int rows_l = 4, V = 129280;
  auto logits = ref::random_floats(rng, size_t(rows_l) * V, -5.0f, 5.0f);
  logits[size_t(1) * V + 7] = logits[size_t(1) * V + 90000] = 100.0f;  // tie: lowest id wins
  for (int j = 0; j < V; ++j) logits[size_t(2) * V + j] = 1.0f;
  dev<float> dl(logits);
  dev<int32_t> dam(rows_l);
  std::vector<int32_t> am(rows_l);
  for (int r = 0; r < rows_l; ++r) {
    const float* l = logits.data() + size_t(r) * V;
    am[r] = int32_t(std::max_element(l, l + V) - l);  // first maximum
  }
  cuda::argmax_rows(dl.get(), rows_l, V, dam.get());
  check_equal("argmax_rows (greedy)", dam.host(), am);
}
