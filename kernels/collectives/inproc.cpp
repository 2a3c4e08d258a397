// In-process collectives (see inproc.hpp). Every collective is two barriers: after the first
// every rank's buffers are posted and readable; each rank then reads what it needs from its
// peers into its own output; after the second no rank reads a peer's buffer any more, so the
// callers may reuse them. Sums are formed by each rank alone, in rank order.
#include "kernels/collectives/inproc.hpp"

#include <algorithm>
#include <numeric>

namespace cedar {

class inproc_communicator final : public communicator {
 public:
  inproc_communicator(std::shared_ptr<inproc_group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size_; }

  void all_reduce_sum(float* data, std::size_t count) override {
    post({nullptr, data, nullptr});
    std::vector<float> sum(peer(0).data, peer(0).data + count);
    for (int p = 1; p < size(); ++p)
      for (std::size_t i = 0; i < count; ++i) sum[i] += peer(p).data[i];
    g_->arrive_and_wait(rank_);
    std::copy(sum.begin(), sum.end(), data);
  }

  void all_gather(const float* send, std::size_t count, float* recv) override {
    post({send, nullptr, nullptr});
    for (int p = 0; p < size(); ++p) std::copy_n(peer(p).send, count, recv + std::size_t(p) * count);
    g_->arrive_and_wait(rank_);
  }

  void reduce_scatter_sum(const float* send, std::size_t count, float* recv) override {
    post({send, nullptr, nullptr});
    const std::size_t off = std::size_t(rank_) * count;
    std::copy_n(peer(0).send + off, count, recv);
    for (int p = 1; p < size(); ++p)
      for (std::size_t i = 0; i < count; ++i) recv[i] += peer(p).send[off + i];
    g_->arrive_and_wait(rank_);
  }

  void broadcast(float* data, std::size_t count, int root) override {
    post({nullptr, data, nullptr});
    std::vector<float> copy(peer(root).data, peer(root).data + count);
    g_->arrive_and_wait(rank_);  // the root's buffer is read by all before anyone writes
    if (rank_ != root) std::copy(copy.begin(), copy.end(), data);
  }

  void exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts) override {
    post({nullptr, nullptr, send_counts});
    for (int p = 0; p < size(); ++p) recv_counts[p] = peer(p).counts[rank_];
    g_->arrive_and_wait(rank_);
  }

  void all_to_all(const float* send, const std::size_t* send_counts, float* recv,
                  const std::size_t* recv_counts) override {
    post({send, nullptr, send_counts});
    std::size_t at = 0;
    for (int p = 0; p < size(); ++p) {
      const inproc_group::posted& q = peer(p);
      const std::size_t off = std::accumulate(q.counts, q.counts + rank_, std::size_t(0));
      if (q.counts[rank_] != recv_counts[p])
        throw collective_error("all_to_all: rank " + std::to_string(p) + " sends " +
                               std::to_string(q.counts[rank_]) + " values, rank " +
                               std::to_string(rank_) + " expects " + std::to_string(recv_counts[p]));
      std::copy_n(q.send + off, recv_counts[p], recv + at);
      at += recv_counts[p];
    }
    g_->arrive_and_wait(rank_);
  }

 private:
  /// Posts this rank's buffers and waits until every rank has posted.
  void post(inproc_group::posted mine) {
    {
      std::lock_guard<std::mutex> lock(g_->mu_);
      g_->posted_[rank_] = mine;
    }
    g_->arrive_and_wait(rank_);
  }
  const inproc_group::posted& peer(int p) const { return g_->posted_[p]; }

  std::shared_ptr<inproc_group> g_;
  int rank_;
};

inproc_group::inproc_group(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout), posted_(size) {}

std::shared_ptr<inproc_group> inproc_group::make(int size, std::chrono::milliseconds timeout) {
  if (size < 1) throw std::invalid_argument("inproc_group: size must be >= 1");
  return std::shared_ptr<inproc_group>(new inproc_group(size, timeout));
}

std::unique_ptr<communicator> inproc_group::join(int rank) {
  if (rank < 0 || rank >= size_) throw std::invalid_argument("inproc_group: rank out of range");
  return std::make_unique<inproc_communicator>(shared_from_this(), rank);
}

void inproc_group::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
  }
  cv_.notify_all();
}

bool inproc_group::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

void inproc_group::arrive_and_wait(int rank) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) throw collective_error("collective group aborted: " + abort_reason_);
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  const bool done = cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || aborted_; });
  if (generation_ != gen) return;
  if (!done && !aborted_) {
    aborted_ = true;
    abort_reason_ = "rank " + std::to_string(rank) + " waited " + std::to_string(timeout_.count()) +
                    " ms for its peers";
    cv_.notify_all();
  }
  throw collective_error("collective group aborted: " + abort_reason_);
}

}  // namespace cedar
