// Weights to the device (gpu_model.hpp): every view bound by model_detail::bind_weights gets its
// place in one device image (tensors one after another, 256-byte aligned, one allocation), and
// the image is streamed there through pinned staging buffers: the host threads copy the next
// window of tensors into a free staging buffer while the previous windows' copies run on a
// stream. Progress counts every tensor byte. Runs once, in the gpu_model constructor.
#ifdef CEDAR_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda_model/gpu_forward.hpp"
#include "kernels/parallel.hpp"

namespace cedar {

namespace {

constexpr uint64_t image_align = 256;
constexpr uint64_t staging_bytes = uint64_t(64) << 20;  // one window of the image
constexpr int num_staging = 3;                          // windows in flight (filling, copying)
constexpr int64_t fill_grain = int64_t(4) << 20;        // bytes per host thread's share of a window

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("weight upload: ") + what + ": " + cudaGetErrorString(err));
}

uint64_t free_device_bytes() {
  std::size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  return free_b;
}

/// The device image of the weights. Placing runs twice over the same views: the first pass only
/// sizes the image (pointers come back null), then allocate(), then the second pass hands out
/// device addresses and records where each tensor's bytes come from.
class weight_image {
 public:
  weight_image() = default;
  weight_image(const weight_image&) = delete;
  weight_image& operator=(const weight_image&) = delete;
  ~weight_image() {
    for (void* p : staging_) cudaFreeHost(p);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
    if (base_) cudaFree(base_);  // still held only when streaming failed
  }

  template <class T>
  const T* place(const T* src, std::size_t n) {
    if (src == nullptr || n == 0) return nullptr;
    const uint64_t offset = (size_ + image_align - 1) / image_align * image_align, bytes = n * sizeof(T);
    size_ = offset + bytes;
    if (!base_) {
      tensor_bytes_ += bytes;
      return nullptr;
    }
    pieces_.push_back({reinterpret_cast<const uint8_t*>(src), offset, bytes});
    return reinterpret_cast<const T*>(base_ + offset);
  }
  const float* place(const std::vector<float>& v) { return place(v.data(), v.size()); }
  fp8_weight place(const fp8_weight& w) {
    return {w.out, w.in, place(w.data, std::size_t(w.out) * w.in),
            place(w.scale, std::size_t((w.out + 31) / 32) * ((w.in + 31) / 32))};
  }
  fp4_weight place(const fp4_weight& w) {
    return {w.out, w.in, place(w.data, std::size_t(w.out) * w.in / 2), place(w.scale, std::size_t(w.out) * (w.in / 32))};
  }
  bf16_weight place(const bf16_weight& w) { return {w.out, w.in, place(w.data, std::size_t(w.out) * w.in)}; }
  dev_hc place(const model_detail::hc_weights& h) { return {place(h.fn), place(h.base), place(h.scale)}; }

  /// After the sizing pass: one device allocation for the image, the staging buffers and the
  /// stream; the next pass starts at offset 0.
  void allocate() {
    if (const uint64_t free_b = free_device_bytes(); size_ > free_b)
      throw std::runtime_error("the weights need " + std::to_string(size_ >> 20) + " MiB of device memory, " +
                               std::to_string(free_b >> 20) +
                               " MiB are free (--layout tpN or depN keeps a device's share of the routed "
                               "experts only)");
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<uint64_t>(size_, 1)), "cudaMalloc of the weight image");
    base_ = static_cast<uint8_t*>(p);
    size_ = 0;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int i = 0; i < num_staging; ++i) {
      check(cudaHostAlloc(&p, staging_bytes, cudaHostAllocDefault), "cudaHostAlloc of a staging buffer");
      staging_.push_back(static_cast<uint8_t*>(p));
      cudaEvent_t e;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      free_.push_back(e);
    }
  }

  /// Copies the image to the device window by window; `progress` gets (tensor bytes copied,
  /// tensor bytes in all) after each window. Returns the allocation, which the caller now owns.
  void* stream(const upload_progress_fn* progress) {
    uint64_t done = 0;
    for (uint64_t lo = 0, k = 0; lo < size_; lo += staging_bytes, ++k) {
      const uint64_t hi = std::min(size_, lo + staging_bytes);
      uint8_t* buf = staging_[k % num_staging];
      cudaEvent_t& ready = free_[k % num_staging];
      check(cudaEventSynchronize(ready), "waiting for a staging buffer");  // its last copy is done
      done += fill(buf, lo, hi);
      check(cudaMemcpyAsync(base_ + lo, buf, hi - lo, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
      check(cudaEventRecord(ready, stream_), "cudaEventRecord");
      if (progress && *progress) (*progress)(done, tensor_bytes_);
    }
    check(cudaStreamSynchronize(stream_), "the last weight copies");
    void* out = base_;
    base_ = nullptr;
    return out;
  }

  uint64_t tensor_bytes() const { return tensor_bytes_; }
  /// The image's bytes so far (after the sizing pass: what allocate() will ask for).
  uint64_t size() const { return size_; }

 private:
  struct piece {
    const uint8_t* src;
    uint64_t offset, bytes;  ///< where in the image
  };

  /// Copies the tensor bytes of image range [lo, hi) into buf (on every core; the gaps between
  /// tensors are left as they are). Returns the tensor bytes copied.
  uint64_t fill(uint8_t* buf, uint64_t lo, uint64_t hi) const {
    parallel_for_chunks(int64_t(lo), int64_t(hi), fill_grain, [&](int64_t a, int64_t b) {
      auto it = std::upper_bound(pieces_.begin(), pieces_.end(), uint64_t(a),
                                 [](uint64_t x, const piece& p) { return x < p.offset + p.bytes; });
      for (; it != pieces_.end() && it->offset < uint64_t(b); ++it) {
        const uint64_t from = std::max<uint64_t>(it->offset, a), to = std::min<uint64_t>(it->offset + it->bytes, b);
        std::memcpy(buf + (from - lo), it->src + (from - it->offset), to - from);
      }
    });
    uint64_t copied = 0;
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), lo,
                               [](uint64_t x, const piece& p) { return x < p.offset + p.bytes; });
    for (; it != pieces_.end() && it->offset < hi; ++it)
      copied += std::min(it->offset + it->bytes, hi) - std::max(it->offset, lo);
    return copied;
  }

  uint8_t* base_ = nullptr;
  uint64_t size_ = 0, tensor_bytes_ = 0;
  std::vector<piece> pieces_;  ///< in image order
  std::vector<uint8_t*> staging_;
  std::vector<cudaEvent_t> free_;  ///< recorded after each staging buffer's copy
  cudaStream_t stream_ = nullptr;
};

/// Whether every value of an FP8 weight times its scale is a bf16 value (UE8M0 codes 3..254:
/// e4m3's smallest step, 2^-9, times 2^-124 is bf16's smallest subnormal), so that a kernel
/// reading it gives the bits of one reading its bf16 form.
bool fp8_is_bf16_exact(const fp8_weight& w) {
  if (w.data == nullptr || w.scale == nullptr) return false;
  const std::size_t n = std::size_t((w.out + 31) / 32) * ((w.in + 31) / 32);
  return std::all_of(w.scale, w.scale + n, [](uint8_t c) { return c >= 3 && c <= 254; });
}

/// Where the Engram tables go: $CEDAR_GPU_ENGRAM_TABLES = device, host (pinned host memory
/// the kernels read over the bus) or auto (the default: the device, unless the weights with
/// them do not fit its free memory and without them do).
enum class table_home { device, host, automatic };

table_home engram_table_home() {
  const char* env = std::getenv("CEDAR_GPU_ENGRAM_TABLES");
  const std::string v = env ? env : "";
  if (v == "device") return table_home::device;
  if (v == "host") return table_home::host;
  if (!v.empty() && v != "auto")
    std::fprintf(stderr, "cedar: CEDAR_GPU_ENGRAM_TABLES='%s' is not device, host or auto; taken as auto\n", env);
  return table_home::automatic;
}

uint64_t table_bytes(const cpu::engram_weights& e) { return uint64_t(e.num_rows) * e.head_dim; }
uint64_t table_scale_bytes(const cpu::engram_weights& e) { return uint64_t(e.num_rows) * (e.head_dim / 32); }

}  // namespace

void gpu_model::impl::bind(const model_detail::model_weights& w) {
  bool tables_on_host = false;  // the Engram tables in pinned host memory (engram_tables_to_host)
  const auto place_all = [&](weight_image& img) {
    embed = img.place(w.embed);
    head = img.place(w.head);
    norm = img.place(w.norm);
    layers.clear();
    for (std::size_t l = 0; l < w.layers.size(); ++l) {
      const model_detail::layer_weights& lw = w.layers[l];
      const layer_info& li = args.layers[l];
      dev_layer d;
      d.hc_attn = img.place(lw.hc_attn);
      d.hc_ffn = img.place(lw.hc_ffn);
      d.attn_norm = img.place(lw.attn_norm);
      d.ffn_norm = img.place(lw.ffn_norm);
      const auto& at = lw.attn;
      d.wq_a = img.place(at.wq_a);
      d.wq_b = img.place(at.wq_b);
      d.wkv = img.place(at.wkv);
      d.wo_b = img.place(at.wo_b);
      d.wo_a = img.place(at.wo_a);
      if (kernels == gpu_kernels::fast && fp8_is_bf16_exact(at.wo_a_fp8)) d.wo_a8 = img.place(at.wo_a_fp8);
      d.q_norm = img.place(at.q_norm);
      d.kv_norm = img.place(at.kv_norm);
      d.sink = img.place(at.sink);
      if (li.is_kv_source) {
        d.c_wkv = img.place(at.compressor.wkv);
        d.c_wgate = img.place(at.compressor.wgate);
        d.c_index_wk = img.place(at.compressor.index_wk);
        d.c_norm = img.place(at.compressor.norm);
        d.c_index_k_norm = img.place(at.compressor.index_k_norm);
      }
      if (li.is_index_source) {
        d.i_wq_b = img.place(at.indexer.wq_b);
        d.i_weights_proj = img.place(at.indexer.weights_proj);
      }
      d.gate = img.place(lw.ffn.gate);
      d.gate_bias = img.place(lw.ffn.gate_bias);
      for (std::size_t i = 0; i < lw.ffn.experts.size(); ++i) {
        const auto& e = lw.ffn.experts[i];
        const bool ours = int(i) % placement.size == placement.rank;  // shard_view::expert_owner
        if (e.w1.data == nullptr || !ours) d.experts.push_back({});
        else d.experts.push_back({img.place(e.w1), img.place(e.w3), img.place(e.w2)});
      }
      if (args.n_shared_experts > 0)
        d.shared = {img.place(lw.ffn.shared.w1), img.place(lw.ffn.shared.w3), img.place(lw.ffn.shared.w2)};
      if (li.has_engram) {
        const cpu::engram_weights& e = lw.engram;
        d.engram = e;
        d.engram.table = tables_on_host ? nullptr : img.place(e.table, table_bytes(e));
        d.engram.table_scale = tables_on_host ? nullptr : img.place(e.table_scale, table_scale_bytes(e));
        d.engram.wkv = img.place(e.wkv);
        d.engram.q_weight = img.place(lw.engram_q);
        d.engram.k_weight = img.place(lw.engram_k);
      }
      layers.push_back(std::move(d));
    }
  };
  uint64_t tables = 0;
  for (std::size_t l = 0; l < w.layers.size(); ++l)
    if (args.layers[l].has_engram) tables += table_bytes(w.layers[l].engram) + table_scale_bytes(w.layers[l].engram);
  const table_home home = tables > 0 ? engram_table_home() : table_home::device;
  tables_on_host = home == table_home::host;
  std::optional<weight_image> img(std::in_place);
  place_all(*img);  // the sizing pass
  if (home == table_home::automatic) {
    if (const uint64_t free_b = free_device_bytes(); img->size() > free_b && img->size() - tables <= free_b) {
      std::fprintf(stderr,
                   "cedar: the Engram tables (%llu MiB) stay in host memory, read over the bus: the weights need "
                   "%llu MiB of device memory with them, %llu MiB are free (CEDAR_GPU_ENGRAM_TABLES=device|host)\n",
                   (unsigned long long)(tables >> 20), (unsigned long long)(img->size() >> 20),
                   (unsigned long long)(free_b >> 20));
      tables_on_host = true;
      img.emplace();  // sized again without them
      place_all(*img);
    }
  }
  img->allocate();
  place_all(*img);
  allocations.push_back(img->stream(progress));
  bytes = img->tensor_bytes();
  if (tables_on_host) engram_tables_to_host(w);
  if (dense_bf16) keep_dense_bf16();
}

void gpu_model::impl::engram_tables_to_host(const model_detail::model_weights& w) {
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    if (!args.layers[l].has_engram) continue;
    const cpu::engram_weights& e = w.layers[l].engram;
    const uint64_t tb = (table_bytes(e) + image_align - 1) / image_align * image_align, sb = table_scale_bytes(e);
    void* p = nullptr;
    check(cudaHostAlloc(&p, tb + sb, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc of an Engram table");
    host_allocations.push_back(p);
    auto* at = static_cast<uint8_t*>(p);
    parallel_for_chunks(0, int64_t(table_bytes(e)), fill_grain,
                        [&](int64_t a, int64_t b) { std::memcpy(at + a, e.table + a, std::size_t(b - a)); });
    std::memcpy(at + tb, e.table_scale, sb);
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, p, 0), "cudaHostGetDevicePointer of an Engram table");
    layers[l].engram.table = static_cast<const uint8_t*>(dev);
    layers[l].engram.table_scale = static_cast<const uint8_t*>(dev) + tb;
    host_bytes += tb + sb;
  }
}

void gpu_model::impl::keep_dense_bf16() {
  std::vector<fp8_weight*> dense;
  for (dev_layer& d : layers) {
    for (fp8_weight* w : {&d.wq_a, &d.wq_b, &d.wkv, &d.wo_b, &d.i_wq_b, &d.shared.w1, &d.shared.w3, &d.shared.w2})
      if (w->data != nullptr) dense.push_back(w);
  }
  uint64_t total = 0;
  for (const fp8_weight* w : dense) total += uint64_t(w->out) * w->in * sizeof(uint16_t);
  if (total == 0) return;
  auto* base = static_cast<uint16_t*>(cuda::device_alloc(total));
  allocations.push_back(base);
  uint16_t* at = base;
  for (fp8_weight* w : dense) {
    cuda::fast::detail::dequant_bf16(*w, at);
    w->bf16 = at;
    at += std::size_t(w->out) * w->in;
  }
  cuda::synchronize();
  bytes += total;
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
