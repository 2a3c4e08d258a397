// The GEMM cases of `cedar kernel-lab` (kernel_lab.hpp): FP8 and W4A8 linear layers and the
// grouped expert GEMMs at the real V4.1 shapes. Each fast variant's output is compared with the
// CPU op on sampled rows (outputs poisoned first) and with the other variants bit for bit; then
// it is timed with CUDA events, cycling through enough weight copies (or expert routings) that
// every call streams its weights from HBM, not from the 50 MB L2 (cuBLASLt too). Times are
// taken in a CUDA graph (device time) and with one host launch per call.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"
#include "tools/cli/kernel_lab.hpp"

namespace cedar::lab {
namespace {

namespace fast = cuda::fast;

struct rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1p-53; }
};

/// Activations with a different magnitude per group of 32, so the FP8 scales differ.
std::vector<float> random_x(std::size_t rows, int k, rng& r) {
  std::vector<float> x(rows * k);
  for (std::size_t g = 0; g < x.size() / 32; ++g) {
    const float mag = std::ldexp(1.0f, int(r.next() % 8) - 4);
    for (int i = 0; i < 32; ++i) x[g * 32 + i] = float(r.uniform() * 2 - 1) * mag;
  }
  return x;
}

/// Random weight bytes in a checkpoint format: e4m3 codes away from NaN or packed E2M1, and
/// UE8M0 scales near 2^-7.
struct host_weight {
  int n = 0, k = 0;
  bool fp4 = false;
  std::vector<uint8_t> data, scale;
  std::size_t data_bytes() const { return data.size(); }
  std::size_t scale_bytes() const { return scale.size(); }
};

host_weight random_weight(int n, int k, bool fp4, rng& r) {
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

/// Device buffer freed on scope exit.
struct dev_buf {
  void* p = nullptr;
  explicit dev_buf(std::size_t bytes) : p(cuda::device_alloc(bytes)) {}
  ~dev_buf() { cuda::device_free(p); }
  dev_buf(const dev_buf&) = delete;
  dev_buf& operator=(const dev_buf&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

/// Compares sampled output rows with their references; updates the case's verdict.
struct checker {
  std::vector<int> rows;             // sampled output rows (slots)
  std::vector<float> ref;            // [rows, n]
  std::vector<double> sabs;          // [rows, n]
  std::vector<float> first;          // the first fast variant's rows, for the bit comparison
  int n = 0;

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

/// Mean microseconds per call of fn(i), in a CUDA graph and launched one by one, iterations
/// chosen for about 10 ms of work.
void time_case(const std::function<void(int)>& fn, lab_case& c) {
  const double probe = fast::time_ms(fn, 2, 3);
  const int iters = std::clamp(int(10.0 / std::max(probe, 1e-3)), 3, 200);
  c.eager_us = 1e3 * fast::time_ms(fn, 1, iters);
  c.time_us = 1e3 * fast::graph_time_ms(fn, iters);
}

constexpr std::size_t l2_defeat_bytes = 256u << 20;

// ---- dense linear layers ---------------------------------------------------------------------

struct linear_shape {
  const char* name;
  int n, k;
};

void run_linear(const linear_shape& s, int m, bool fp4, rng& r, std::vector<lab_case>& out) {
  const host_weight hw = random_weight(s.n, s.k, fp4, r);
  const std::vector<float> x = random_x(m, s.k, r);
  const std::size_t wbytes = hw.data_bytes() + hw.scale_bytes();
  const int copies = int(std::clamp<std::size_t>(l2_defeat_bytes / wbytes + 1, 1, 64));
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

  checker chk;
  chk.n = s.n;
  const int samples = std::min(m, 24);
  for (int i = 0; i < samples; ++i) chk.rows.push_back(int(int64_t(i) * (m - 1) / std::max(samples - 1, 1)));
  chk.ref.resize(chk.rows.size() * std::size_t(s.n));
  chk.sabs.resize(chk.ref.size());
  const abs_decoder dec(hw);
  for (std::size_t i = 0; i < chk.rows.size(); ++i)
    reference_row(x.data() + std::size_t(chk.rows[i]) * s.k, hw, dec, chk.ref.data() + i * s.n,
                  chk.sabs.data() + i * s.n);

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

  for (fast::tile_kind t : {fast::tile_kind::gemv, fast::tile_kind::skinny, fast::tile_kind::wide}) {
    if ((t == fast::tile_kind::gemv && m > 16) || (t == fast::tile_kind::skinny && m > 64)) continue;
    record(fast::tile_name(t), [&](int i) {
      if (fp4) fast::gemm_fp4(xq.as<uint8_t>(), xs.as<float>(), m, fp4w(i), y.as<float>(), t);
      else fast::gemm_fp8(xq.as<uint8_t>(), xs.as<float>(), m, fp8w(i), y.as<float>(), t);
    }, true, true);
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

routing make_routing(int tokens, int experts, int topk, rng& r) {
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

expert_bank make_bank(int n, int k, rng& r) {
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

void run_grouped(const char* op, const expert_bank& bank, int tokens, bool down, rng& r,
                 std::vector<lab_case>& out) {
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
  checker chk;
  chk.n = n;
  const routing& r0 = ro[0];
  const int samples = std::min(slots, 48);
  for (int i = 0; i < samples; ++i) chk.rows.push_back(int(int64_t(i) * (slots - 1) / std::max(samples - 1, 1)));
  chk.ref.resize(chk.rows.size() * std::size_t(n));
  chk.sabs.resize(chk.ref.size());
  for (std::size_t i = 0; i < chk.rows.size(); ++i) {
    const int s = chk.rows[i];
    reference_row(x.data() + std::size_t(r0.slot_rows[s]) * k, hw[r0.slot_expert[s]], bank.dec[r0.slot_expert[s]],
                  chk.ref.data() + i * n, chk.sabs.data() + i * n);
  }
  double touched = 0;
  for (const routing& rt : ro) touched += double(rt.groups.size()) / routings;
  int max_slots = 0;
  for (const routing& rt : ro) max_slots = std::max(max_slots, rt.max_slots);
  for (fast::tile_kind t : {fast::tile_kind::gemv, fast::tile_kind::skinny, fast::tile_kind::wide}) {
    if ((t == fast::tile_kind::gemv && max_slots > 16) || (t == fast::tile_kind::skinny && max_slots > 64)) continue;
    auto fn = [&](int i) {
      const routing& rt = ro[i % routings];
      fast::grouped_fp4(xq.as<uint8_t>(), xs.as<float>(), rows_dev[i % routings]->as<int32_t>(),
                        groups_dev[i % routings]->as<fast::expert_group>(), int(rt.groups.size()), slots,
                        rt.max_slots, n, k, y.as<float>(), t);
    };
    lab_case c{op, fast::tile_name(t), "64 experts top-6", tokens, n, k};
    c.groups = int(std::lround(touched));
    c.bytes = touched * ebytes + double(x_rows) * k * (1 + 4.0 / 32) + 4.0 * slots * n;
    c.flops = 2.0 * slots * n * k;
    cuda::fill_bytes(y.p, 0xFF, sizeof(float) * std::size_t(slots) * n);
    fn(0);
    cuda::synchronize();
    chk.check(y.as<float>(), c, true);
    time_case(fn, c);
    out.push_back(c);
  }
}

}  // namespace

std::vector<lab_case> run_linear_cases(bool fp4, bool quick) {
  static const linear_shape fp8_shapes[] = {{"attn.wq_a", 1280, 5120},   {"attn.wq_b", 32768, 1280},
                                            {"attn.wkv", 512, 5120},     {"attn.wo_b", 5120, 8192},
                                            {"shared.w1", 2304, 5120},   {"shared.w2", 5120, 2304},
                                            {"square", 5120, 5120}};
  static const linear_shape fp4_shapes[] = {{"expert.w13", 4608, 5120}, {"expert.w2", 5120, 2304}};
  std::vector<int> ms = quick ? std::vector<int>{1, 64, 8192} : std::vector<int>{1, 8, 16, 64, 8192};
  std::vector<lab_case> out;
  rng r{fp4 ? 41u : 40u};
  if (fp4)
    for (const linear_shape& s : fp4_shapes)
      for (int m : ms) run_linear(s, m, true, r, out);
  else
    for (const linear_shape& s : fp8_shapes)
      for (int m : ms) run_linear(s, m, false, r, out);
  return out;
}

std::vector<lab_case> run_moe_cases(bool quick) {
  std::vector<lab_case> out;
  rng r{42};
  const std::vector<int> tokens = quick ? std::vector<int>{1, 8192} : std::vector<int>{1, 16, 8192};
  {
    const expert_bank up = make_bank(4608, 5120, r);
    for (int t : tokens) run_grouped("moe_up", up, t, false, r, out);
  }
  const expert_bank down = make_bank(5120, 2304, r);
  for (int t : tokens) run_grouped("moe_down", down, t, true, r, out);
  return out;
}

}  // namespace cedar::lab

#endif  // CEDAR_HAVE_CUDA
