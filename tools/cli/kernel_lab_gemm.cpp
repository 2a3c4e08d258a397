// The GEMM cases of `cedar kernel-lab` (kernel_lab.hpp): FP8 and W4A8 linear layers and the
// grouped expert GEMMs at the real V4.1 shapes. Each fast variant's output is compared with the
// CPU op on sampled rows (outputs poisoned first) and with the other variants bit for bit; then
// it is timed with CUDA events, cycling through enough weight copies (or expert routings) that
// every call streams its weights from HBM, not from the 50 MB L2 (cuBLASLt too). Times are
// taken in a CUDA graph (device time) and with one host launch per call.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string_view>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/experts_wg.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"
#include "tools/cli/kernel_lab.hpp"

namespace cedar::lab {
namespace {

namespace fast = cuda::fast;

/// Random weight bytes in a checkpoint format: e4m3 codes away from NaN or packed E2M1, and
/// UE8M0 scales near 2^-7.
struct host_weight {
  int n = 0, k = 0;
  bool fp4 = false;
  std::vector<uint8_t> data, scale;
  std::size_t data_bytes() const { return data.size(); }
  std::size_t scale_bytes() const { return scale.size(); }
};

host_weight random_weight(int n, int k, bool fp4, lab_rng& r) {
  host_weight w{n, k, fp4, {}, {}};
  w.data.resize(fp4 ? std::size_t(n) * k / 2 : std::size_t(n) * k);
  w.scale.resize(fp4 ? std::size_t(n) * (k / 32) : std::size_t((n + 31) / 32) * (k / 32));
  for (std::size_t i = 0; i < w.data.size(); i += 8) {
    const uint64_t bits = r.next();
    for (std::size_t j = 0; j < 8 && i + j < w.data.size(); ++j) {
      uint8_t b = uint8_t(bits >> (8 * j));
      if (!fp4 && (b & 0x7F) == 0x7F) b ^= 1;
      w.data[i + j] = b;
    }
  }
  for (uint8_t& s : w.scale) s = uint8_t(120 + int(r.next() % 5) - 2);
  return w;
}

/// |w[n][k]| decoded (exact), for the error bound.
struct abs_decoder {
  const host_weight& w;
  float e4m3[256], e2m1[16], ue8m0[256];
  explicit abs_decoder(const host_weight& hw) : w(hw) {
    for (int c = 0; c < 256; ++c) e4m3[c] = std::fabs(fmt::e4m3_to_f32(uint8_t(c)));
    for (int c = 0; c < 16; ++c) e2m1[c] = std::fabs(fmt::e2m1_to_f32(uint8_t(c)));
    for (int c = 0; c < 256; ++c) ue8m0[c] = fmt::ue8m0_to_f32(uint8_t(c));
  }
  float operator()(int n, int k) const {
    if (w.fp4) {
      const uint8_t b = w.data[(std::size_t(n) * w.k + k) / 2];
      return e2m1[(k & 1) ? b >> 4 : b & 0xF] * ue8m0[w.scale[std::size_t(n) * (w.k / 32) + k / 32]];
    }
    return e4m3[w.data[std::size_t(n) * w.k + k]] * ue8m0[w.scale[std::size_t(n / 32) * (w.k / 32) + k / 32]];
  }
};

/// The CPU op on one activation row: y [n] and sabs [n] = sum_k |xq_k w_nk|.
void reference_row(const float* x /*[k]*/, const host_weight& w, const abs_decoder& dec, float* y,
                   double* sabs) {
  if (w.fp4) cpu::linear_fp4(x, 1, fp4_weight{w.n, w.k, w.data.data(), w.scale.data()}, y);
  else cpu::linear_fp8(x, 1, fp8_weight{w.n, w.k, w.data.data(), w.scale.data()}, y);
  std::vector<float> xq(x, x + w.k);
  fmt::fake_quant_fp8(xq.data(), w.k);
  parallel_for(0, w.n, [&](int64_t n) {
    double s = 0;
    for (int k = 0; k < w.k; ++k) s += std::fabs(xq[k]) * dec(int(n), k);
    sabs[n] = s;
  });
}

/// Compares sampled output rows with their references; updates the case's verdict.
struct checker {
  std::vector<int> rows;             // sampled output rows (slots)
  std::vector<float> ref;            // [rows, n]
  std::vector<double> sabs;          // [rows, n]
  std::vector<float> first;          // the first fast variant's rows, for the bit comparison
  int n = 0;

  /// `samples` (at most `count`) evenly spaced rows of [0, count) with n outputs each; the
  /// references are left to fill.
  checker(int n_, int count, int samples) : n(n_) {
    samples = std::min(count, samples);
    for (int i = 0; i < samples; ++i) rows.push_back(int(int64_t(i) * (count - 1) / std::max(samples - 1, 1)));
    ref.resize(rows.size() * std::size_t(n));
    sabs.resize(ref.size());
  }

  /// A dense layer's checker: the reference outputs of sampled rows of x [m, w.k] through w.
  static checker dense(const host_weight& w, const std::vector<float>& x, int m, int samples) {
    checker c(w.n, m, samples);
    const abs_decoder dec(w);
    for (std::size_t i = 0; i < c.rows.size(); ++i)
      reference_row(x.data() + std::size_t(c.rows[i]) * w.k, w, dec, c.ref.data() + i * c.n, c.sabs.data() + i * c.n);
    return c;
  }

  void check(const float* y_dev /*[*, n]*/, lab_case& c, bool compare_bits) {
    std::vector<float> got(rows.size() * std::size_t(n));
    for (std::size_t i = 0; i < rows.size(); ++i)
      cuda::copy_to_host(got.data() + i * n, y_dev + std::size_t(rows[i]) * n, sizeof(float) * n);
    c.checked = true;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double d = std::fabs(double(got[i]) - ref[i]);
      const double ratio = sabs[i] > 0 ? d / sabs[i] : (d == 0 ? 0 : INFINITY);
      if (!(ratio <= err_bound)) c.pass = false;
      if (!(ratio <= c.max_err_ratio)) c.max_err_ratio = std::isnan(ratio) ? INFINITY : std::max(c.max_err_ratio, ratio);
    }
    if (!compare_bits) return;
    if (first.empty()) first = got;
    else c.same_bits = std::memcmp(first.data(), got.data(), got.size() * sizeof(float)) == 0;
  }
};

/// The device's codes and scales of the sampled rows must equal fmt::quantize_fp8's exactly.
void check_quant(const float* x /*[m, k]*/, const uint8_t* xq_dev, const float* xs_dev, const std::vector<int>& rows,
                 int k, lab_case& c) {
  std::vector<uint8_t> codes(k), ref_codes(k), ref_scale(k / 32);
  std::vector<float> scales(k / 32);
  c.checked = true;
  for (int r : rows) {
    cuda::copy_to_host(codes.data(), xq_dev + std::size_t(r) * k, k);
    cuda::copy_to_host(scales.data(), xs_dev + std::size_t(r) * (k / 32), sizeof(float) * (k / 32));
    fmt::quantize_fp8(x + std::size_t(r) * k, k, ref_codes.data(), ref_scale.data());
    if (codes != ref_codes) c.pass = false;
    for (int g = 0; g < k / 32; ++g)
      if (scales[g] != fmt::ue8m0_to_f32(ref_scale[g])) c.pass = false;
  }
}

/// The tiles the lab times: every tile of one summation order (bits compared among them), then
/// the stream tile (its own order; rows or slots a group up to fast::stream_max_slots).
constexpr fast::tile_kind lab_tiles[] = {fast::tile_kind::gemv,   fast::tile_kind::narrow, fast::tile_kind::narrow16,
                                         fast::tile_kind::narrow32, fast::tile_kind::split4, fast::tile_kind::split8,
                                         fast::tile_kind::skinny, fast::tile_kind::wide,   fast::tile_kind::stream};

// ---- dense linear layers ---------------------------------------------------------------------


void run_linear(const linear_shape& s, int m, bool fp4, lab_rng& r, std::vector<lab_case>& out) {
  const host_weight hw = random_weight(s.n, s.k, fp4, r);
  const std::vector<float> x = random_x(m, s.k, r);
  const std::size_t wbytes = hw.data_bytes() + hw.scale_bytes();
  const int copies = int(std::clamp<std::size_t>(l2_defeat_bytes() / wbytes + 1, 1, 64));
  std::vector<std::unique_ptr<dev_buf>> wcopies;
  for (int i = 0; i < copies; ++i) {
    wcopies.push_back(std::make_unique<dev_buf>(wbytes));
    cuda::copy_to_device(wcopies.back()->p, hw.data.data(), hw.data_bytes());
    cuda::copy_to_device(wcopies.back()->as<uint8_t>() + hw.data_bytes(), hw.scale.data(), hw.scale_bytes());
  }
  dev_buf xd(sizeof(float) * x.size()), xq(std::size_t(m) * s.k), xs(sizeof(float) * m * (s.k / 32)),
      y(sizeof(float) * std::size_t(m) * s.n);
  cuda::copy_to_device(xd.p, x.data(), sizeof(float) * x.size());
  fast::quantize_rows_fp8(xd.as<float>(), m, s.k, xq.as<uint8_t>(), xs.as<float>());

  checker chk = checker::dense(hw, x, m, 24);

  auto fp8w = [&](int i) {
    const uint8_t* base = wcopies[i % copies]->as<uint8_t>();
    return fp8_weight{s.n, s.k, base, base + hw.data_bytes()};
  };
  auto fp4w = [&](int i) {
    const uint8_t* base = wcopies[i % copies]->as<uint8_t>();
    return fp4_weight{s.n, s.k, base, base + hw.data_bytes()};
  };
  const double io_bytes = double(m) * s.k * (1 + 4.0 / 32) + 4.0 * m * s.n;
  auto record = [&](const char* variant, const std::function<void(int)>& fn, bool check, bool bits) {
    lab_case c{fp4 ? "linear_fp4" : "linear_fp8", variant, s.name, m, s.n, s.k};
    c.bytes = double(wbytes) + io_bytes;
    c.flops = 2.0 * m * s.n * s.k;
    if (check) {
      cuda::fill_bytes(y.p, 0xFF, sizeof(float) * std::size_t(m) * s.n);
      fn(0);
      cuda::synchronize();
      chk.check(y.as<float>(), c, bits);
    }
    time_case(fn, c);
    out.push_back(c);
  };

  for (fast::tile_kind t : lab_tiles) {
    if (t != fast::tile_kind::wide && m > 64) continue;
    if (t == fast::tile_kind::stream &&
        (m > fast::stream_max_slots || !fast::stream_shape(fp4, s.n, s.k) || !fast::stream_fits(fp4, m, s.k)))
      continue;
    record(fast::tile_name(t), [&](int i) {
      if (fp4) fast::gemm_fp4(xq.as<uint8_t>(), xs.as<float>(), m, fp4w(i), y.as<float>(), t);
      else fast::gemm_fp8(xq.as<uint8_t>(), xs.as<float>(), m, fp8w(i), y.as<float>(), t);
    }, true, t != fast::tile_kind::stream);
  }
  {
    lab_case c{"quant_fp8", "quant", s.name, m, 0, s.k};
    c.bytes = double(m) * s.k * (4 + 1 + 4.0 / 32);
    check_quant(x.data(), xq.as<uint8_t>(), xs.as<float>(), chk.rows, s.k, c);
    time_case([&](int) { fast::quantize_rows_fp8(xd.as<float>(), m, s.k, xq.as<uint8_t>(), xs.as<float>()); }, c);
    out.push_back(c);
  }
  if (m <= 64) {
    record("baseline", [&](int i) {
      if (fp4) cuda::linear_fp4(xd.as<float>(), m, fp4w(i), y.as<float>());
      else cuda::linear_fp8(xd.as<float>(), m, fp8w(i), y.as<float>());
    }, true, false);
  }
  fast::blaslt_gemm blas(m, s.n, s.k, copies);
  if (blas.ok()) {
    lab_case c{fp4 ? "linear_fp4" : "linear_fp8", "cublaslt_" + blas.dtype(), s.name, m, s.n, s.k};
    c.bytes = double(s.n) * s.k * (blas.dtype() == "fp8" ? 1 : 2);
    c.flops = 2.0 * m * s.n * s.k;
    time_case([&](int i) { blas.run(i); }, c);
    out.push_back(c);
  }
}

// ---- grouped expert GEMMs ------------------------------------------------------------------

/// One routing of `tokens` tokens to top-6 of 64 experts, grouped by expert on the host.
struct routing {
  std::vector<int32_t> slot_rows;   // token of each slot, slots grouped by expert
  std::vector<int> slot_expert;     // expert of each slot
  std::vector<fast::expert_group> groups;  // pointers filled per matrix
  std::vector<int> group_expert;
  int max_slots = 0;
};

routing make_routing(int tokens, int experts, int topk, lab_rng& r) {
  std::vector<std::vector<int32_t>> by_expert(experts);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> chosen;
    while (int(chosen.size()) < topk) {
      const int e = int(r.next() % experts);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int e : chosen) by_expert[e].push_back(t);
  }
  routing ro;
  for (int e = 0; e < experts; ++e) {
    if (by_expert[e].empty()) continue;
    fast::expert_group g;
    g.first_slot = int(ro.slot_rows.size());
    g.num_slots = int(by_expert[e].size());
    ro.max_slots = std::max(ro.max_slots, g.num_slots);
    ro.groups.push_back(g);
    ro.group_expert.push_back(e);
    for (int32_t t : by_expert[e]) ro.slot_rows.push_back(t), ro.slot_expert.push_back(e);
  }
  return ro;
}

/// Grouped W4A8 over `experts` weights [n, k] for one row count: up (x rows = tokens) or down
/// (x rows = slots).
constexpr int moe_experts = 64;

/// The expert bank of one matrix: host copies (for the reference) and one device array.
struct expert_bank {
  std::vector<host_weight> hw;
  std::vector<abs_decoder> dec;
  std::unique_ptr<dev_buf> dev;
  std::size_t data_bytes = 0, ebytes = 0;
};

expert_bank make_bank(int n, int k, lab_rng& r) {
  expert_bank b;
  for (int e = 0; e < moe_experts; ++e) b.hw.push_back(random_weight(n, k, true, r));
  for (int e = 0; e < moe_experts; ++e) b.dec.emplace_back(b.hw[e]);
  b.data_bytes = b.hw[0].data_bytes();
  b.ebytes = b.data_bytes + b.hw[0].scale_bytes();
  b.dev = std::make_unique<dev_buf>(b.ebytes * moe_experts);
  for (int e = 0; e < moe_experts; ++e) {
    cuda::copy_to_device(b.dev->as<uint8_t>() + e * b.ebytes, b.hw[e].data.data(), b.data_bytes);
    cuda::copy_to_device(b.dev->as<uint8_t>() + e * b.ebytes + b.data_bytes, b.hw[e].scale.data(),
                         b.hw[e].scale_bytes());
  }
  return b;
}

void run_grouped(const char* op, const expert_bank& bank, int tokens, bool down, lab_rng& r, std::vector<lab_case>& out,
                 const std::string& only_tile) {
  constexpr int experts = moe_experts, topk = 6, routings = 8;
  const int n = bank.hw[0].n, k = bank.hw[0].k;
  const std::vector<host_weight>& hw = bank.hw;
  const std::size_t data_bytes = bank.data_bytes, ebytes = bank.ebytes;
  const dev_buf& dbank = *bank.dev;
  std::vector<routing> ro;
  for (int i = 0; i < routings; ++i) ro.push_back(make_routing(tokens, experts, topk, r));
  const int slots = tokens * topk;
  const int x_rows = down ? slots : tokens;
  const std::vector<float> x = random_x(x_rows, k, r);
  dev_buf xd(sizeof(float) * x.size()), xq(std::size_t(x_rows) * k), xs(sizeof(float) * x_rows * (k / 32)),
      y(sizeof(float) * std::size_t(slots) * n);
  cuda::copy_to_device(xd.p, x.data(), sizeof(float) * x.size());
  fast::quantize_rows_fp8(xd.as<float>(), x_rows, k, xq.as<uint8_t>(), xs.as<float>());
  std::vector<std::unique_ptr<dev_buf>> rows_dev, groups_dev;
  for (routing& rt : ro) {
    if (down)  // x row of slot s is h[s]
      for (std::size_t s = 0; s < rt.slot_rows.size(); ++s) rt.slot_rows[s] = int32_t(s);
    for (std::size_t g = 0; g < rt.groups.size(); ++g) {
      const uint8_t* base = dbank.as<uint8_t>() + rt.group_expert[g] * ebytes;
      rt.groups[g].w = base;
      rt.groups[g].scale = base + data_bytes;
    }
    rows_dev.push_back(std::make_unique<dev_buf>(sizeof(int32_t) * slots));
    cuda::copy_to_device(rows_dev.back()->p, rt.slot_rows.data(), sizeof(int32_t) * slots);
    groups_dev.push_back(std::make_unique<dev_buf>(sizeof(fast::expert_group) * rt.groups.size()));
    cuda::copy_to_device(groups_dev.back()->p, rt.groups.data(), sizeof(fast::expert_group) * rt.groups.size());
  }
  checker chk(n, slots, 48);
  const routing& r0 = ro[0];
  for (std::size_t i = 0; i < chk.rows.size(); ++i) {
    const int s = chk.rows[i];
    reference_row(x.data() + std::size_t(r0.slot_rows[s]) * k, hw[r0.slot_expert[s]], bank.dec[r0.slot_expert[s]],
                  chk.ref.data() + i * n, chk.sabs.data() + i * n);
  }
  double touched = 0;
  for (const routing& rt : ro) touched += double(rt.groups.size()) / routings;
  int max_slots = 0;
  for (const routing& rt : ro) max_slots = std::max(max_slots, rt.max_slots);
  // the narrow tiles also on x's pairs (fast::fp4_x_pairs, made inside each timed call: the
  // model makes them once for w1 and w3): variant "<tile>.pairs"
  dev_buf xp(sizeof(uint16_t) * std::size_t(x_rows) * k), xf(sizeof(float) * std::size_t(x_rows) * (k / 128));
  for (fast::tile_kind t : lab_tiles)
    for (const bool pairs : {false, true}) {
      const std::string name = std::string(fast::tile_name(t)) + (pairs ? ".pairs" : "");
      if (pairs && !fast::takes_x_pairs(t)) continue;
      if (t != fast::tile_kind::wide && max_slots > 64 && only_tile != fast::tile_name(t) && only_tile != name)
        continue;
      if (t == fast::tile_kind::stream && (max_slots > fast::stream_max_slots || !fast::stream_shape(true, n, k) ||
                                           !fast::stream_fits(true, max_slots, k)))
        continue;
      if (!only_tile.empty() && only_tile != fast::tile_name(t) && only_tile != name) continue;
      auto fn = [&](int i) {
        const routing& rt = ro[i % routings];
        if (pairs) fast::fp4_x_pairs(xq.as<uint8_t>(), xs.as<float>(), x_rows, k, xp.as<uint16_t>(), xf.as<float>());
        fast::grouped_fp4(xq.as<uint8_t>(), xs.as<float>(), rows_dev[i % routings]->as<int32_t>(),
                          groups_dev[i % routings]->as<fast::expert_group>(), int(rt.groups.size()), slots,
                          rt.max_slots, n, k, y.as<float>(), t, pairs ? xp.as<uint16_t>() : nullptr,
                          pairs ? xf.as<float>() : nullptr);
      };
      lab_case c{op, name, "64 experts top-6", tokens, n, k};
      c.groups = int(std::lround(touched));
      c.bytes = touched * ebytes + double(x_rows) * k * (1 + 4.0 / 32) + 4.0 * slots * n;
      c.flops = 2.0 * slots * n * k;
      cuda::fill_bytes(y.p, 0xFF, sizeof(float) * std::size_t(slots) * n);
      fn(0);
      cuda::synchronize();
      chk.check(y.as<float>(), c, t != fast::tile_kind::stream);
      time_case(fn, c);
      out.push_back(c);
    }
}

// ---- prefill path and bf16 GEMV of the fast kernel set (fast::linear_*, fast::moe_ffn) ---------

/// Runs fn with the thresholds set to t, then restores them.
void with_tuning(const fast::tuning& t, const std::function<void()>& fn) {
  const fast::tuning saved = fast::tuning_now();
  fast::tuning_now() = t;
  fn();
  fast::tuning_now() = saved;
}

constexpr int never = 1 << 30;

/// One FP8 / W4A8 shape at m rows through the fast kernel set: the path the thresholds pick
/// ("fast"), and for the threshold sweep both paths forced ("gemv", "bf16"); at prefill sizes
/// the parts of the bf16 path (weight dequant, the cuBLAS GEMM alone) and cuBLASLt FP8 at the
/// same shape (per-tensor scales: the tensor-core ceiling).
void run_prefill_linear(const linear_shape& s, int m, bool fp4, lab_rng& r, std::vector<lab_case>& out) {
  const host_weight hw = random_weight(s.n, s.k, fp4, r);
  const std::vector<float> x = random_x(m, s.k, r);
  dev_buf wd(hw.data_bytes() + hw.scale_bytes());
  cuda::copy_to_device(wd.p, hw.data.data(), hw.data_bytes());
  cuda::copy_to_device(wd.as<uint8_t>() + hw.data_bytes(), hw.scale.data(), hw.scale_bytes());
  dev_buf xd(sizeof(float) * x.size()), y(sizeof(float) * std::size_t(m) * s.n);
  cuda::copy_to_device(xd.p, x.data(), sizeof(float) * x.size());
  const fp8_weight w8{s.n, s.k, wd.as<uint8_t>(), wd.as<uint8_t>() + hw.data_bytes()};
  const fp4_weight w4{s.n, s.k, wd.as<uint8_t>(), wd.as<uint8_t>() + hw.data_bytes()};
  checker chk = checker::dense(hw, x, m, 8);
  const std::string op = fp4 ? "prefill_fp4" : "prefill_fp8";
  const double flops = 2.0 * m * s.n * s.k;
  auto linear = [&] {
    if (fp4) fast::linear_fp4(xd.as<float>(), m, w4, y.as<float>());
    else fast::linear_fp8(xd.as<float>(), m, w8, y.as<float>());
  };
  auto record = [&](const char* variant, const fast::tuning& t, bool check) {
    with_tuning(t, [&] {
      lab_case c{op, variant, s.name, m, s.n, s.k};
      c.bytes = double(hw.data_bytes() + hw.scale_bytes()) + double(m) * s.k * 4 + 4.0 * m * s.n;
      c.flops = flops;
      if (check) {
        cuda::fill_bytes(y.p, 0xFF, sizeof(float) * std::size_t(m) * s.n);
        linear();
        cuda::synchronize();
        chk.check(y.as<float>(), c, false);
      }
      time_case([&](int) { linear(); }, c);
      out.push_back(c);
    });
  };
  record("fast", fast::tuning_now(), true);
  if (m <= 256) {
    record("gemv", {never, never, never, never}, true);
    record("bf16", {0, 0, 0, 0}, true);
  }
  if (m < 1024) return;
  {
    lab_case c{op, "dequant", s.name, m, s.n, s.k};
    dev_buf wb(std::size_t(2) * s.n * s.k);
    c.bytes = double(hw.data_bytes() + hw.scale_bytes()) + 2.0 * s.n * s.k;
    time_case([&](int) {
      if (fp4) fast::detail::dequant_bf16(w4, wb.as<uint16_t>());
      else fast::detail::dequant_bf16(w8, wb.as<uint16_t>());
    }, c);
    out.push_back(c);
    lab_case g{op, "gemm_bf16", s.name, m, s.n, s.k};
    dev_buf xb(std::size_t(2) * m * s.k);
    fast::detail::fake_quant_bf16(xd.as<float>(), s.k, nullptr, nullptr, m, s.k, xb.as<uint16_t>());
    g.flops = flops;
    time_case([&](int) {
      fast::detail::gemm_bf16(xb.as<uint16_t>(), s.k, m, wb.as<uint16_t>(), s.k, s.n, s.k, y.as<float>(), s.n, false);
    }, g);
    out.push_back(g);
  }
  fast::blaslt_gemm blas(m, s.n, s.k);
  if (blas.ok()) {
    lab_case c{op, "cublaslt_" + blas.dtype(), s.name, m, s.n, s.k};
    c.flops = flops;
    time_case([&](int) { blas.run(); }, c);
    out.push_back(c);
  }
}

/// fast::moe_ffn at `tokens` tokens: 64 experts, top-6, random routing, real V4.1 expert shapes
/// and the shared expert; timed launched one by one (the bf16 path copies 64 counts to the host,
/// which a graph cannot hold); 4 rows checked against cpu::moe_ffn on those rows alone. Variant
/// "fast" is the path the thresholds pick; up to 1024 tokens the grouped narrow stream
/// ("narrow"), the grouped skinny tile ("skinny") and the bf16 path ("bf16": the wgmma experts
/// where the device has them) are also forced, to place expert_gemv_max_rows and
/// expert_tiled_max_rows, with the wgmma experts' token tiles forced too ("wg16" to "wg256");
/// "cublas" is the bf16 path with a dequantized copy and a cuBLAS product per expert
/// (tuning::expert_wgmma off), at every count.
void run_moe_prefill(int tokens, lab_rng& r, std::vector<lab_case>& out) {
  constexpr int experts = moe_experts, topk = 6, d = 5120, inter = 2304;
  std::vector<host_weight> hw;
  for (int e = 0; e < experts; ++e)
    for (auto [n, k] : {std::pair{inter, d}, {inter, d}, {d, inter}}) hw.push_back(random_weight(n, k, true, r));
  const host_weight s1 = random_weight(inter, d, false, r), s3 = random_weight(inter, d, false, r),
                    s2 = random_weight(d, inter, false, r);
  std::vector<std::unique_ptr<dev_buf>> bufs;
  auto up = [&](const host_weight& h) {
    bufs.push_back(std::make_unique<dev_buf>(h.data_bytes() + h.scale_bytes()));
    cuda::copy_to_device(bufs.back()->p, h.data.data(), h.data_bytes());
    cuda::copy_to_device(bufs.back()->as<uint8_t>() + h.data_bytes(), h.scale.data(), h.scale_bytes());
    return std::pair{bufs.back()->as<const uint8_t>(), bufs.back()->as<const uint8_t>() + h.data_bytes()};
  };
  auto fp4v = [](const host_weight& h, std::pair<const uint8_t*, const uint8_t*> p) {
    return fp4_weight{h.n, h.k, p.first, p.second};
  };
  auto fp8v = [](const host_weight& h, std::pair<const uint8_t*, const uint8_t*> p) {
    return fp8_weight{h.n, h.k, p.first, p.second};
  };
  std::vector<cpu::expert_weights> dev_e(experts), host_e(experts);
  for (int e = 0; e < experts; ++e) {
    const host_weight *a = &hw[3 * e], *b = &hw[3 * e + 1], *c = &hw[3 * e + 2];
    dev_e[e] = {fp4v(*a, up(*a)), fp4v(*b, up(*b)), fp4v(*c, up(*c))};
    host_e[e] = {fp4v(*a, {a->data.data(), a->scale.data()}), fp4v(*b, {b->data.data(), b->scale.data()}),
                 fp4v(*c, {c->data.data(), c->scale.data()})};
  }
  const cpu::shared_expert_weights dev_s{fp8v(s1, up(s1)), fp8v(s3, up(s3)), fp8v(s2, up(s2))};
  const cpu::shared_expert_weights host_s{fp8v(s1, {s1.data.data(), s1.scale.data()}),
                                          fp8v(s3, {s3.data.data(), s3.scale.data()}),
                                          fp8v(s2, {s2.data.data(), s2.scale.data()})};
  const routing ro = make_routing(tokens, experts, topk, r);
  std::vector<int32_t> sel(std::size_t(tokens) * topk);
  std::vector<int> filled(tokens, 0);
  for (std::size_t s = 0; s < ro.slot_rows.size(); ++s) {
    const int t = ro.slot_rows[s];
    sel[std::size_t(t) * topk + filled[t]++] = ro.slot_expert[s];
  }
  std::vector<float> wts(sel.size());
  for (float& v : wts) v = float(0.1 + 0.3 * r.uniform());
  const std::vector<float> x = random_x(tokens, d, r);
  dev_buf xd(sizeof(float) * x.size()), sd(sizeof(int32_t) * sel.size()), wdv(sizeof(float) * wts.size()),
      y(sizeof(float) * std::size_t(tokens) * d);
  cuda::copy_to_device(xd.p, x.data(), sizeof(float) * x.size());
  cuda::copy_to_device(sd.p, sel.data(), sizeof(int32_t) * sel.size());
  cuda::copy_to_device(wdv.p, wts.data(), sizeof(float) * wts.size());
  auto run = [&](int) {
    fast::moe_ffn(xd.as<float>(), tokens, d, sd.as<int32_t>(), wdv.as<float>(), topk, dev_e.data(), experts, &dev_s,
                  10.0f, y.as<float>());
  };
  std::vector<std::vector<float>> refs;  // the CPU op on the checked rows, computed once
  const int checked_rows[] = {0, tokens / 3, tokens / 2, tokens - 1};
  for (int t : checked_rows) {
    refs.emplace_back(d);
    cpu::moe_ffn(x.data() + std::size_t(t) * d, 1, d, sel.data() + std::size_t(t) * topk,
                 wts.data() + std::size_t(t) * topk, topk, host_e.data(), experts, &host_s, 10.0f, refs.back().data());
  }
  auto measure = [&](const char* variant, const fast::tuning& t) {
    with_tuning(t, [&] {
      lab_case c{"moe_prefill", variant, "64 experts top-6 + shared", tokens, d, inter};
      c.groups = experts;
      c.flops = 2.0 * tokens * (topk + 1) * 3.0 * d * inter;
      cuda::fill_bytes(y.p, 0xFF, sizeof(float) * std::size_t(tokens) * d);
      run(0);
      cuda::synchronize();
      c.checked = true;
      std::vector<float> got(d);
      double worst = 0;
      for (std::size_t i = 0; i < refs.size(); ++i) {
        cuda::copy_to_host(got.data(), y.as<float>() + std::size_t(checked_rows[i]) * d, sizeof(float) * d);
        double max_ref = 0, max_err = 0;
        for (int j = 0; j < d; ++j) {
          max_ref = std::max(max_ref, double(std::fabs(refs[i][j])));
          max_err = std::max(max_err, std::isfinite(got[j]) ? std::fabs(double(got[j]) - refs[i][j]) : INFINITY);
        }
        worst = std::max(worst, max_err / std::max(max_ref, 1e-30));
      }
      c.max_err_ratio = worst;  // here: max |out - out_cpu| / max |out_cpu| of the row
      c.pass = worst <= 1.0 / 256;
      const double probe = fast::time_ms(run, 1, 2);
      c.eager_us = c.time_us = 1e3 * fast::time_ms(run, 0, std::clamp(int(200 / std::max(probe, 1e-3)), 2, 10));
      out.push_back(c);
    });
  };
  const fast::tuning now = fast::tuning_now();
  measure("fast", now);
  fast::tuning cublas = now;
  cublas.expert_wgmma = false;
  if (tokens > 1024) {
    if (now.expert_wgmma) measure("cublas", cublas);
    return;
  }
  fast::tuning narrow = now, skinny = now, bf16 = now;
  narrow.expert_gemv_max_rows = never, narrow.expert_wgmma = false;
  skinny.expert_gemv_max_rows = 0, skinny.expert_tiled_max_rows = never, skinny.expert_wgmma = false;
  bf16.expert_gemv_max_rows = 0, bf16.expert_tiled_max_rows = 0;
  measure("narrow", narrow);
  measure("skinny", skinny);
  measure("bf16", bf16);
  if (bf16.expert_wgmma)
    for (int tile : fast::detail::wg_tile_tokens) {
      fast::tuning wg = bf16;
      wg.expert_wg_tile = tile;
      measure(("wg" + std::to_string(tile)).c_str(), wg);
    }
  bf16.expert_wgmma = false;
  measure("cublas", bf16);
}

}  // namespace

std::size_t l2_defeat_bytes() {
  static const bool warm = [] {
    const char* v = std::getenv("CEDAR_LAB_L2_WARM");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return warm ? 0 : std::size_t(256) << 20;
}

/// Activations with a different magnitude per group of 32, so the FP8 scales differ.
std::vector<float> random_x(std::size_t rows, int k, lab_rng& r) {
  std::vector<float> x(rows * k);
  for (std::size_t g = 0; g < x.size() / 32; ++g) {
    const float mag = std::ldexp(1.0f, int(r.next() % 8) - 4);
    for (int i = 0; i < 32; ++i) x[g * 32 + i] = float(r.uniform() * 2 - 1) * mag;
  }
  return x;
}

/// Mean microseconds per call of fn(i), in a CUDA graph and launched one by one, iterations
/// chosen for about 10 ms of work.
void time_case(const std::function<void(int)>& fn, lab_case& c) {
  const double probe = fast::time_ms(fn, 2, 3);
  const int iters = std::clamp(int(10.0 / std::max(probe, 1e-3)), 3, 200);
  c.eager_us = 1e3 * fast::time_ms(fn, 1, iters);
  c.time_us = 1e3 * fast::graph_time_ms(fn, iters);
}

std::vector<lab_case> run_linear_cases(bool fp4, bool quick, const std::string& shape) {
  std::vector<int> ms = quick ? std::vector<int>{1, 64, 8192} : std::vector<int>{1, 8, 16, 64, 8192};
  std::vector<lab_case> out;
  lab_rng r{fp4 ? 41u : 40u};
  const auto run = [&](const auto& shapes) {
    for (const linear_shape& s : shapes)
      if (shape.empty() || shape == s.name)
        for (int m : ms) run_linear(s, m, fp4, r, out);
  };
  if (fp4) run(fp4_shapes);
  else run(fp8_shapes);
  return out;
}

std::vector<lab_case> run_moe_cases(bool quick, const moe_filter& filter) {
  std::vector<lab_case> out;
  lab_rng r{42};
  std::vector<int> tokens = quick ? std::vector<int>{1, 8192} : std::vector<int>{1, 16, 64, 256, 8192};
  if (filter.tokens > 0) tokens = {filter.tokens};
  {
    const expert_bank up = make_bank(4608, 5120, r);
    for (int t : tokens) run_grouped("moe_up", up, t, false, r, out, filter.tile);
  }
  const expert_bank down = make_bank(5120, 2304, r);
  for (int t : tokens) run_grouped("moe_down", down, t, true, r, out, filter.tile);
  return out;
}

std::vector<lab_case> run_prefill_cases(bool quick, int moe_tokens) {
  std::vector<lab_case> out;
  lab_rng r{43};
  if (moe_tokens > 0) {
    run_moe_prefill(moe_tokens, r, out);
    return out;
  }
  const std::vector<int> sweep = quick ? std::vector<int>{64, 128} : std::vector<int>{16, 32, 64, 128, 256};
  for (const linear_shape& s : fp8_shapes)
    if (std::string_view(s.name) != "square") run_prefill_linear(s, 8192, false, r, out);
  for (const linear_shape& s : fp4_shapes) run_prefill_linear(s, 8192, true, r, out);
  for (int m : sweep) {
    run_prefill_linear(fp8_shapes[3], m, false, r, out);
    run_prefill_linear(fp4_shapes[0], m, true, r, out);
  }
  run_gemv_weights(1, r, out);
  for (int t : quick ? std::vector<int>{256} : std::vector<int>{128, 256, 512, 1024}) run_moe_prefill(t, r, out);
  run_moe_prefill(8192, r, out);
  return out;
}

}  // namespace cedar::lab

#endif  // CEDAR_HAVE_CUDA

