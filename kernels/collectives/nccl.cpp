// NCCL collectives (see nccl.hpp). all_to_all is grouped point-to-point send/recv;
// exchange_counts stages the host counts through a small device buffer. Errors become
// collective_error carrying ncclGetErrorString / cudaGetErrorString.
#include "kernels/collectives/nccl.hpp"

#include <cstring>
#include <vector>

#ifdef CEDAR_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace cedar {

#ifdef CEDAR_HAVE_NCCL
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw collective_error(std::string("nccl ") + what + ": " + ncclGetErrorString(r));
}
void check_cuda(cudaError_t r, const char* what) {
  if (r != cudaSuccess) throw collective_error(std::string("cuda ") + what + ": " + cudaGetErrorString(r));
}

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(const nccl_group_id& id, int rank, int size, int device)
      : rank_(rank), size_(size), device_(device) {
    check_cuda(cudaSetDevice(device_), "set device");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream create");
    ncclUniqueId uid;
    static_assert(sizeof(uid.internal) == std::tuple_size_v<nccl_group_id>);
    std::memcpy(uid.internal, id.data(), id.size());
    check_nccl(ncclCommInitRank(&comm_, size_, uid, rank_), "comm init");
    check_cuda(cudaMalloc(&counts_dev_, sizeof(uint64_t) * 2 * size_), "counts buffer");
  }
  ~nccl_communicator() override {
    cudaSetDevice(device_);
    if (comm_) ncclCommDestroy(comm_);
    if (counts_dev_) cudaFree(counts_dev_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void enqueue_on(void* stream) override { caller_ = static_cast<cudaStream_t>(stream), ordered_ = true; }

  void all_reduce_sum(float* data, std::size_t count) override {
    check_nccl(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, on()), "all_reduce");
    sync();
  }
  void all_gather(const float* send, std::size_t count, float* recv) override {
    check_nccl(ncclAllGather(send, recv, count, ncclFloat32, comm_, on()), "all_gather");
    sync();
  }
  void reduce_scatter_sum(const float* send, std::size_t count, float* recv) override {
    check_nccl(ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm_, on()), "reduce_scatter");
    sync();
  }
  void broadcast(float* data, std::size_t count, int root) override {
    check_nccl(ncclBroadcast(data, data, count, ncclFloat32, root, comm_, on()), "broadcast");
    sync();
  }
  void exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts) override {
    std::vector<uint64_t> host(send_counts, send_counts + size_);
    uint64_t* send_dev = static_cast<uint64_t*>(counts_dev_);
    uint64_t* recv_dev = send_dev + size_;
    check_cuda(cudaMemcpyAsync(send_dev, host.data(), sizeof(uint64_t) * size_, cudaMemcpyHostToDevice, on()),
               "counts upload");
    exchange_counts_device(send_dev, recv_dev);
    check_cuda(cudaMemcpyAsync(host.data(), recv_dev, sizeof(uint64_t) * size_, cudaMemcpyDeviceToHost, on()),
               "counts download");
    check_cuda(cudaStreamSynchronize(on()), "counts sync");
    for (int p = 0; p < size_; ++p) recv_counts[p] = std::size_t(host[p]);
  }
  void exchange_counts_device(const void* send, void* recv) override {
    const auto* send_dev = static_cast<const uint64_t*>(send);
    auto* recv_dev = static_cast<uint64_t*>(recv);
    check_nccl(ncclGroupStart(), "group start");
    for (int p = 0; p < size_; ++p) {
      check_nccl(ncclSend(send_dev + p, 1, ncclUint64, p, comm_, on()), "send counts");
      check_nccl(ncclRecv(recv_dev + p, 1, ncclUint64, p, comm_, on()), "recv counts");
    }
    check_nccl(ncclGroupEnd(), "group end");
  }
  void all_to_all(const float* send, const std::size_t* send_counts, float* recv,
                  const std::size_t* recv_counts) override {
    std::size_t send_at = 0, recv_at = 0;
    check_nccl(ncclGroupStart(), "group start");
    for (int p = 0; p < size_; ++p) {
      if (send_counts[p] > 0)
        check_nccl(ncclSend(send + send_at, send_counts[p], ncclFloat32, p, comm_, on()), "send");
      if (recv_counts[p] > 0)
        check_nccl(ncclRecv(recv + recv_at, recv_counts[p], ncclFloat32, p, comm_, on()), "recv");
      send_at += send_counts[p];
      recv_at += recv_counts[p];
    }
    check_nccl(ncclGroupEnd(), "group end");
    sync();
  }

 private:
  /// The stream the collectives go to: the caller's (enqueue_on), else the group's own.
  cudaStream_t on() const { return ordered_ ? caller_ : stream_; }
  /// Waits for a collective on the group's own stream (nothing to wait for on the caller's).
  void sync() {
    if (!ordered_) check_cuda(cudaStreamSynchronize(stream_), "stream sync");
  }

  int rank_, size_, device_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t caller_ = nullptr;  ///< enqueue_on's (may be the legacy default stream, 0)
  bool ordered_ = false;
  ncclComm_t comm_ = nullptr;
  void* counts_dev_ = nullptr;  // [2, size] uint64: send then receive counts
};

}  // namespace

bool nccl_available() { return true; }

nccl_group_id nccl_make_group_id() {
  ncclUniqueId uid;
  check_nccl(ncclGetUniqueId(&uid), "unique id");
  nccl_group_id id;
  std::memcpy(id.data(), uid.internal, id.size());
  return id;
}

std::unique_ptr<communicator> make_nccl_communicator(const nccl_group_id& id, int rank, int size, int device) {
  return std::make_unique<nccl_communicator>(id, rank, size, device);
}

#else

bool nccl_available() { return false; }

nccl_group_id nccl_make_group_id() {
  throw collective_error("built without NCCL (no CUDA toolkit with nccl.h was found at configure time)");
}

std::unique_ptr<communicator> make_nccl_communicator(const nccl_group_id&, int, int, int) {
  throw collective_error("built without NCCL (no CUDA toolkit with nccl.h was found at configure time)");
}

#endif

}  // namespace cedar
