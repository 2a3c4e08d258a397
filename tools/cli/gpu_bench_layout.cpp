// `cedar gpu-bench --layout tpN|depN`: the decode phase on N devices. Each rank has its own
// shard (its model's experts, its KV arena on its device) and a thread of its own, as the
// serving runtime's rank shards do; a step is sent to every rank at once and lasts until the
// slowest returns. TP: every rank runs the whole batch (the leader's tokens are the step's).
// DEP: the batch is split into N contiguous parts, one per rank; the experts' exchange joins
// them inside the step.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "kernels/cuda/cuda_ops.hpp"
#include "tools/cli/gpu_bench.hpp"

namespace cedar::cli::gpu_bench {
namespace {

using clock_type = std::chrono::steady_clock;

/// One thread per rank, each on its rank's device; run() hands every rank its part of a piece
/// of work and returns when all are done, rethrowing the first failure.
class rank_threads {
 public:
  explicit rank_threads(int n) : errors_(n) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~rank_threads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  rank_threads(const rank_threads&) = delete;
  rank_threads& operator=(const rank_threads&) = delete;

  void run(const std::function<void(int rank)>& work) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = work;
    for (auto& e : errors_) e.clear();
    pending_ = int(errors_.size());
    ++generation_;
    cv_.notify_all();
    done_.wait(lock, [&] { return pending_ == 0; });
    for (std::size_t r = 0; r < errors_.size(); ++r)
      if (!errors_[r].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors_[r]);
  }

 private:
  void loop(int rank) {
#ifdef CEDAR_HAVE_CUDA
    cuda::set_device(rank);
#endif
    uint64_t seen = 0;
    for (;;) {
      std::function<void(int)> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      std::string error;
      try {
        job(rank);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard<std::mutex> lock(mu_);
      errors_[rank] = error;
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::function<void(int)> job_;  ///< the work of the current run, each rank its own part
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

std::string run_layout_decode(report& rep, const model_args& args) {
  const options& o = rep.opts;
  const int N = o.layout_size;
  std::string error;
  const auto t0 = clock_type::now();
  auto weights = load_weights(o.model, args, o.seed, o.progress, &error);
  if (!weights) return error;
  if (o.batch_invariant) set_gpu_batch_invariant(*o.batch_invariant);
  if (const std::string why = check_layout(args, o.layout_mode, N); !why.empty()) return why;
  auto src = make_gpu_layout_source(args, std::move(weights), o.kv, o.page_tokens, o.kernels, o.dense_bf16, N,
                                    o.progress, &error);
  if (!src) return error;
  layout_spec spec;
  spec.mode = o.layout_mode, spec.num_shards = N;
  std::vector<std::unique_ptr<step_model>> models;
  try {
    models = src->make(spec, 0, std::chrono::milliseconds(0)).models;
  } catch (const std::exception& e) {
    return e.what();
  }
  rep.load_s = seconds_since(t0);
  rep.ceil = measure_ceilings(device_kind::cuda);
  rep.device = std::to_string(N) + " x " + rep.ceil.device;
  const kv_layout layout = models[0]->layout();
  const kv_capacity cap = bench_capacity(o, layout);
  rank_threads ranks(N);
  std::vector<std::unique_ptr<shard>> shards(N);
  std::vector<std::unique_ptr<runner>> runners(N);
  ranks.run([&](int r) {
    shards[r] = std::make_unique<shard>(std::move(models[r]), cap);
    runners[r] = std::make_unique<runner>(*shards[r], cap, o, rep.ceil);
  });
  const bool dep = o.layout_mode == parallel_mode::dep;
  for (int batch : o.batches) {
    decode_result res;
    res.batch = batch, res.context = o.context, res.steps = o.steps;
    std::vector<std::vector<bench_request>> reqs(N);
    const auto tf = clock_type::now();
    ranks.run([&](int r) {
      const int first = dep ? int(int64_t(batch) * r / N) : 0;
      const int last = dep ? int(int64_t(batch) * (r + 1) / N) : batch;
      reqs[r] = runners[r]->decode_requests(first, last - first);
    });
    res.fill_s = seconds_since(tf);
    double timed_s = 0;
    res.min_step_ms = 1e300;
    const int calls = o.warmup_steps + o.steps;
    for (int step = 0; step < calls; ++step) {
      const auto ts = clock_type::now();
      ranks.run([&](int r) { runners[r]->decode_step(reqs[r]); });
      if (!dep)  // TP followers hand back token 0: every rank goes on with the leader's tokens
        for (int r = 1; r < N; ++r)
          for (std::size_t b = 0; b < reqs[r].size(); ++b) reqs[r][b].tokens.back() = reqs[0][b].tokens.back();
      const double s = seconds_since(ts);
      if (step >= o.warmup_steps) timed_s += s, res.min_step_ms = std::min(res.min_step_ms, 1e3 * s);
      if (o.progress && (step + 1 == calls || (step + 1) % 8 == 0))
        std::fprintf(stderr, "gpu-bench: %s%d decode batch %d: step %d of %d, %.2f ms\n", dep ? "dep" : "tp", N, batch,
                     step + 1, calls, 1e3 * s);
    }
    res.step_ms = 1e3 * timed_s / std::max(1, o.steps);
    res.tok_s = res.step_ms > 0 ? 1e3 * batch / res.step_ms : 0;
    finish_decode_result(res, args, layout, rep.ceil, N);
    rep.decode.push_back(res);
    if (!o.out.empty()) write_json(rep, o.out);
  }
  ranks.run([&](int r) { runners[r].reset(), shards[r].reset(); });  // each device's memory freed on its thread
  return {};
}

}  // namespace cedar::cli::gpu_bench
