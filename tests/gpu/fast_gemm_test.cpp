// GPU tests of the tensor-core linear layers (kernels/cuda/fast): every tile against the CPU op
// within 2^-16 of sum_k |xq_k w_k| per output, all tiles bit-identical to each other (so a row's
// bits never depend on m), grouped W4A8 equal to the dense op per expert, and the activation
// quantization bit-exact against fmt::quantize_fp8.
#include <memory>
#include <random>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/formats.hpp"
#include "tests/gpu/gpu_test_util.hpp"

namespace {

using namespace cedar;
using namespace cedar::gpu_test;
namespace fast = cuda::fast;

constexpr double bound = 1.0 / 65536;

/// s[r, n] = sum_k |xq[r, k]| |w[n, k]| (w dequantized [n, k]).
std::vector<double> abs_products(const std::vector<float>& x, int m, int k, const std::vector<float>& w, int n) {
  std::vector<double> s(std::size_t(m) * n);
  std::vector<float> xq(k);
  for (int r = 0; r < m; ++r) {
    std::copy(x.begin() + std::size_t(r) * k, x.begin() + std::size_t(r + 1) * k, xq.begin());
    fmt::fake_quant_fp8(xq.data(), k);
    for (int c = 0; c < n; ++c) {
      double acc = 0;
      for (int i = 0; i < k; ++i) acc += std::fabs(double(xq[i]) * w[std::size_t(c) * k + i]);
      s[std::size_t(r) * n + c] = acc;
    }
  }
  return s;
}

/// x [m, k] on the device with its FP8 codes and scales (fast::quantize_rows_fp8).
struct quantized_x {
  dev<float> x;
  dev<uint8_t> q;
  dev<float> s;
  quantized_x(const std::vector<float>& host, int m, int k)
      : x(host), q(std::size_t(m) * k), s(std::size_t(m) * (k / 32)) {
    fast::quantize_rows_fp8(x.get(), m, k, q.get(), s.get());
  }
};

/// A random FP8 or W4A8 weight [n, k] on the host (dequantized too) and on the device, with the
/// CPU op's output for x and the GEMM of a tile.
struct test_weight {
  bool fp4;
  op_reference::owned_fp8 w8;
  op_reference::owned_fp4 w4;
  std::vector<float> wd;
  dev_fp8 d8;
  dev_fp4 d4;
  test_weight(std::mt19937_64& rng, bool fp4_, int n, int k)
      : fp4(fp4_), w8(op_reference::random_fp8(rng, n, k)), w4(op_reference::random_fp4(rng, n, k)),
        wd(fp4 ? op_reference::dequant(w4.view) : op_reference::dequant(w8.view)), d8(w8), d4(w4) {}
  std::vector<float> cpu_op(const std::vector<float>& x, int m) const {
    std::vector<float> y(std::size_t(m) * (fp4 ? w4.view.out : w8.view.out));
    if (fp4) cpu::linear_fp4(x.data(), m, w4.view, y.data());
    else cpu::linear_fp8(x.data(), m, w8.view, y.data());
    return y;
  }
  void gemm(const uint8_t* xq, const float* xs, int m, float* y, fast::tile_kind t) const {
    if (fp4) fast::gemm_fp4(xq, xs, m, d4.view, y, t);
    else fast::gemm_fp8(xq, xs, m, d8.view, y, t);
  }
};

}  // namespace

TEST_CASE("fast gemm: the tiles' mma, written as two f16 products, gives the e4m3 instruction's bits") {
  if (!have_gpu()) return;
  // 4096 warps x 128 outputs of random codes, a quarter of them with mostly zero weights
  CHECK(fast::mma_form_mismatches(4096, 20261130) == 0);
  CHECK(fast::mma_form_mismatches(4096, 7) == 0);
}

TEST_CASE("fast gemm: the narrow tile's one-wave and many-wave forms give a row the same bits") {
  // n = 16384: 256 blocks of 64 rows at m <= 8 (one wave on a GPU of 64 SMs or more: 2 warps of
  // 32 rows), 768 at m = 24 (more than 4 blocks an SM of fewer than 192 SMs: 4 warps of 16)
  if (!have_gpu()) return;
  std::mt19937_64 rng(77);
  const int n = 16384, k = 512, m = 24;
  for (bool fp4 : {false, true}) {
    const test_weight w(rng, fp4, n, k);
    const std::vector<float> x = activations(rng, m, k);
    dev<float> xd(x);
    dev<uint8_t> xq(std::size_t(m) * k);
    dev<float> xs(std::size_t(m) * (k / 32));
    fast::quantize_rows_fp8(xd.get(), m, k, xq.get(), xs.get());
    dev<float> many(std::size_t(m) * n), one(std::size_t(8) * n);
    w.gemm(xq.get(), xs.get(), m, many.get(), fast::tile_kind::narrow);
    w.gemm(xq.get(), xs.get(), 8, one.get(), fast::tile_kind::narrow);
    const std::vector<float> got = many.host();
    const std::string what = std::string(fp4 ? "gemm_fp4" : "gemm_fp8") + " narrow m=24";
    check_bound(what, got, w.cpu_op(x, m), abs_products(x, m, k, w.wd, n), bound);
    CHECK_MESSAGE(op_reference::same_bits(one.host().data(), got.data(), std::size_t(8) * n), (what + " vs m=8"));
  }
}

TEST_CASE("fast gemm: every tile within 2^-16 of the CPU op, all tiles give the same bits") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(31);
  const int n = 256, k = 768;
  for (bool fp4 : {false, true}) {
    const test_weight w(rng, fp4, n, k);
    for (int m : {1, 5, 37, 130}) {
      const std::vector<float> x = activations(rng, m, k);
      const std::vector<float> ref = w.cpu_op(x, m);
      const std::vector<double> sabs = abs_products(x, m, k, w.wd, n);
      dev<float> xd(x);
      dev<uint8_t> xq(std::size_t(m) * k);
      dev<float> xs(std::size_t(m) * (k / 32));
      fast::quantize_rows_fp8(xd.get(), m, k, xq.get(), xs.get());
      std::vector<uint8_t> codes(std::size_t(m) * k), scale_codes(std::size_t(m) * (k / 32));
      fmt::quantize_fp8(x.data(), m * k, codes.data(), scale_codes.data());
      std::vector<float> scales(scale_codes.size());
      for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = fmt::ue8m0_to_f32(scale_codes[i]);
      check_equal("quantize_rows_fp8 codes m=" + std::to_string(m), xq.host(), codes);
      check_equal("quantize_rows_fp8 scales m=" + std::to_string(m), xs.host(), scales);
      std::vector<float> first;
      for (fast::tile_kind t : fast::all_tiles) {
        dev<float> y(std::size_t(m) * n);
        w.gemm(xq.get(), xs.get(), m, y.get(), t);
        const std::vector<float> got = y.host();
        const std::string what = std::string(fp4 ? "gemm_fp4 " : "gemm_fp8 ") + fast::tile_name(t) + " m=" + std::to_string(m);
        check_bound(what, got, ref, sabs, bound);
        if (first.empty()) first = got;
        else CHECK_MESSAGE(op_reference::same_bits(first.data(), got.data(), got.size()), (what + " vs gemv bits"));
      }
    }
  }
}

/// Slots of `tokens` tokens over the experts dw: expert e takes the tokens t with
/// t % experts <= e (expert 0 the fewest), in token order.
struct expert_slots {
  std::vector<int32_t> slot_rows;
  std::vector<fast::expert_group> groups;
  int max_slots = 0;
  expert_slots(const std::vector<std::unique_ptr<dev_fp4>>& dw, int tokens) {
    const int experts = int(dw.size());
    for (int e = 0; e < experts; ++e) {
      fast::expert_group g{dw[e]->view.data, dw[e]->view.scale, int(slot_rows.size()), 0};
      for (int t = 0; t < tokens; ++t)
        if (t % experts <= e) slot_rows.push_back(t), ++g.num_slots;
      max_slots = std::max(max_slots, g.num_slots);
      groups.push_back(g);
    }
  }
};

TEST_CASE("fast grouped_fp4: each expert's slots equal gemm_fp4 on its rows, bit for bit") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(32);
  const int n = 256, k = 512, experts = 5, tokens = 23;
  std::vector<op_reference::owned_fp4> hw;
  for (int e = 0; e < experts; ++e) hw.push_back(op_reference::random_fp4(rng, n, k));
  std::vector<std::unique_ptr<dev_fp4>> dw;
  for (const auto& w : hw) dw.push_back(std::make_unique<dev_fp4>(w));
  const expert_slots es(dw, tokens);
  const std::vector<int32_t>& slot_rows = es.slot_rows;
  const std::vector<fast::expert_group>& groups = es.groups;
  const int max_slots = es.max_slots, slots = int(slot_rows.size());
  const quantized_x qx(activations(rng, tokens, k), tokens, k);
  const uint8_t* xq = qx.q.get();
  const float* xs = qx.s.get();
  const std::vector<uint8_t> xq_host = qx.q.host();
  const std::vector<float> xs_host = qx.s.host();
  dev<int32_t> rows_d(slot_rows);
  dev<fast::expert_group> groups_d(groups);
  for (fast::tile_kind t : fast::all_tiles) {
    dev<float> y(std::size_t(slots) * n);
    fast::grouped_fp4(xq, xs, rows_d.get(), groups_d.get(), experts, slots, max_slots, n, k, y.get(), t);
    const std::vector<float> got = y.host();
    bool same = true;
    for (int e = 0; e < experts; ++e) {
      // the expert's rows gathered on the host, then the dense op with the same tile
      std::vector<uint8_t> gq;
      std::vector<float> gs;
      for (int s = groups[e].first_slot; s < groups[e].first_slot + groups[e].num_slots; ++s) {
        gq.insert(gq.end(), xq_host.begin() + std::size_t(slot_rows[s]) * k, xq_host.begin() + std::size_t(slot_rows[s] + 1) * k);
        gs.insert(gs.end(), xs_host.begin() + std::size_t(slot_rows[s]) * (k / 32),
                  xs_host.begin() + std::size_t(slot_rows[s] + 1) * (k / 32));
      }
      dev<uint8_t> gq_d(gq);
      dev<float> gs_d(gs);
      dev<float> ye(std::size_t(groups[e].num_slots) * n);
      fast::gemm_fp4(gq_d.get(), gs_d.get(), groups[e].num_slots, dw[e]->view, ye.get(), t);
      const std::vector<float> want = ye.host();
      same = same && op_reference::same_bits(want.data(), got.data() + std::size_t(groups[e].first_slot) * n, want.size());
    }
    std::printf("  grouped_fp4 %-8s %d experts, %d slots: %s\n", fast::tile_name(t), experts, slots,
                same ? "identical to gemm_fp4" : "DIFFERENT");
    CHECK_MESSAGE(same, fast::tile_name(t));
  }
}

TEST_CASE("fast grouped_fp4 on x's pairs: the narrow tiles give the codes' bits, in one wave and in several") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(34);
  const int k = 768, experts = 5, tokens = 21;  // 6 summation chunks, 3 stages of 256
  // x's 32-blocks scaled by 2^0 .. 2^-13 (a chunk's scales up to 2^13 apart: the pairs stay exact)
  std::vector<float> x = activations(rng, tokens, k);
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < k; ++c) x[std::size_t(t) * k + c] *= std::ldexp(1.0f, -int((t * 5 + c / 32 * 7) % 14));
  const quantized_x qx(x, tokens, k);
  dev<uint16_t> pairs(std::size_t(tokens) * k);
  dev<float> factors(std::size_t(tokens) * (k / 128));
  fast::fp4_x_pairs(qx.q.get(), qx.s.get(), tokens, k, pairs.get(), factors.get());
  for (int n : {256, 8192}) {  // 4 or 128 blocks a group and slot tile: all at once, or in waves
    std::vector<op_reference::owned_fp4> hw;
    std::vector<std::unique_ptr<dev_fp4>> dw;
    for (int e = 0; e < experts; ++e) hw.push_back(op_reference::random_fp4(rng, n, k));
    for (const auto& w : hw) dw.push_back(std::make_unique<dev_fp4>(w));
    const expert_slots es(dw, tokens);
    const int max_slots = es.max_slots, slots = int(es.slot_rows.size());
    dev<int32_t> rows_d(es.slot_rows);
    dev<fast::expert_group> groups_d(es.groups);
    for (fast::tile_kind t : {fast::tile_kind::narrow, fast::tile_kind::narrow16, fast::tile_kind::narrow32}) {
      dev<float> codes_y(std::size_t(slots) * n), pairs_y(std::size_t(slots) * n);
      fast::grouped_fp4(qx.q.get(), qx.s.get(), rows_d.get(), groups_d.get(), experts, slots, max_slots, n, k,
                        codes_y.get(), t);
      fast::grouped_fp4(qx.q.get(), qx.s.get(), rows_d.get(), groups_d.get(), experts, slots, max_slots, n, k,
                        pairs_y.get(), t, pairs.get(), factors.get());
      const std::vector<float> want = codes_y.host(), got = pairs_y.host();
      const bool same = op_reference::same_bits(want.data(), got.data(), want.size());
      std::printf("  grouped_fp4 %-8s on pairs, n=%d: %s\n", fast::tile_name(t), n,
                  same ? "identical to the codes" : "DIFFERENT");
      CHECK_MESSAGE(same, fast::tile_name(t) << " n=" << n);
    }
  }
}

TEST_CASE("fast gemm_fp8_set: several weights of one x in one launch give each weight's own bits, every set tile") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(33);
  const int k = 640;  // 5 chunks: the split tiles' last stage is partly empty
  const int outs[] = {256, 48, 1280};  // member block counts 2, 1, 10: the column split is uneven
  std::vector<op_reference::owned_fp8> hw;
  std::vector<std::unique_ptr<dev_fp8>> dw;
  for (int n : outs) hw.push_back(op_reference::random_fp8(rng, n, k));
  for (const auto& w : hw) dw.push_back(std::make_unique<dev_fp8>(w));
  for (int m : {1, 3, 12}) {  // the one- and two-slot-tile GEMVs, two slot tiles of the split ones
    const quantized_x qx(activations(rng, m, k), m, k);
    for (int count : {1, 2, 3}) {
      std::vector<const fp8_weight*> w;
      for (int i = 0; i < count; ++i) w.push_back(&dw[i]->view);
      std::vector<std::vector<float>> want;
      for (int i = 0; i < count; ++i) {
        dev<float> alone(std::size_t(m) * outs[i]);
        fast::gemm_fp8(qx.q.get(), qx.s.get(), m, dw[i]->view, alone.get(), fast::tile_kind::gemv);
        want.push_back(alone.host());
      }
      const auto check_set = [&](const std::string& how, const std::vector<std::unique_ptr<dev<float>>>& ys) {
        for (int i = 0; i < count; ++i) {
          const std::vector<float> got = ys[i]->host();
          const std::string what =
              how + " m=" + std::to_string(m) + " count=" + std::to_string(count) + " member " + std::to_string(i);
          CHECK_MESSAGE(op_reference::same_bits(want[i].data(), got.data(), got.size()), what);
        }
      };
      const auto outputs = [&] {
        std::vector<std::unique_ptr<dev<float>>> ys;
        for (int i = 0; i < count; ++i) ys.push_back(std::make_unique<dev<float>>(std::size_t(m) * outs[i]));
        return ys;
      };
      const auto pointers = [&](const std::vector<std::unique_ptr<dev<float>>>& ys) {
        std::vector<float*> y;
        for (const auto& d : ys) y.push_back(d->get());
        return y;
      };
      for (fast::tile_kind t : {fast::tile_kind::gemv, fast::tile_kind::split4, fast::tile_kind::split8}) {
        const auto ys = outputs();
        fast::gemm_fp8_set(qx.q.get(), qx.s.get(), m, count, w.data(), pointers(ys).data(), t);
        check_set(std::string("gemm_fp8_set ") + fast::tile_name(t), ys);
      }
      // and through the linear op (x quantized inside), with K below and at split_min_k
      fast::tuning& tune = fast::tuning_now();
      const fast::tuning saved = tune;
      for (int min_k : {saved.split_min_k, k}) {
        tune.split_min_k = min_k;
        const auto ls = outputs();
        fast::linear_fp8_set(qx.x.get(), m, count, w.data(), pointers(ls).data());
        check_set("linear_fp8_set split_min_k=" + std::to_string(min_k), ls);
      }
      tune = saved;
    }
  }
}

TEST_CASE("fast grouped_fp4_pair: two products of one x in one launch give grouped_fp4's bits, every tile") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(34);
  const int n = 256, k = 512, experts = 4, tokens = 19;
  std::vector<op_reference::owned_fp4> ha, hb;
  std::vector<std::unique_ptr<dev_fp4>> da, db;
  for (int e = 0; e < experts; ++e) ha.push_back(op_reference::random_fp4(rng, n, k)), hb.push_back(op_reference::random_fp4(rng, n, k));
  for (int e = 0; e < experts; ++e) da.push_back(std::make_unique<dev_fp4>(ha[e])), db.push_back(std::make_unique<dev_fp4>(hb[e]));
  std::vector<int32_t> slot_rows;
  std::vector<fast::expert_group> ga, gb;
  int max_slots = 0;
  for (int e = 0; e < experts; ++e) {  // expert e takes the tokens t with t % experts != e
    fast::expert_group a{da[e]->view.data, da[e]->view.scale, int(slot_rows.size()), 0};
    for (int t = 0; t < tokens; ++t)
      if (t % experts != e) slot_rows.push_back(t), ++a.num_slots;
    fast::expert_group b = a;
    b.w = db[e]->view.data, b.scale = db[e]->view.scale;
    ga.push_back(a), gb.push_back(b);
    max_slots = std::max(max_slots, a.num_slots);
  }
  const int slots = int(slot_rows.size());
  const quantized_x qx(activations(rng, tokens, k), tokens, k);
  const uint8_t* xq = qx.q.get();
  const float* xs = qx.s.get();
  dev<int32_t> rows_d(slot_rows);
  dev<fast::expert_group> ga_d(ga), gb_d(gb);
  for (fast::tile_kind t : fast::all_tiles) {
    dev<float> ya(std::size_t(slots) * n), yb(std::size_t(slots) * n), wa(std::size_t(slots) * n), wb(std::size_t(slots) * n);
    fast::grouped_fp4_pair(xq, xs, rows_d.get(), ga_d.get(), gb_d.get(), experts, slots, max_slots, n, k,
                           ya.get(), yb.get(), t);
    fast::grouped_fp4(xq, xs, rows_d.get(), ga_d.get(), experts, slots, max_slots, n, k, wa.get(), t);
    fast::grouped_fp4(xq, xs, rows_d.get(), gb_d.get(), experts, slots, max_slots, n, k, wb.get(), t);
    const std::vector<float> got_a = ya.host(), got_b = yb.host(), want_a = wa.host(), want_b = wb.host();
    CHECK_MESSAGE(op_reference::same_bits(want_a.data(), got_a.data(), want_a.size()), fast::tile_name(t));
    CHECK_MESSAGE(op_reference::same_bits(want_b.data(), got_b.data(), want_b.size()), fast::tile_name(t));
    CHECK_MESSAGE(!op_reference::same_bits(got_a.data(), got_b.data(), got_a.size()), "the two weights differ");
  }
}

TEST_CASE("fast stream tile: within 2^-16 of the CPU op at 1 to 8 rows, a row's bits whatever the other rows") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(35);
  // n: blocks of 64 rows with a partial last one; k: FP4 3 steps of 256 (fewer than the ring of
  // steps in flight), FP8 6 steps of 128 (a full ring and a partial one)
  const int n = 208, k = 768;
  for (bool fp4 : {false, true}) {
    const test_weight w(rng, fp4, n, k);
    const auto run = [&](const uint8_t* xq, const float* xs, int m, float* y) {
      w.gemm(xq, xs, m, y, fast::tile_kind::stream);
    };
    for (int m : {1, 2, 3, 4, 5, 8}) {
      const std::vector<float> x = activations(rng, m, k);
      const std::vector<float> ref = w.cpu_op(x, m);
      const quantized_x qx(x, m, k);
      dev<float> y(std::size_t(m) * n);
      cuda::fill_bytes(y.get(), 0xFF, sizeof(float) * std::size_t(m) * n);
      run(qx.q.get(), qx.s.get(), m, y.get());
      const std::vector<float> got = y.host();
      const std::string what = std::string(fp4 ? "stream fp4" : "stream fp8") + " m=" + std::to_string(m);
      check_bound(what, got, ref, abs_products(x, m, k, w.wd, n), bound);
      // each row alone gives the same bits
      for (int r = 0; r < m; ++r) {
        dev<float> y1(n);
        run(qx.q.get() + std::size_t(r) * k, qx.s.get() + std::size_t(r) * (k / 32), 1, y1.get());
        CHECK_MESSAGE(op_reference::same_bits(y1.host().data(), got.data() + std::size_t(r) * n, n),
                      (what + " row " + std::to_string(r) + " alone"));
      }
    }
  }
}

TEST_CASE("fast stream tile: grouped W4A8 and its pair equal each expert's dense product; FP8 sets each weight's") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(36);
  const int n = 192, k = 512, experts = 6, tokens = 8;
  std::vector<op_reference::owned_fp4> ha, hb;
  std::vector<std::unique_ptr<dev_fp4>> da, db;
  for (int e = 0; e < experts; ++e) {
    ha.push_back(op_reference::random_fp4(rng, n, k)), hb.push_back(op_reference::random_fp4(rng, n, k));
    da.push_back(std::make_unique<dev_fp4>(ha[e])), db.push_back(std::make_unique<dev_fp4>(hb[e]));
  }
  // expert e takes e + 1 of the tokens (1 to 6 slots), from token e on, wrapping
  std::vector<int32_t> slot_rows;
  std::vector<fast::expert_group> ga, gb;
  int max_slots = 0;
  for (int e = 0; e < experts; ++e) {
    fast::expert_group a{da[e]->view.data, da[e]->view.scale, int(slot_rows.size()), e + 1};
    for (int i = 0; i <= e; ++i) slot_rows.push_back((e + i) % tokens);
    fast::expert_group b = a;
    b.w = db[e]->view.data, b.scale = db[e]->view.scale;
    ga.push_back(a), gb.push_back(b);
    max_slots = std::max(max_slots, a.num_slots);
  }
  const int slots = int(slot_rows.size());
  const quantized_x qx(activations(rng, tokens, k), tokens, k);
  const std::vector<uint8_t> xq_host = qx.q.host();
  const std::vector<float> xs_host = qx.s.host();
  dev<int32_t> rows_d(slot_rows);
  dev<fast::expert_group> ga_d(ga), gb_d(gb);
  const fast::tile_kind t = fast::tile_kind::stream;
  dev<float> ya(std::size_t(slots) * n), yb(std::size_t(slots) * n), wa(std::size_t(slots) * n);
  fast::grouped_fp4_pair(qx.q.get(), qx.s.get(), rows_d.get(), ga_d.get(), gb_d.get(), experts, slots, max_slots, n, k,
                         ya.get(), yb.get(), t);
  fast::grouped_fp4(qx.q.get(), qx.s.get(), rows_d.get(), ga_d.get(), experts, slots, max_slots, n, k, wa.get(), t);
  const std::vector<float> got_a = ya.host(), got_b = yb.host(), alone_a = wa.host();
  CHECK_MESSAGE(op_reference::same_bits(alone_a.data(), got_a.data(), got_a.size()), "pair vs grouped_fp4");
  for (int e = 0; e < experts; ++e) {
    std::vector<uint8_t> gq;
    std::vector<float> gs;
    for (int s = ga[e].first_slot; s < ga[e].first_slot + ga[e].num_slots; ++s) {
      const auto row = xq_host.begin() + std::size_t(slot_rows[s]) * k;
      gq.insert(gq.end(), row, row + k);
      gs.insert(gs.end(), xs_host.begin() + std::size_t(slot_rows[s]) * (k / 32),
                xs_host.begin() + std::size_t(slot_rows[s] + 1) * (k / 32));
    }
    dev<uint8_t> gq_d(gq);
    dev<float> gs_d(gs);
    for (int which = 0; which < 2; ++which) {
      dev<float> ye(std::size_t(ga[e].num_slots) * n);
      fast::gemm_fp4(gq_d.get(), gs_d.get(), ga[e].num_slots, (which ? db : da)[e]->view, ye.get(), t);
      const std::vector<float> want = ye.host();
      const float* got = (which ? got_b : got_a).data() + std::size_t(ga[e].first_slot) * n;
      CHECK_MESSAGE(op_reference::same_bits(want.data(), got, want.size()),
                    ("expert " + std::to_string(e) + (which ? " w3" : " w1")));
    }
  }
  // dense FP8 sets of one x: each member's bits alone
  const int outs[] = {256, 80, 1280};
  std::vector<op_reference::owned_fp8> h8;
  std::vector<std::unique_ptr<dev_fp8>> d8;
  for (int o : outs) {
    h8.push_back(op_reference::random_fp8(rng, o, k));
    d8.push_back(std::make_unique<dev_fp8>(h8.back()));
  }
  for (int m : {1, 6}) {
    std::vector<const fp8_weight*> w;
    std::vector<std::unique_ptr<dev<float>>> ys;
    std::vector<float*> yp;
    for (int i = 0; i < 3; ++i) {
      w.push_back(&d8[i]->view);
      ys.push_back(std::make_unique<dev<float>>(std::size_t(m) * outs[i]));
      yp.push_back(ys.back()->get());
    }
    fast::gemm_fp8_set(qx.q.get(), qx.s.get(), m, 3, w.data(), yp.data(), t);
    for (int i = 0; i < 3; ++i) {
      dev<float> alone(std::size_t(m) * outs[i]);
      fast::gemm_fp8(qx.q.get(), qx.s.get(), m, d8[i]->view, alone.get(), t);
      CHECK_MESSAGE(op_reference::same_bits(alone.host().data(), ys[i]->host().data(), std::size_t(m) * outs[i]),
                    ("gemm_fp8_set stream m=" + std::to_string(m) + " member " + std::to_string(i)));
    }
  }
}
