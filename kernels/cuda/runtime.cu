// Device, stream and memory helpers of the CUDA backend.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace cedar::cuda {
namespace detail {

namespace {
// Per thread: each rank of a multi-GPU layout runs on its own thread with its own device.
thread_local cudaStream_t current = nullptr;
thread_local std::set<cudaGraphNode_t> dependent_nodes;  ///< of the graph being captured
}

thread_local bool noting_dependent_nodes = false;
thread_local bool capturing_graph = false;

void note_dependent_node(cudaStream_t s) {
  cudaStreamCaptureStatus status{};
  const cudaGraphNode_t* deps = nullptr;
  size_t n = 0;
  CEDAR_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, nullptr, &deps, nullptr, &n));
  if (status == cudaStreamCaptureStatusActive && n == 1) dependent_nodes.insert(deps[0]);
}

cudaStream_t stream() { return current; }

}  // namespace detail

using namespace detail;

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string status() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (n == 0) return "no CUDA device: none found";
  cudaDeviceProp prop{};
  CEDAR_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
         ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB, " +
         std::to_string(prop.multiProcessorCount) + " SMs";
}

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

void set_device(int device) { CEDAR_CUDA_CHECK(cudaSetDevice(device)); }

int current_device() {
  int dev = 0;
  CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

void set_stream(void* s) { current = static_cast<cudaStream_t>(s); }
void* current_stream() { return current; }

void synchronize() { CEDAR_CUDA_CHECK(cudaStreamSynchronize(current)); }

namespace {
thread_local cudaStream_t capture_stream = nullptr, stream_before_capture = nullptr;
thread_local int capture_device = -1;  ///< the device capture_stream belongs to

/// $CEDAR_GPU_GRAPH_EDGES: report_edges prints, and captures note their dependent launches.
bool reporting_edges() {
  static const bool on = std::getenv("CEDAR_GPU_GRAPH_EDGES") != nullptr;
  return on;
}

/// The scratch of graph captures: one buffer a thread and device, shared by every graph the
/// thread captures, bump-allocated from its start at each capture and never reused within one.
/// Sharing is safe because a thread's graphs run one after another on its stream and a graph's
/// scratch lives only while it runs (graph_capture_end aborts if a block outlives its capture);
/// a model's forward calls, which launch its graphs, are one at a time and end synchronized, so
/// graphs captured on a thread that has ended stay safe too. The buffer is freed when neither
/// its thread nor a graph that uses it is left.
struct arena_buffer {
  uint8_t* base = nullptr;
  std::size_t cap = 0;
  int device = -1;
  arena_buffer(const arena_buffer&) = delete;
  arena_buffer& operator=(const arena_buffer&) = delete;
  arena_buffer(uint8_t* b, std::size_t c, int d) : base(b), cap(c), device(d) {}
  ~arena_buffer() {  // (errors ignored: at the process's end the runtime may be gone)
    int was = -1;
    if (cudaGetDevice(&was) == cudaSuccess && was != device) (void)cudaSetDevice(device);
    (void)cudaFree(base);
    if (was >= 0 && was != device) (void)cudaSetDevice(was);
  }
};

struct scratch_arena {
  std::shared_ptr<arena_buffer> buffer;
  uint8_t* base = nullptr;  ///< buffer's, or null (none: the pool)
  std::size_t cap = 0, used = 0;
  int device = -1;
  int live = 0;         ///< blocks taken in this capture and not yet released
  int refused = 0;      ///< requests of this capture it had no room for (the pool took them)
  bool failed = false;  ///< cudaMalloc refused it: captures use the pool
};
thread_local scratch_arena arena;

/// The graphs whose scratch is in an arena buffer, which they keep alive (never destroyed: graphs
/// may be destroyed by static destructors at the process's end).
std::mutex& held_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<void*, std::shared_ptr<arena_buffer>>& held_buffers() {
  static auto* held = new std::map<void*, std::shared_ptr<arena_buffer>>;
  return *held;
}

/// $CEDAR_GPU_GRAPH_ARENA_MB (default 64; 0: none, the pool's memory nodes instead).
std::size_t arena_bytes() {
  static const std::size_t bytes = [] {
    const char* v = std::getenv("CEDAR_GPU_GRAPH_ARENA_MB");
    return std::size_t(v && *v ? std::strtoull(v, nullptr, 10) : 64) << 20;
  }();
  return bytes;
}

void arena_begin(int dev) {
  if (arena.device != dev) arena = scratch_arena{}, arena.device = dev;  // (another device's: its graphs keep it)
  if (arena.buffer == nullptr && !arena.failed && arena_bytes() > 0) {
    void* p = nullptr;
    if (cudaMalloc(&p, arena_bytes()) == cudaSuccess) {
      arena.buffer = std::make_shared<arena_buffer>(static_cast<uint8_t*>(p), arena_bytes(), dev);
      arena.base = arena.buffer->base, arena.cap = arena.buffer->cap;
    } else {
      (void)cudaGetLastError();
      arena.failed = true;
    }
  }
  arena.used = 0, arena.live = 0, arena.refused = 0;
}
}  // namespace

void* detail::capture_scratch(std::size_t bytes) {
  if (!capturing_graph || arena.base == nullptr) return nullptr;
  const std::size_t at = (arena.used + 255) / 256 * 256;  // cudaMallocAsync's alignment
  if (at + bytes > arena.cap) return ++arena.refused, nullptr;
  arena.used = at + bytes, ++arena.live;
  return arena.base + at;
}

bool detail::release_capture_scratch(void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (arena.base == nullptr || b < arena.base || b >= arena.base + arena.cap) return false;
  --arena.live;
  return true;
}

void graph_capture_begin() {
  const int dev = current_device();
  if (capture_stream != nullptr && capture_device != dev) {  // made on another device: not usable here
    capture_stream = nullptr;  // (left to the process's end: one per thread and device change)
  }
  if (capture_stream == nullptr) {
    CEDAR_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
    capture_device = dev;
  }
  arena_begin(dev);
  stream_before_capture = current;
  current = capture_stream;
  capturing_graph = true;
  noting_dependent_nodes = reporting_edges();
  dependent_nodes.clear();
  CEDAR_CUDA_CHECK(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeRelaxed));
}

namespace {
/// $CEDAR_GPU_GRAPH_EDGES=1: for the first 8 captured graphs, on stderr, how many edges came out
/// programmatic and what kind of node each dependent launch follows (A/B runs). Capture keeps a
/// dependent launch's programmatic edge only where the node before it is a kernel.
void report_edges(cudaGraph_t graph) {
  static std::atomic<int> shown{0};
  if (!reporting_edges() || shown.fetch_add(1) >= 8) return;
  size_t n = 0, nodes = 0;
  CEDAR_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  CEDAR_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0) CEDAR_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
  int programmatic = 0;
  std::map<std::string, int> follows;  // over the dependent launches' input edges
  for (size_t i = 0; i < n; ++i) {
    programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic;
    if (dependent_nodes.count(to[i]) == 0) continue;
    cudaGraphNodeType t{};
    CEDAR_CUDA_CHECK(cudaGraphNodeGetType(from[i], &t));
    ++follows[t == cudaGraphNodeTypeKernel     ? "kernel"
              : t == cudaGraphNodeTypeMemAlloc ? "allocation"
              : t == cudaGraphNodeTypeMemFree  ? "free"
                                               : "node type " + std::to_string(int(t))];
  }
  std::string list;
  for (const auto& [kind, count] : follows) list += " " + kind + " " + std::to_string(count);
  std::fprintf(stderr,
               "graph: %zu nodes, %zu edges, %d programmatic; %zu dependent launches follow:%s; %zu bytes of "
               "capture scratch, %d requests past it\n",
               nodes, n, programmatic, dependent_nodes.size(), list.c_str(), arena.used, arena.refused);
}
}  // namespace

void* graph_capture_end() {
  cudaGraph_t graph = nullptr;
  CEDAR_CUDA_CHECK(cudaStreamEndCapture(capture_stream, &graph));
  current = stream_before_capture;
  capturing_graph = false;
  noting_dependent_nodes = false;
  if (arena.live != 0) {  // its memory would be the next capture's while still in use
    std::fprintf(stderr, "graph capture: %d scratch blocks outlive the capture\n", arena.live);
    std::abort();
  }
  report_edges(graph);
  dependent_nodes.clear();
  cudaGraphExec_t exec = nullptr;
  CEDAR_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CEDAR_CUDA_CHECK(cudaGraphDestroy(graph));
  if (arena.used > 0) {
    const std::lock_guard<std::mutex> lock(held_mutex());
    held_buffers()[exec] = arena.buffer;
  }
  return exec;
}

void graph_launch(void* exec) { CEDAR_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), current)); }

void graph_destroy(void* exec) {
  if (!exec) return;
  CEDAR_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)));
  std::shared_ptr<arena_buffer> buffer;  // freed (if last) outside the lock
  const std::lock_guard<std::mutex> lock(held_mutex());
  if (auto it = held_buffers().find(exec); it != held_buffers().end()) buffer = std::move(it->second), held_buffers().erase(it);
}

void profiler_start() { CEDAR_CUDA_CHECK(cudaProfilerStart()); }

void profiler_stop() { CEDAR_CUDA_CHECK(cudaProfilerStop()); }

namespace {
cudaMemPool_t device_pool() {
  int dev = 0;
  CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
  cudaMemPool_t pool = nullptr;
  CEDAR_CUDA_CHECK(cudaDeviceGetMemPool(&pool, dev));
  return pool;
}
}  // namespace

uint64_t scratch_high_water() {
  uint64_t v = 0;  // the attribute is a cuuint64_t
  CEDAR_CUDA_CHECK(cudaMemPoolGetAttribute(device_pool(), cudaMemPoolAttrUsedMemHigh, &v));
  return v;
}

void keep_scratch_mapped() {
  uint64_t all = ~uint64_t(0);
  CEDAR_CUDA_CHECK(cudaMemPoolSetAttribute(device_pool(), cudaMemPoolAttrReleaseThreshold, &all));
}

void reset_scratch_high_water() {
  uint64_t zero = 0;  // the only value it may be set to
  CEDAR_CUDA_CHECK(cudaMemPoolSetAttribute(device_pool(), cudaMemPoolAttrUsedMemHigh, &zero));
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  CEDAR_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  return p;
}

void device_free(void* p) {
  if (p) CEDAR_CUDA_CHECK(cudaFree(p));
}

void host_free(void* p) {
  if (p) CEDAR_CUDA_CHECK(cudaFreeHost(p));
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CEDAR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, current));
  synchronize();
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CEDAR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, current));
  synchronize();
}

void copy_rows_device(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t row_bytes, std::size_t rows) {
  if (row_bytes == 0 || rows == 0) return;
  CEDAR_CUDA_CHECK(
      cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, current));
}

void copy_to_device_async(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CEDAR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, current));
}

void* scratch_alloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  if (void* p = detail::capture_scratch(bytes)) return p;
  void* p = nullptr;
  CEDAR_CUDA_CHECK(cudaMallocAsync(&p, bytes, current));
  return p;
}

void scratch_free(void* p) {
  if (p && !detail::release_capture_scratch(p)) CEDAR_CUDA_CHECK(cudaFreeAsync(p, current));
}

void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  // the pool keeps freed scratch mapped (keep_scratch_mapped); hand it back so it counts as free
  CEDAR_CUDA_CHECK(cudaDeviceSynchronize());
  CEDAR_CUDA_CHECK(cudaMemPoolTrimTo(device_pool(), 0));
  CEDAR_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

void fill_bytes(void* dst, int byte, std::size_t bytes) {
  if (bytes == 0) return;
  CEDAR_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, current));
}

}  // namespace cedar::cuda
