// A layout rank as a step_model (see rank_model.hpp).
#include "actors/rank_model.hpp"

#include "actors/rank_source.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace cedar {
namespace {

class rank_model final : public step_model {
 public:
  rank_model(std::shared_ptr<const model> m, shard_view v, std::unique_ptr<communicator> c)
      : m_(std::move(m)), view_(v), comm_(std::move(c)) {
    view_.comm = comm_.get();
  }
  const model_args& args() const override { return m_->args(); }
  const kv_layout& layout() const override { return m_->layout(); }

  void forward(std::span<forward_item> batch, std::vector<float>& logits) override {
    if (!view_.tp_follower()) return m_->forward(batch, logits, view_);
    const std::size_t rows = drop_logits(batch);
    m_->forward(batch, logits, view_);
    logits.assign(rows * std::size_t(m_->args().vocab_size), 0.0f);
  }

 private:
  std::shared_ptr<const model> m_;
  shard_view view_;
  std::unique_ptr<communicator> comm_;
};

class cpu_rank_source final : public rank_source {
 public:
  explicit cpu_rank_source(std::shared_ptr<const model> m) : m_(std::move(m)) {}
  const model_args& args() const override { return m_->args(); }
  const kv_layout& layout() const override { return m_->layout(); }
  std::string check(const layout_spec&) const override { return {}; }
  bool remote_shards() const override { return true; }
  int64_t host_kv_memory_bytes() const override { return host_memory_bytes(); }
  layout_ranks make(const layout_spec& spec, int first, std::chrono::milliseconds timeout) override {
    layout_ranks out;
    if (spec.num_shards > 1) out.comm = inproc_group::make(spec.num_shards, timeout);
    for (int r = first; r < spec.num_shards; ++r) {
      std::unique_ptr<communicator> c = out.comm ? out.comm->join(r) : nullptr;
      const shard_view view = make_shard_view(m_->args(), spec.mode, r, spec.num_shards, c.get());
      out.models.push_back(make_rank_model(m_, view, std::move(c)));
    }
    return out;
  }

 private:
  std::shared_ptr<const model> m_;
};

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(int64_t(1) << 30));
  return text;
}

}  // namespace

int64_t host_memory_bytes() {
  int64_t bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  std::ifstream limit("/sys/fs/cgroup/memory.max");  // "max" when there is none
  if (int64_t cgroup = 0; limit >> cgroup && cgroup > 0) bytes = std::min(bytes, cgroup);
  return bytes;
}

std::string check_host_kv(const rank_source& src, int64_t budget, int arenas, const std::string& what) {
  const int64_t host = src.host_kv_memory_bytes();
  if (host < 0 || arenas <= 0 || budget <= host / arenas) return {};
  return what + " needs " + std::to_string(arenas) + " KV arenas of --kv-budget-bytes " + std::to_string(budget) +
         " (" + gib(budget) + ") each, more than this host's " + gib(host) + " of memory; lower --kv-budget-bytes";
}

std::shared_ptr<rank_source> make_cpu_rank_source(std::shared_ptr<const model> m) {
  return std::make_shared<cpu_rank_source>(std::move(m));
}

std::unique_ptr<step_model> make_rank_model(std::shared_ptr<const model> m, shard_view view,
                                            std::unique_ptr<communicator> comm) {
  return std::make_unique<rank_model>(std::move(m), view, std::move(comm));
}

}  // namespace cedar
