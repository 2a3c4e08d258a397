// The fused steps of the fast kernel set (kernels/cuda/fast/layer_ops.hpp) against the CPU ops
// they replace, on fresh random inputs with outputs poisoned first. Bounds (max error relative
// to the largest reference value): the residual copies after HCPost are bit-identical (same
// products and sums, no contraction); the mixing weights, the normalized sublayer input and the
// routing weights within 1e-5 (dot products summed in another order, then exp / sqrt); expert
// choices identical (random logits have no near-ties at this size). Engram: the residual within one
// bf16 step (2^-7) of its largest value (the gate from reordered sums can move a rounding).
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "tests/gpu/gpu_test_util.hpp"

using namespace cedar;
using namespace cedar::gpu_test;
namespace ref = cedar::op_reference;

namespace {

constexpr double reorder_bound = 1e-5;

void check_boundary(int m, int d, bool with_post) {
  std::mt19937_64 rng(301 + m * 7 + d);
  const int hc = 4, n_mix = hc * hc + 2 * hc, iters = 20;
  const float hc_eps = 1e-6f, eps = 1e-6f;
  const auto X = activations(rng, m, hc * d);
  const auto f = activations(rng, m, d);
  const auto fn = ref::random_floats(rng, size_t(n_mix) * hc * d, -0.05f, 0.05f);
  const std::vector<float> scale = {0.7f, 0.9f, 1.1f};
  const auto base = ref::random_floats(rng, n_mix, -0.5f, 0.5f);
  const auto post0 = ref::random_floats(rng, size_t(m) * hc, 0.2f, 1.8f);
  const auto comb0 = ref::random_floats(rng, size_t(m) * hc * hc, 0.0f, 0.5f);
  const auto cpre = ref::random_floats(rng, size_t(m) * hc, 0.1f, 1.0f);
  const auto norm_w = ref::random_floats(rng, d, 0.5f, 1.5f);

  // CPU: hc_post, hc_mix, hc_collapse, rmsnorm
  std::vector<float> X1 = X, pre(size_t(m) * hc), post(pre.size()), comb(size_t(m) * hc * hc), c(size_t(m) * d);
  if (with_post) cpu::hc_post(f.data(), X.data(), post0.data(), comb0.data(), m, hc, d, X1.data());
  cpu::hc_mix(X1.data(), m, hc, d, fn.data(), scale.data(), base.data(), iters, hc_eps, eps, pre.data(), post.data(),
              comb.data());
  cpu::hc_collapse(X1.data(), cpre.data(), m, hc, d, c.data());
  cpu::rmsnorm(c.data(), m, d, norm_w.data(), eps, c.data());

  dev<float> dX(X), df(f), dfn(fn), dscale(scale), dbase(base), dpost(post0), dcomb(comb0), dcpre(cpre), dnorm(norm_w),
      dpre(pre.size()), dx(size_t(m) * d);
  const cuda::fast::hc_mix_params p{dfn.get(), dscale.get(), dbase.get(), iters, hc_eps, eps};
  cuda::fast::hc_boundary(dX.get(), m, hc, d, with_post ? df.get() : nullptr, dpost.get(), dcomb.get(), p, dpre.get(),
                          dcpre.get(), dnorm.get(), dx.get());
  const std::string tag = " m=" + std::to_string(m) + " d=" + std::to_string(d) + (with_post ? " +post" : "");
  check_close("hc_boundary X" + tag, dX.host().data(), X1.data(), X1.size(), 0.0);
  check_close("hc_boundary pre" + tag, dpre.host().data(), pre.data(), pre.size(), reorder_bound);
  check_close("hc_boundary post" + tag, dpost.host().data(), post.data(), post.size(), reorder_bound);
  check_close("hc_boundary comb" + tag, dcomb.host().data(), comb.data(), comb.size(), reorder_bound);
  check_close("hc_boundary x" + tag, dx.host().data(), c.data(), c.size(), reorder_bound);
  // one launch (up to 8 rows; its finish in its last block, or apart in mix_finish) and two give
  // the same bits; the one-launch kernel's arrival counters are back at zero after every call
  // (the automatic call above took it at m = 1)
  const bool apart_was = cuda::fast::tuning_now().boundary_finish_apart;
  for (const int form : {0, 1, 2}) {
    const auto launches = form < 2 ? cuda::fast::hc_launches::one : cuda::fast::hc_launches::two;
    if (launches == cuda::fast::hc_launches::one && m > cuda::fast::hc_one_launch_capacity) continue;
    cuda::fast::tuning_now().boundary_finish_apart = form == 1;
    dev<float> bX(X), bpost(post0), bcomb(comb0), bpre(pre.size()), bx(size_t(m) * d);
    cuda::fast::hc_boundary(bX.get(), m, hc, d, with_post ? df.get() : nullptr, bpost.get(), bcomb.get(), p, bpre.get(),
                            dcpre.get(), dnorm.get(), bx.get(), launches);
    const std::string same = std::string("hc_boundary: ") +
                             (form == 0 ? "one launch" : form == 1 ? "one launch, its finish apart" : "two launches") +
                             " gives the same bits" + tag;
    CHECK_MESSAGE(ref::same_bits(bx.host().data(), dx.host().data(), size_t(m) * d), same);
    CHECK_MESSAGE(ref::same_bits(bX.host().data(), dX.host().data(), X.size()), same);
    CHECK_MESSAGE(ref::same_bits(bcomb.host().data(), dcomb.host().data(), comb.size()), same);
    CHECK_MESSAGE(ref::same_bits(bpost.host().data(), dpost.host().data(), post.size()), same);
    CHECK_MESSAGE(ref::same_bits(bpre.host().data(), dpre.host().data(), pre.size()), same);
    if (d % 32 != 0) continue;
    // the next linear's codes from the same launch: quantize_rows_fp8 of x_out, byte for byte
    dev<float> cX(X), cpost(post0), ccomb(comb0), cpre_out(pre.size()), cx(size_t(m) * d), ref_s(size_t(m) * (d / 32)),
        got_s(size_t(m) * (d / 32));
    dev<uint8_t> ref_q(size_t(m) * d), got_q(size_t(m) * d);
    cuda::fast::hc_boundary(cX.get(), m, hc, d, with_post ? df.get() : nullptr, cpost.get(), ccomb.get(), p,
                            cpre_out.get(), dcpre.get(), dnorm.get(), cx.get(), launches, got_q.get(), got_s.get());
    cuda::fast::quantize_rows_fp8(dx.get(), m, d, ref_q.get(), ref_s.get());
    const std::string codes = same + ", and x_out's FP8 codes";
    CHECK_MESSAGE(ref::same_bits(cx.host().data(), dx.host().data(), size_t(m) * d), codes);
    CHECK_MESSAGE(got_q.host() == ref_q.host(), codes);
    CHECK_MESSAGE(ref::same_bits(got_s.host().data(), ref_s.host().data(), size_t(m) * (d / 32)), codes);
  }
  cuda::fast::tuning_now().boundary_finish_apart = apart_was;
  if (m == 1) return;
  // batch invariance: the last row alone gets the bits it got in the batch
  const auto row = [&](const std::vector<float>& v, std::size_t width) {
    return std::vector<float>(v.end() - std::ptrdiff_t(width), v.end());
  };
  dev<float> aX(row(X, std::size_t(hc) * d)), af(row(f, d)), apost(row(post0, hc)), acomb(row(comb0, hc * hc)),
      acpre(row(cpre, hc)), apre(hc), ax(d);
  cuda::fast::hc_boundary(aX.get(), 1, hc, d, with_post ? af.get() : nullptr, apost.get(), acomb.get(), p, apre.get(),
                          acpre.get(), dnorm.get(), ax.get());
  const std::string alone = "hc_boundary: the last row alone gives its bits" + tag;
  CHECK_MESSAGE(ref::same_bits(ax.host().data(), dx.host().data() + std::size_t(m - 1) * d, d), alone);
  CHECK_MESSAGE(ref::same_bits(apre.host().data(), dpre.host().data() + std::size_t(m - 1) * hc, hc), alone);
  CHECK_MESSAGE(ref::same_bits(acomb.host().data(), dcomb.host().data() + std::size_t(m - 1) * hc * hc, hc * hc),
                alone);
}

}  // namespace

TEST_CASE("fast hc_boundary: HCPost, HCMix (Sinkhorn), collapse and RMSNorm as the CPU ops") {
  if (!have_gpu()) return;
  check_boundary(1, 5120, true);
  check_boundary(5, 640, true);
  check_boundary(3, 200, false);
  check_boundary(37, 640, true);
  check_boundary(16, 5120, false);
  check_boundary(2, 5120, true);
  check_boundary(8, 5120, true);  // the most rows the one-launch kernel takes (hc_launches::one)
  // rows per block 2, 4 and 8 (layer_ops.cu, rows_per_block: 3 slices of 256 at d = 640), the
  // last block part full
  check_boundary(399, 640, true);
  check_boundary(699, 640, true);
  check_boundary(1501, 640, true);
}

TEST_CASE("fast moe_route: the CPU's experts, weights within 1e-5") {
  if (!have_gpu()) return;
  for (const int m : {1, 37, 149, 299, 2047}) {  // the logits by the bf16 GEMV up to 64 rows, then the split GEMM
    std::mt19937_64 rng(401 + m);
    const int d = 512, num_experts = 64, topk = 6;
    const auto y = activations(rng, m, d);
    const auto gate = ref::random_bf16(rng, num_experts, d, 0.1f);
    const auto bias = ref::random_floats(rng, num_experts, -0.05f, 0.05f);
    std::vector<int32_t> sel(size_t(m) * topk);
    std::vector<float> wts(sel.size());
    cpu::moe_route(y.data(), m, gate.view, bias.data(), topk, 1.5f, sel.data(), wts.data());
    dev<float> dy(y), dbias(bias), dwts(sel.size());
    dev<int32_t> dsel(sel.size());
    dev_bf16 dgate(gate);
    // twice: the arrival counters must be back at zero after a call
    for (int rep = 0; rep < 2; ++rep) {
      cuda::fast::moe_route(dy.get(), m, dgate.view, dbias.get(), topk, 1.5f, dsel.get(), dwts.get());
      check_equal("fast moe_route experts m=" + std::to_string(m), dsel.host(), sel);
      check_close("fast moe_route weights m=" + std::to_string(m), dwts.host().data(), wts.data(), wts.size(),
                  reorder_bound);
    }
    if (m > 1 && m <= 64) {  // decode sizes: the last row alone gets the bits it got in the batch
      dev<int32_t> asel(topk);
      dev<float> awts(topk);
      cuda::fast::moe_route(dy.get() + std::size_t(m - 1) * d, 1, dgate.view, dbias.get(), topk, 1.5f, asel.get(),
                            awts.get());
      const std::string alone = "fast moe_route: the last row alone, m=" + std::to_string(m);
      const std::vector<int32_t> batch_sel = dsel.host();
      CHECK_MESSAGE(asel.host() == std::vector<int32_t>(batch_sel.end() - topk, batch_sel.end()), alone);
      CHECK_MESSAGE(ref::same_bits(awts.host().data(), dwts.host().data() + std::size_t(m - 1) * topk, topk), alone);
    }
  }
}

TEST_CASE("fast engram: the CPU op within one bf16 step of the largest residual value") {
  if (!have_gpu()) return;
  for (const int m : {1, 37}) {
    std::mt19937_64 rng(601 + m);
    const int hc = 4, d = 512, per = 6;
    engram_host h(rng, m, hc, d, 64, per, 700);
    engram_device g(h);
    cpu::engram(h.X.data(), m, hc, d, h.rows.data(), per, h.weights(), 1e-6f);
    cuda::fast::engram(g.X.get(), m, hc, d, g.rows.get(), per, g.weights(), 1e-6f);
    check_close("fast engram m=" + std::to_string(m), g.X.host().data(), h.X.data(), h.X.size(), 1.0 / 128);
  }
}

namespace {

/// finish_rows against the separate ops it replaces, same inputs: y, the record and the codes
/// byte for byte. kv: RMSNorm, RoPE (YaRN), FP8 fake quantization, the ring record; q: RMSNorm
/// and the next linear's activation codes.
void check_finish(int m, int d, bool kv) {
  std::mt19937_64 rng(77 + m * 3 + d);
  const auto x = activations(rng, m, d);
  const auto norm_w = ref::random_floats(rng, d, 0.5f, 1.5f);
  std::vector<int32_t> pos(m);
  for (int r = 0; r < m; ++r) pos[r] = int32_t(rng() % 70000);
  cpu::rope_params rp;
  rp.rope_dim = 64, rp.yarn = true;
  const float eps = 1e-6f;
  dev<float> dx(x), dw(norm_w), ref_y(x), fused_y(size_t(m) * d);
  dev<int32_t> dpos(pos);
  const size_t rec_bytes = size_t(d) + d / 32;
  dev<uint8_t> ref_rec(size_t(m) * rec_bytes), rec(size_t(m) * rec_bytes), ref_q(size_t(m) * d), q(size_t(m) * d);
  dev<float> ref_s(size_t(m) * (d / 32)), s(size_t(m) * (d / 32));
  // query heads the kv chain's launch rotates too (9 heads: a block of 8 and one of 1)
  const int qh = 9, qd = 128;
  const auto qv = activations(rng, m, qh * qd);
  dev<float> ref_q_rot(qv), q_rot(qv);
  cuda::rmsnorm(ref_y.get(), m, d, dw.get(), eps, ref_y.get());
  cuda::fast::row_finish f;
  f.norm_w = dw.get(), f.eps = eps;
  if (kv) {
    cuda::rope(ref_y.get(), m, 1, d, dpos.get(), rp, false);
    cuda::fake_quant_fp8_rows(ref_y.get(), m, d);
    cuda::pack_fp8_rows(ref_y.get(), m, d, ref_rec.get());
    cuda::rope(ref_q_rot.get(), m, qh, qd, dpos.get(), rp, false);
    f.positions = dpos.get(), f.rope = &rp, f.fake_fp8 = true, f.record = rec.get();
    f.rotate = q_rot.get(), f.rotate_heads = qh, f.rotate_head_dim = qd;
  } else {
    cuda::fast::quantize_rows_fp8(ref_y.get(), m, d, ref_q.get(), ref_s.get());
    f.codes = q.get(), f.scales = s.get();
  }
  cuda::fast::finish_rows(dx.get(), m, d, f, fused_y.get());
  const std::string tag =
      std::string(kv ? " (kv chain)" : " (q chain)") + " m=" + std::to_string(m) + " d=" + std::to_string(d);
  CHECK_MESSAGE(ref::same_bits(fused_y.host().data(), ref_y.host().data(), size_t(m) * d),
                (std::string("finish_rows y") + tag));
  if (kv) {
    CHECK_MESSAGE(rec.host() == ref_rec.host(), (std::string("finish_rows record") + tag));
    CHECK_MESSAGE(ref::same_bits(q_rot.host().data(), ref_q_rot.host().data(), qv.size()),
                  (std::string("finish_rows rotated query heads") + tag));
    f.rotate = nullptr;  // rotated once
  } else {
    CHECK_MESSAGE(q.host() == ref_q.host(), (std::string("finish_rows codes") + tag));
    CHECK_MESSAGE(ref::same_bits(s.host().data(), ref_s.host().data(), size_t(m) * (d / 32)),
                  (std::string("finish_rows scales") + tag));
  }
  // in place (y == x), as the model calls it
  cuda::fast::finish_rows(dx.get(), m, d, f, dx.get());
  CHECK_MESSAGE(ref::same_bits(dx.host().data(), ref_y.host().data(), size_t(m) * d),
                (std::string("finish_rows in place") + tag));
}

/// finish_rows_pair: a q chain (RMSNorm, codes) of d0 and a kv chain (RMSNorm, RoPE, fake
/// quantization, record, cos and sin) of d1 over the same rows in one launch give the bits of
/// the two finish_rows calls.
void check_finish_pair(int m, int d0, int d1) {
  std::mt19937_64 rng(91 + m * 5 + d0 + d1);
  const auto x0 = activations(rng, m, d0), x1 = activations(rng, m, d1);
  const auto w0 = ref::random_floats(rng, d0, 0.5f, 1.5f), w1 = ref::random_floats(rng, d1, 0.5f, 1.5f);
  std::vector<int32_t> pos(m);
  for (int r = 0; r < m; ++r) pos[r] = int32_t(rng() % 70000);
  cpu::rope_params rp;
  rp.rope_dim = 64, rp.yarn = true;
  dev<float> dw0(w0), dw1(w1);
  dev<int32_t> dpos(pos);
  struct outputs {
    dev<float> y0, y1, s, cs;
    dev<uint8_t> q, rec;
    outputs(int m, int d0, int d1, const std::vector<float>& x0, const std::vector<float>& x1)
        : y0(x0), y1(x1), s(size_t(m) * (d0 / 32)), cs(size_t(m) * 64), q(size_t(m) * d0),
          rec(size_t(m) * (d1 + d1 / 32)) {}
  };
  outputs apart(m, d0, d1, x0, x1), paired(m, d0, d1, x0, x1);
  const auto chains = [&](outputs& o, cuda::fast::row_finish& fq, cuda::fast::row_finish& fk) {
    fq.norm_w = dw0.get(), fq.eps = 1e-6f, fq.codes = o.q.get(), fq.scales = o.s.get();
    fk.norm_w = dw1.get(), fk.eps = 1e-6f, fk.positions = dpos.get(), fk.rope = &rp, fk.fake_fp8 = true;
    fk.record = o.rec.get(), fk.rope_cs = o.cs.get();
  };
  cuda::fast::row_finish fq, fk, pq, pk;
  chains(apart, fq, fk);
  chains(paired, pq, pk);
  cuda::fast::finish_rows(apart.y0.get(), m, d0, fq, apart.y0.get());
  cuda::fast::finish_rows(apart.y1.get(), m, d1, fk, apart.y1.get());
  cuda::fast::finish_rows_pair(m, paired.y0.get(), d0, pq, paired.y0.get(), paired.y1.get(), d1, pk, paired.y1.get());
  const std::string tag = "finish_rows_pair m=" + std::to_string(m) + " d0=" + std::to_string(d0) +
                          " d1=" + std::to_string(d1) + " gives two calls' bits: ";
  CHECK_MESSAGE(ref::same_bits(paired.y0.host().data(), apart.y0.host().data(), size_t(m) * d0), (tag + "q rows"));
  CHECK_MESSAGE(ref::same_bits(paired.y1.host().data(), apart.y1.host().data(), size_t(m) * d1), (tag + "kv rows"));
  CHECK_MESSAGE(paired.q.host() == apart.q.host(), (tag + "codes"));
  CHECK_MESSAGE(ref::same_bits(paired.s.host().data(), apart.s.host().data(), size_t(m) * (d0 / 32)), (tag + "scales"));
  CHECK_MESSAGE(paired.rec.host() == apart.rec.host(), (tag + "records"));
  CHECK_MESSAGE(ref::same_bits(paired.cs.host().data(), apart.cs.host().data(), size_t(m) * 64), (tag + "cos, sin"));
}

}  // namespace

TEST_CASE("fast finish_rows_pair: two chains of the same rows in one launch give the bits of two calls") {
  if (!have_gpu()) return;
  check_finish_pair(1, 1280, 512);  // the model's qr and kv rows
  check_finish_pair(5, 1280, 512);
  check_finish_pair(3, 512, 1536);  // the second chain the wider
}

TEST_CASE("fast finish_rows: the bits of RMSNorm, RoPE, fake quantization, records and codes run apart") {
  if (!have_gpu()) return;
  for (const bool kv : {true, false}) {
    check_finish(1, 512, kv);
    check_finish(1, 1536, kv);
    check_finish(7, 1024, kv);
    check_finish(300, 512, kv);
    check_finish(2, 96, kv);  // a row shorter than the block
  }
}
