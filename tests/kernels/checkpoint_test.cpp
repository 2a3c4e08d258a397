// Checkpoint I/O: safetensors round trips (single file and sharded), refusal of broken files
// and of checkpoints that do not match the inventory, and the random-weight generator.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "config/model_config.hpp"
#include "kernels/checkpoint/safetensors.hpp"
#include "kernels/formats.hpp"
#include "kernels/model/inventory.hpp"
#include "kernels/model/param_count.hpp"
#include "kernels/model/random_weights.hpp"

using namespace cedar;
namespace fs = std::filesystem;

namespace {

/// micro with a small vocabulary, so that test checkpoints stay a few MiB.
model_args small_micro() {
  std::string error;
  auto a = load_model_args("micro", &error);
  REQUIRE_MESSAGE(a.has_value(), error);
  a->vocab_size = 512;
  return *a;
}

/// A fresh empty directory under the system temp dir, removed at scope exit.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& tag) {
    path = fs::temp_directory_path() / ("cedar-ckpt-test-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() { fs::remove_all(path); }
};

std::vector<tensor_source> sources_of(const tensor_map& m) {
  std::vector<tensor_source> out;
  for (const auto& [name, t] : m.tensors) out.push_back(source_of(name, t));
  return out;
}

void check_same(const tensor_map& a, const tensor_map& b) {
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    CAPTURE(name);
    const tensor_entry* u = b.find(name);
    REQUIRE(u);
    CHECK(u->dtype == t.dtype);
    CHECK(u->shape == t.shape);
    REQUIRE(u->num_bytes() == t.num_bytes());
    CHECK(std::memcmp(u->data, t.data, t.num_bytes()) == 0);
  }
}

bool any_mentions(const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
  for (const std::string& l : lines)
    if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
  return false;
}

/// Dequantized RMS of an FP8 weight with its 32x32 scales.
double fp8_rms(const tensor_entry& w, const tensor_entry& s) {
  double sum = 0;
  const int64_t rows = w.shape[0], cols = w.shape[1];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const double v = fmt::e4m3_to_f32(w.data[r * cols + c]) * fmt::ue8m0_to_f32(s.data[(r / 32) * s.shape[1] + c / 32]);
      sum += v * v;
    }
  return std::sqrt(sum / double(rows * cols));
}

}  // namespace

TEST_CASE("the real inventory has spec §4.3's tensors, shapes and counts") {
  std::string error;
  model_args a = *load_model_args("deepseek-v4.1-flash", &error);
  const std::vector<tensor_spec> inv = model_inventory(a);
  auto find = [&](const std::string& name) -> const tensor_spec& {
    for (const tensor_spec& s : inv)
      if (s.name == name) return s;
    FAIL("missing " << name);
    return inv.front();
  };
  auto count = [&](const std::string& suffix) {
    int n = 0;
    for (const tensor_spec& s : inv)
      if (s.name.size() >= suffix.size() && s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0) ++n;
    return n;
  };
  CHECK(count("compressor.wkv.weight") == 4);
  CHECK(count("compressor.wgate.weight") == 3);
  CHECK(count("indexer.wq_b.weight") == 8);
  CHECK(count("indexer.wk.weight") == 4);
  CHECK(count("engram.embed.weight") == 2);
  int expert_weights = 0;
  for (const tensor_spec& s : inv) expert_weights += s.role == tensor_role::fp4_weight;
  CHECK(expert_weights == 40 * 384 * 3);
  CHECK(find("layers.0.ffn.experts.0.w1.weight").shape == std::vector<int64_t>{2304, 2560});
  CHECK(find("layers.0.ffn.experts.0.w1.scale").shape == std::vector<int64_t>{2304, 160});
  CHECK(find("layers.0.ffn.experts.0.w1.weight").dtype == st_dtype::i8);
  CHECK(find("layers.0.attn.wq_a.scale").shape == std::vector<int64_t>{40, 160});
  CHECK(find("layers.0.attn.wkv.scale").shape == std::vector<int64_t>{16, 160});
  CHECK(find("layers.0.attn.wo_a.weight").shape == std::vector<int64_t>{8192, 4096});
  CHECK(find("layers.0.attn.wq_b.weight").shape == std::vector<int64_t>{32768, 1280});
  CHECK(find("layers.24.attn.indexer.wq_b.scale").shape == std::vector<int64_t>{128, 40});
  CHECK(find("layers.14.engram.wkv.scale").shape == std::vector<int64_t>{800, 192});
  CHECK(find("layers.14.engram.embed.weight").shape == std::vector<int64_t>{384016682, 256});
  CHECK(find("layers.0.hc_attn_fn").shape == std::vector<int64_t>{24, 20480});
  CHECK(find("head.weight").shape == std::vector<int64_t>{129280, 5120});
  // Attention weights are 4.72 GiB of FP8 in the real files (spec §4.1).
  double attention_bytes = 0;
  for (const tensor_spec& s : inv)
    if (s.role == tensor_role::fp8_weight && s.name.find(".attn.w") != std::string::npos) attention_bytes += double(s.num_bytes());
  CHECK(attention_bytes / double(1ull << 30) == doctest::Approx(4.72).epsilon(0.005));
}

TEST_CASE("safetensors round trip is bit-exact, single file and sharded") {
  const model_args a = small_micro();
  const tensor_map weights = make_random_weights(a, 7);
  for (uint64_t shard_bytes : {uint64_t(0), uint64_t(1) << 20}) {
    CAPTURE(shard_bytes);
    temp_dir dir("rt");
    safetensors_write_options opt;
    opt.max_shard_bytes = shard_bytes;
    opt.num_threads = 2;
    std::string error;
    REQUIRE_MESSAGE(write_safetensors(dir.path.string(), sources_of(weights), opt, &error), error);
    const bool sharded = fs::exists(dir.path / "model.safetensors.index.json");
    CHECK(sharded == (shard_bytes != 0));
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir.path)) files += e.path().extension() == ".safetensors";
    CHECK((files > 1) == sharded);
    tensor_map back;
    REQUIRE_MESSAGE(read_safetensors(dir.path.string(), back, &error), error);
    check_same(weights, back);
    CHECK(check_tensors(a, back).empty());
  }
}

TEST_CASE("a checkpoint with a missing, a mis-shaped and a wrongly-typed tensor is refused by name") {
  const model_args a = small_micro();
  tensor_map weights = make_random_weights(a, 1);
  weights.tensors.erase("layers.3.attn.wq_a.scale");
  weights.tensors["layers.4.ffn.experts.5.w2.weight"].shape = {256, 128};
  weights.tensors["layers.6.attn.compressor.wkv.weight"].dtype = st_dtype::f16;
  weights.add_owned("mtp.0.attn.wq_a.weight", st_dtype::f8_e4m3, {32, 32});  // extra tensors are fine
  const std::vector<std::string> problems = check_tensors(a, weights);
  CHECK(problems.size() == 3);
  CHECK(any_mentions(problems, "layers.3.attn.wq_a.scale", "missing"));
  CHECK(any_mentions(problems, "layers.4.ffn.experts.5.w2.weight", "[256, 64]"));
  CHECK(any_mentions(problems, "layers.6.attn.compressor.wkv.weight", "F16"));
}

TEST_CASE("a config that leaves out layers or Engram the checkpoint has is refused; weights digests tell seeds apart") {
  const model_args a = small_micro();
  const tensor_map weights = make_random_weights(a, 1);
  model_args fewer = a;  // the checkpoint's last layer is not in the config
  fewer.num_hidden_layers = a.num_hidden_layers - 1;
  fewer.derive_layer_map();
  std::vector<std::string> problems = check_tensors(fewer, weights);
  CHECK(any_mentions(problems, "layers." + std::to_string(a.num_hidden_layers - 1) + ".*", "past num_hidden_layers"));
  REQUIRE_FALSE(a.engram_layer_ids.empty());
  model_args no_engram = a;  // Engram switched off in the config, its tables still on disk
  no_engram.engram_layer_ids.clear();
  no_engram.engram_num_embeddings.clear();
  no_engram.derive_layer_map();
  problems = check_tensors(no_engram, weights);
  CHECK(problems.size() == a.engram_layer_ids.size());
  CHECK(any_mentions(problems, "layers." + std::to_string(a.engram_layer_ids[0]) + ".engram.*", "engram_layer_ids"));
  const std::vector<std::string> ten(10, "x");
  CHECK(list_problems(ten) == "\n  x\n  x\n  x\n  x\n  x\n  x\n  x\n  x\n  ... and 2 more");
  CHECK(weights.digest() == make_random_weights(a, 1).digest());
  CHECK(weights.digest() != make_random_weights(a, 2).digest());
  CHECK(weights.digest().size() == 16);
}

TEST_CASE("broken safetensors files are refused naming the file and tensor") {
  temp_dir dir("bad");
  tensor_map m;
  uint8_t* p = m.add_owned("w", st_dtype::f32, {4, 8});
  for (int i = 0; i < 128; ++i) p[i] = uint8_t(i);
  std::string error;
  REQUIRE(write_safetensors(dir.path.string(), sources_of(m), {}, &error));
  const fs::path file = dir.path / "model.safetensors";
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto rewrite = [&](const std::string& b) { std::ofstream(file, std::ios::binary) << b; };
  tensor_map out;
  rewrite(bytes.substr(0, bytes.size() - 4));  // truncated data
  CHECK_FALSE(read_safetensors(dir.path.string(), out, &error));
  CHECK(error.find("model.safetensors") != std::string::npos);
  CHECK(error.find("tensor w") != std::string::npos);
  std::string bad_dtype = bytes;
  bad_dtype.replace(bad_dtype.find("\"F32\""), 5, "\"F64\"");
  rewrite(bad_dtype);
  CHECK_FALSE(read_safetensors(dir.path.string(), out, &error));
  CHECK(error.find("unsupported dtype F64") != std::string::npos);
  std::string huge = bytes;
  huge[7] = char(0x7F);  // header length far beyond the file
  rewrite(huge);
  CHECK_FALSE(read_safetensors(dir.path.string(), out, &error));
  CHECK(error.find("header length") != std::string::npos);
  CHECK_FALSE(read_safetensors((dir.path / "nothing").string(), out, &error));
}

TEST_CASE("random weights are deterministic per seed, whatever the thread count or path") {
  const model_args a = small_micro();
  const tensor_map one = make_random_weights(a, 42, {}, 1);
  const tensor_map two = make_random_weights(a, 42, {}, 2);
  check_same(one, two);
  const tensor_map other = make_random_weights(a, 43, {}, 2);
  const tensor_entry* x = one.find("layers.2.attn.wq_b.weight");
  const tensor_entry* y = other.find("layers.2.attn.wq_b.weight");
  CHECK(std::memcmp(x->data, y->data, x->num_bytes()) != 0);
  // The streaming sources give the same bytes as the in-memory map.
  temp_dir dir("stream");
  std::string error;
  uint64_t last_done = 0, last_total = 0;
  REQUIRE_MESSAGE(write_random_checkpoint(a, 42, dir.path.string(), 2 << 20,
                                          [&](uint64_t d, uint64_t t) { last_done = d, last_total = t; }, &error, 2),
                  error);
  CHECK(last_done == last_total);
  tensor_map back;
  REQUIRE_MESSAGE(read_safetensors(dir.path.string(), back, &error), error);
  check_same(one, back);
  auto cfg = load_model_args(dir.path.string(), &error);
  REQUIRE_MESSAGE(cfg.has_value(), error);
  CHECK(cfg->vocab_size == 512);
}

TEST_CASE("random weights follow the hygiene rules") {
  const model_args a = small_micro();
  const tensor_map w = make_random_weights(a, 5);
  int64_t nan_codes = 0, nan_scales = 0, norms_not_one = 0;
  for (const tensor_spec& s : model_inventory(a)) {
    const tensor_entry& t = *w.find(s.name);
    for (std::size_t i = 0; i < t.num_bytes(); ++i) {
      nan_codes += t.dtype == st_dtype::f8_e4m3 && (t.data[i] & 0x7F) == 0x7F;
      nan_scales += t.dtype == st_dtype::f8_e8m0 && t.data[i] == 0xFF;
    }
    if (s.role == tensor_role::norm)
      for (int64_t i = 0; i < t.num_elements(); ++i)
        norms_not_one += fmt::bf16_to_f32(reinterpret_cast<const uint16_t*>(t.data)[i]) != 1.0f;
  }
  CHECK(nan_codes == 0);
  CHECK(nan_scales == 0);
  CHECK(norms_not_one == 0);
  // A dense FP8 linear keeps the activation RMS within 2x; a residual-writing one shrinks it.
  const double in = double(a.hidden_size);
  const double wq_a = fp8_rms(*w.find("layers.0.attn.wq_a.weight"), *w.find("layers.0.attn.wq_a.scale")) * std::sqrt(in);
  CHECK(wq_a > 0.5);
  CHECK(wq_a < 2.0);
  const double out_in = double(a.o_groups * a.o_lora_rank);
  const double wo_b = fp8_rms(*w.find("layers.0.attn.wo_b.weight"), *w.find("layers.0.attn.wo_b.scale")) * std::sqrt(out_in);
  CHECK(wo_b < 0.5);
  // An FP4 expert: dequantized RMS ~ 1/sqrt(in).
  const tensor_entry& e = *w.find("layers.0.ffn.experts.0.w1.weight");
  const tensor_entry& es = *w.find("layers.0.ffn.experts.0.w1.scale");
  double sum = 0;
  const int64_t cols = e.shape[1] * 2;
  for (int64_t r = 0; r < e.shape[0]; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = e.data[r * e.shape[1] + c / 2];
      const double v = fmt::e2m1_to_f32(c % 2 ? byte >> 4 : byte & 15) * fmt::ue8m0_to_f32(es.data[r * es.shape[1] + c / 32]);
      sum += v * v;
    }
  const double expert_gain = std::sqrt(sum / double(e.shape[0] * cols)) * std::sqrt(in);
  CHECK(expert_gain > 0.5);
  CHECK(expert_gain < 2.0);
  // mHC: pre = sigmoid(mix * s0 + b) + eps stays in [0.25, 1] for |mix| <= 2, post = 2 sigmoid(.) near 1.
  const float* base = reinterpret_cast<const float*>(w.find("layers.3.hc_attn_base")->data);
  const float* scale = reinterpret_cast<const float*>(w.find("layers.3.hc_attn_scale")->data);
  auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  for (int j = 0; j < a.hc_mult; ++j)
    for (double mix : {-2.0, 2.0}) {
      CHECK(sigmoid(mix * scale[0] + base[j]) >= 0.25);
      CHECK(std::abs(2 * sigmoid(mix * scale[1] + base[a.hc_mult + j]) - 1) < 0.4);
    }
}

TEST_CASE("parameter counts reproduce spec §2.6, §4.1 and §6.2") {
  std::string error;
  const param_counts real = count_params(*load_model_args("deepseek-v4.1-flash", &error));
  CHECK(real.backbone / 1e9 == doctest::Approx(551.9).epsilon(0.0002));        // "552B"
  CHECK(real.engram_tables / 1e9 == doctest::Approx(196.6).epsilon(0.0005));
  CHECK(real.active_per_prompt_token / 1e9 == doctest::Approx(7.9).epsilon(0.015));     // "8B in"
  CHECK(real.active_per_generated_token / 1e9 == doctest::Approx(15.7).epsilon(0.01));  // "16B out"
  const model_args bench = *load_model_args("bench-40L-E64", &error);
  CHECK(count_params(bench).total / 1e9 == doctest::Approx(123.4).epsilon(0.001));
  double bytes = 0;
  for (const tensor_spec& s : model_inventory(bench)) bytes += double(s.num_bytes());
  CHECK(bytes / double(1ull << 30) == doctest::Approx(77.5).epsilon(0.001));
}
