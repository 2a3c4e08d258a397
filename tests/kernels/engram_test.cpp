// Engram (spec §2.8): the table sizes that follow from the prime assignment (tiny preset §6.1
// and the real config's engram_num_embeddings, §1), the n-gram row hash against a direct
// XOR-of-products, the gated update against a double-precision version, and the multipliers and
// token map as the checkpoint's reference computes them (numpy itself, run by the test).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "kernels/cpu/numpy_random.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;
using namespace cedar::op_reference;

namespace {

cpu::engram_hash_config hash_config(std::vector<int> layers, int heads, int64_t vocab, int32_t pad) {
  cpu::engram_hash_config c;
  c.layer_ids = std::move(layers);
  c.max_ngram = 4;
  c.heads = heads;
  c.vocab_size = vocab;
  c.pad_token = pad;
  return c;
}

bool is_prime_slow(int64_t n) {
  if (n < 2) return false;
  for (int64_t f = 2; f * f <= n; ++f)
    if (n % f == 0) return false;
  return true;
}

}  // namespace

TEST_CASE("Engram primes: successive primes from the vocab size, layer after layer") {
  SUBCASE("tiny preset: tables of 3198 and 3460 rows") {
    const auto p = cpu::engram_default_params(hash_config({1, 14}, 2, 509, 2));
    REQUIRE(p.size() == 2);
    CHECK(cpu::engram_table_rows(p[0]) == 3198);
    CHECK(cpu::engram_table_rows(p[1]) == 3460);
  }
  SUBCASE("real config: engram_num_embeddings 384006168 and 384016682") {
    const auto p = cpu::engram_default_params(hash_config({1, 14}, 8, 16000000, 2));
    CHECK(cpu::engram_table_rows(p[0]) == 384006168);
    CHECK(cpu::engram_table_rows(p[1]) == 384016682);
  }
  const auto p = cpu::engram_default_params(hash_config({1, 14}, 2, 509, 2));
  int64_t prev = 508;
  for (const auto& layer : p) {
    int64_t offset = 0;
    for (int i = 0; i < 6; ++i) {
      CHECK(is_prime_slow(layer.primes[i]));
      for (int64_t n = prev + 1; n < layer.primes[i]; ++n) CHECK_FALSE(is_prime_slow(n));
      CHECK(layer.offsets[i] == offset);
      offset += layer.primes[i];
      prev = layer.primes[i];
    }
    for (int i = 0; i < 4; ++i) CHECK(layer.multipliers[i] % 2 != 0);
  }
  CHECK(p[0].multipliers[0] != p[1].multipliers[0]);  // seeded per layer
}

TEST_CASE("engram_rows hashes each n-gram with a wrapping XOR of products, pad before 0") {
  const auto p = cpu::engram_default_params(hash_config({14}, 2, 509, 7))[0];
  std::mt19937_64 rng(61);
  const int T = 9, per = 6;
  std::vector<int32_t> cids(T);
  for (auto& c : cids) c = int32_t(rng() % 1000);
  std::vector<int64_t> rows(size_t(T) * per);
  cpu::engram_rows(cids.data(), 0, T, p, rows.data());
  for (int t = 0; t < T; ++t)
    for (int n = 2; n <= 4; ++n) {
      uint64_t rolling = 0;
      for (int i = 0; i < n; ++i) {
        const uint64_t tok = uint64_t(t - i >= 0 ? cids[t - i] : p.pad_id);
        rolling ^= tok * uint64_t(p.multipliers[i]);
      }
      for (int h = 0; h < 2; ++h) {
        const int k = (n - 2) * 2 + h;
        // Python-style modulo of the signed 64-bit value.
        const __int128 v = int64_t(rolling), prime = p.primes[k];
        const int64_t mod = int64_t(((v % prime) + prime) % prime);
        CHECK(rows[size_t(t) * per + k] == p.offsets[k] + mod);
      }
    }
  // A later chunk sees the earlier tokens, not the pad.
  std::vector<int64_t> tail(size_t(4) * per);
  cpu::engram_rows(cids.data(), 5, 4, p, tail.data());
  CHECK(std::equal(tail.begin(), tail.end(), rows.begin() + size_t(5) * per));
}

TEST_CASE("engram adds the sigmoid-sqrt gated value to every copy, rounded to bf16") {
  std::mt19937_64 rng(62);
  const int m = 3, hc = 2, d = 32, head_dim = 32, per = 3, table_rows = 20;
  std::vector<uint8_t> table(size_t(table_rows) * head_dim), scale(table_rows);
  for (auto& c : table) do c = uint8_t(rng()); while ((c & 0x7F) == 0x7F);
  for (auto& c : scale) c = uint8_t(120 + rng() % 4);
  auto wkv = random_fp8(rng, (hc + 1) * d, per * head_dim);
  auto qw = random_floats(rng, size_t(hc) * d, 0.5f, 1.5f);
  auto kw = random_floats(rng, size_t(hc) * d, 0.5f, 1.5f);
  const cpu::engram_weights w{table.data(), scale.data(), table_rows, head_dim, wkv.view,
                              qw.data(), kw.data()};
  std::vector<int64_t> rows(size_t(m) * per);
  for (auto& r : rows) r = int64_t(rng() % table_rows);
  auto X0 = random_floats(rng, size_t(m) * hc * d, -1, 1);
  for (auto& x : X0) x = fmt::round_bf16(x);
  auto X = X0;
  const float eps = 1e-20f;
  cpu::engram(X.data(), m, hc, d, rows.data(), per, w, eps);

  // Gather, dequantize, project (FP8 linear), then gate in double.
  std::vector<float> emb(size_t(m) * per * head_dim);
  for (int i = 0; i < m * per; ++i)
    for (int c = 0; c < head_dim; ++c)
      emb[size_t(i) * head_dim + c] = fmt::e4m3_to_f32(table[size_t(rows[i]) * head_dim + c]) *
                                      fmt::ue8m0_to_f32(scale[rows[i]]);
  const auto kv = dense_linear(emb.data(), m, dequant(wkv.view), (hc + 1) * d, per * head_dim, true);
  for (int r = 0; r < m; ++r)
    for (int h = 0; h < hc; ++h) {
      const double* key = &kv[size_t(r) * (hc + 1) * d + size_t(h) * d];
      const double* value = &kv[size_t(r) * (hc + 1) * d + size_t(hc) * d];
      const float* x = &X0[(size_t(r) * hc + h) * d];
      double dot = 0, xx = 0, kk = 0;
      for (int c = 0; c < d; ++c) {
        dot += x[c] * double(qw[size_t(h) * d + c]) * kw[size_t(h) * d + c] * key[c];
        xx += double(x[c]) * x[c];
        kk += key[c] * key[c];
      }
      dot = dot / std::sqrt(xx / d + eps) / std::sqrt(kk / d + eps) / std::sqrt(double(d));
      const double z = (dot > 0 ? 1 : dot < 0 ? -1 : 0) * std::sqrt(std::max(std::fabs(dot), 1e-6));
      const double gate = 1 / (1 + std::exp(-z));
      for (int c = 0; c < d; ++c) {
        const double expect = x[c] + gate * value[c];
        const float got = X[(size_t(r) * hc + h) * d + c];
        CHECK(got == fmt::round_bf16(got));
        CHECK(std::fabs(got - expect) <= 1e-2 * std::fabs(expect) + 1e-3);
      }
    }

  auto one = std::vector<float>(X0.begin() + size_t(2) * hc * d, X0.end());
  cpu::engram(one.data(), 1, hc, d, rows.data() + size_t(2) * per, per, w, eps);
  CHECK(same_bits(one.data(), X.data() + size_t(2) * hc * d, one.size()));
}

namespace {

/// Runs Debian's python3 with numpy (tools/setup.sh installs it) and returns its stdout.
std::string run_numpy(const std::string& program) {
  const std::string cmd = "/usr/bin/python3 -c '" + program + "' 2>&1";
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    if (pclose(f) != 0) out = "failed: " + out;
  }
  return out;
}

}  // namespace

TEST_CASE("numpy_pcg64 draws what numpy's default_rng draws (python3-numpy in the same run)") {
  // Seeds of one and two 32-bit words; spans on numpy's 64-bit and 32-bit paths.
  const std::vector<uint64_t> seeds = {0, 1, 10007, 140098, 5000000000ull, 0xFFFFFFFFFFFFull};
  const std::vector<std::pair<int64_t, int64_t>> spans = {
      {0, 46539438283891}, {-7, 1000}, {5, 6}, {0, int64_t(1) << 32}, {-(int64_t(1) << 62), int64_t(1) << 62}};
  std::string program = "import numpy as np\n";
  std::string expect;
  for (uint64_t seed : seeds) {
    program += "g = np.random.default_rng(" + std::to_string(seed) + ")\n";
    program += "print(*g.bit_generator.random_raw(3))\n";
    cpu::numpy_pcg64 raw(seed);
    for (int i = 0; i < 3; ++i) expect += std::to_string(raw.next64()) + (i < 2 ? " " : "\n");
    for (const auto& [lo, hi] : spans) {
      program += "g = np.random.default_rng(" + std::to_string(seed) + ")\n";
      program += "print(*g.integers(" + std::to_string(lo) + ", " + std::to_string(hi) + ", size=5, dtype=np.int64))\n";
      cpu::numpy_pcg64 g(seed);
      for (int i = 0; i < 5; ++i) expect += std::to_string(g.integers(lo, hi)) + (i < 4 ? " " : "\n");
    }
  }
  const std::string got = run_numpy(program);
  REQUIRE_MESSAGE(got.rfind("failed", 0) != 0, got);
  CHECK(got == expect);
}

TEST_CASE("Engram multipliers: 2r+1 of numpy default_rng(10007 * layer) below INT64_MAX / compressed / 2") {
  auto c = hash_config({1, 14}, 8, 16000000, 2);
  c.compressed_vocab = 99092;
  auto identity = std::make_shared<std::vector<int32_t>>(16);
  for (int32_t i = 0; i < 16; ++i) (*identity)[i] = i;
  c.token_map = identity;  // a served model's hash: the checkpoint's multipliers
  const auto p = cpu::engram_default_params(c);
  c.token_map = nullptr;   // a bare config keeps its own constants
  CHECK(cpu::engram_default_params(c)[0].multipliers[0] != p[0].multipliers[0]);
  std::string program = "import numpy as np\nhb = max(1, (np.iinfo(np.int64).max // 99092) // 2)\n";
  std::string expect;
  for (std::size_t l = 0; l < p.size(); ++l) {
    program += "print(*(np.random.default_rng(10007 * " + std::to_string(c.layer_ids[l]) +
               ").integers(0, hb, size=4, dtype=np.int64) * 2 + 1))\n";
    for (int i = 0; i < 4; ++i) expect += std::to_string(p[l].multipliers[i]) + (i < 3 ? " " : "\n");
  }
  const std::string got = run_numpy(program);
  REQUIRE_MESSAGE(got.rfind("failed", 0) != 0, got);
  CHECK(got == expect);
}

TEST_CASE("engram_rows hashes compressed ids: the token map applies to tokens and to the pad") {
  auto mapped = hash_config({14}, 2, 509, 7);
  auto map = std::make_shared<std::vector<int32_t>>(64);
  std::mt19937_64 rng(63);
  for (auto& v : *map) v = int32_t(rng() % 40);  // a many-to-one map, as the normalizer makes
  mapped.token_map = map;
  const auto q = cpu::engram_default_params(mapped)[0];
  CHECK(q.pad_id == (*map)[7]);
  const int T = 11, per = 6;
  std::vector<int32_t> ids(T), cids(T);
  for (int t = 0; t < T; ++t) cids[t] = (*map)[ids[t] = int32_t(rng() % 64)];
  std::vector<int64_t> via_map(size_t(T) * per), direct(size_t(T) * per);
  cpu::engram_rows(ids.data(), 0, T, q, via_map.data());
  auto on_ids = q;  // the same constants, fed the compressed ids directly
  on_ids.token_map = nullptr;
  cpu::engram_rows(cids.data(), 0, T, on_ids, direct.data());
  CHECK(via_map == direct);
  // Two token sequences the map folds together hash alike.
  std::vector<int32_t> other = ids;
  for (int t = 0; t < T; ++t)
    for (int32_t v = 0; v < 64; ++v)
      if (v != ids[t] && (*map)[v] == (*map)[ids[t]]) other[t] = v;
  CHECK(other != ids);
  std::vector<int64_t> folded(size_t(T) * per);
  cpu::engram_rows(other.data(), 0, T, q, folded.data());
  CHECK(folded == via_map);
}
