// The null engine behind `--model null`: no model, no KV. One thread runs a step loop; each step
// emits the fixed token to every running request, so streaming cost is all that is measured.
// Conversations are counted as they are named and closed, as the real engine's are.
#include <condition_variable>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "net/bridge.hpp"

namespace cedar::net {

namespace {

class null_engine final : public engine_bridge {
 public:
  null_engine(int step_us, int32_t token, std::vector<int32_t> script, int fail_after)
      : step_(std::chrono::microseconds(step_us)), token_(token), script_(std::move(script)),
        fail_after_(fail_after) {
    thread_ = std::thread([this] { loop(); });
  }
  ~null_engine() override { shutdown(); }

  engine_summary summary() const override {
    return {"null", "none (null compute path)", 0, 0, 1 << 20};
  }

  submit_result submit(generate_request request, token_callback on_tokens) override {
    std::lock_guard lock(mutex_);
    if (stopping_) return {submit_status::not_ready, 0, "engine is stopping"};
    if (request.grammar.active())
      return {submit_status::invalid, 0, "structured output needs a model: the null engine replays a script"};
    uint64_t id = ++last_id_;
    if (request.session_id) sessions_.insert(request.session_id);
    live_[id] = live_request{std::move(request), std::move(on_tokens)};
    wake_.notify_one();
    return {submit_status::ok, id, {}};
  }

  void cancel(uint64_t request_id) override {
    std::lock_guard lock(mutex_);
    if (auto it = live_.find(request_id); it != live_.end()) it->second.cancelled = true;
  }

  void close_session(uint64_t key) override {
    std::lock_guard lock(mutex_);
    sessions_.erase(key);
  }

  engine_metrics metrics() const override {
    std::lock_guard lock(mutex_);
    engine_metrics m;
    m.num_running = int(live_.size());
    m.num_sessions_open = int64_t(sessions_.size());
    m.topology = "null";
    return m;
  }

  bool ready() const override { return true; }

  void shutdown() override {
    {
      std::lock_guard lock(mutex_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
      for (auto& [id, r] : live_) r.cancelled = true;
      wake_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct live_request {
    generate_request request;
    token_callback on_tokens;
    int num_emitted = 0;
    bool cancelled = false;
  };

  void loop() {
    auto next = std::chrono::steady_clock::now();
    for (;;) {
      std::vector<std::pair<token_callback*, token_batch>> out;
      std::vector<token_callback> finished_callbacks;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !live_.empty(); });
        if (live_.empty()) return;
        finished_callbacks.reserve(live_.size());  // pointers into it must stay valid below
        for (auto it = live_.begin(); it != live_.end();) {
          step_one(it->second, out);
          if (out.back().second.finished != finish_reason::none) {
            finished_callbacks.push_back(std::move(it->second.on_tokens));
            out.back().first = &finished_callbacks.back();
            it = live_.erase(it);
          } else {
            ++it;
          }
        }
      }
      for (auto& [cb, batch] : out) (*cb)(std::move(batch));
      if (step_.count() > 0) {
        next += step_;
        std::this_thread::sleep_until(next);
        auto now = std::chrono::steady_clock::now();
        if (next < now - step_ * 10) next = now;  // do not burst after a stall
      }
    }
  }

  void step_one(live_request& r, std::vector<std::pair<token_callback*, token_batch>>& out) {
    token_batch b;
    b.num_prompt_tokens = int(r.request.prompt_ids.size());
    if (r.cancelled) {
      b.finished = finish_reason::cancelled;
    } else if (fail_after_ > 0 && r.num_emitted >= fail_after_) {
      b.finished = finish_reason::error;
      b.error = "the null engine failed after " + std::to_string(fail_after_) + " tokens (--null-fail-after)";
    } else {
      int32_t id = token_;
      bool last = false;
      if (!script_.empty()) {
        size_t i = size_t(r.num_emitted);
        last = i >= script_.size();
        id = last ? (r.request.stop_ids.empty() ? 1 : r.request.stop_ids.front()) : script_[i];
      }
      b.ids.push_back(id);
      if (r.request.top_logprobs >= 0) {
        b.logprobs.push_back(0.0f);
        b.top.push_back(std::vector<token_logprob>(size_t(r.request.top_logprobs), {id, 0.0f}));
      }
      if (last) b.finished = finish_reason::stop;
      else if (++r.num_emitted >= r.request.max_tokens) b.finished = finish_reason::length;
    }
    out.emplace_back(&r.on_tokens, std::move(b));
  }

  const std::chrono::microseconds step_;
  const int32_t token_;
  const std::vector<int32_t> script_;
  const int fail_after_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, live_request> live_;
  std::set<uint64_t> sessions_;  ///< conversations named by requests and not closed
  uint64_t last_id_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<engine_bridge> make_null_engine(int step_us, int32_t token, std::vector<int32_t> script,
                                                int fail_after) {
  return std::make_unique<null_engine>(step_us, token, std::move(script), fail_after);
}

}  // namespace cedar::net
