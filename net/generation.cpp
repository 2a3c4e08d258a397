// generation: engine callbacks -> strand -> parser -> stop strings -> writer -> sink.
#include "net/generation.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>

#include "net/server_state.hpp"

namespace cedar::net {

std::string turn_result::finish_reason_text() const {
  switch (finished) {
    case finish_reason::length: return "length";
    case finish_reason::cancelled: return "cancelled";
    case finish_reason::error: return "error";
    default: return tool_calls.empty() ? "stop" : "tool_calls";
  }
}

generation::generation(std::shared_ptr<server_state> state, boost::asio::any_io_executor strand,
                       std::unique_ptr<output_stream> parser, std::unique_ptr<response_writer> writer,
                       std::vector<std::string> stop, bool parallel_tool_calls, frame_sink* sink)
    : state_(std::move(state)), strand_(std::move(strand)), parser_(std::move(parser)),
      writer_(std::move(writer)), stop_(std::move(stop)), parallel_tool_calls_(parallel_tool_calls), sink_(sink) {
  state_->metrics.num_active_generations.fetch_add(1);
}

generation::~generation() {
  detach();
  if (!done_) state_->metrics.num_active_generations.fetch_sub(1);
}

std::optional<api_error> generation::start(generate_request request, const std::string& prompt_param) {
  auto& m = state_->metrics;
  if (m.num_active_generations.load() > state_->options.max_active_generations)
    return overloaded("too many requests in flight; retry later");
  result_.num_prompt_tokens = int(request.prompt_ids.size());
  std::weak_ptr<generation> weak = weak_from_this();
  auto strand = strand_;
  auto submitted = state_->engine->submit(std::move(request), [weak, strand](token_batch b) {
    boost::asio::post(strand, [weak, b = std::move(b)]() mutable {
      if (auto self = weak.lock()) self->on_batch(std::move(b));
    });
  });
  switch (submitted.status) {
    case submit_status::ok: break;
    case submit_status::overloaded: return overloaded(submitted.message);
    case submit_status::not_ready: return not_ready(submitted.message);
    case submit_status::too_long:
      return bad_request(submitted.message, prompt_param, "context_length_exceeded");
    case submit_status::invalid: return bad_request(submitted.message);
  }
  request_id_ = submitted.request_id;
  submitted_ = true;
  m.num_prompt_tokens.fetch_add(result_.num_prompt_tokens);
  return {};
}

void generation::open_stream() {
  if (sink_ && !done_) writer_->begin(*sink_);
}

void generation::detach() {
  sink_ = nullptr;
  if (submitted_ && !done_ && !cancel_sent_) {
    cancel_sent_ = true;
    state_->engine->cancel(request_id_);
    state_->metrics.num_requests_cancelled.fetch_add(1);
  }
}

void generation::cancel() {
  if (done_ || !submitted_) return;
  if (!cancel_sent_) {
    cancel_sent_ = true;
    state_->engine->cancel(request_id_);
    state_->metrics.num_requests_cancelled.fetch_add(1);
  }
  finish(finish_reason::cancelled);
}

void generation::on_batch(token_batch batch) {
  if (done_ || !sink_) return;
  auto self = shared_from_this();
  auto now = std::chrono::steady_clock::now();
  result_.num_prompt_tokens = batch.num_prompt_tokens;
  result_.num_cached_tokens = batch.num_cached_tokens;
  if (!batch.ids.empty()) {
    if (result_.num_completion_tokens == 0) {
      ttft_s_ = std::chrono::duration<double>(now - started_at_).count();
      state_->metrics.ttft.observe(ttft_s_);
      state_->metrics.num_cached_prompt_tokens.fetch_add(batch.num_cached_tokens);
    } else {
      state_->metrics.inter_token.observe(std::chrono::duration<double>(now - last_token_at_).count());
    }
    last_token_at_ = now;
    result_.num_completion_tokens += int(batch.ids.size());
    state_->metrics.num_generated_tokens.fetch_add(int64_t(batch.ids.size()));
    for (size_t i = 0; i < batch.logprobs.size(); ++i)
      result_.logprobs.push_back({batch.ids[i], batch.logprobs[i],
                                  i < batch.top.size() ? batch.top[i] : std::vector<token_logprob>{}});
  }
  std::vector<stream_delta> deltas;
  if (batch.ids.size() == 1 || !parser_->in_reasoning()) {
    result_.num_reasoning_tokens += parser_->in_reasoning() ? int(batch.ids.size()) : 0;
    parser_->push(batch.ids, deltas);
  } else {  // the reasoning may end inside the batch: count id by id
    for (int32_t id : batch.ids) {
      result_.num_reasoning_tokens += parser_->in_reasoning();
      parser_->push({id}, deltas);
    }
  }
  bool final = batch.finished != finish_reason::none;
  if (final) parser_->finish(deltas);
  filter_stop(deltas, final);
  limit_tool_calls(deltas);
  apply(deltas);
  if (!deltas.empty() || !batch.ids.empty()) writer_->deltas(deltas, batch, result_, *sink_);
  if (result_.stopped_early) {
    if (!cancel_sent_) {
      cancel_sent_ = true;
      state_->engine->cancel(request_id_);
      state_->metrics.num_requests_cancelled.fetch_add(1);
    }
    finish(finish_reason::stop);
  } else if (final) {
    finish(batch.finished, batch.error);
  }
}

void generation::apply(std::vector<stream_delta>& deltas) {
  for (auto& d : deltas) {
    switch (d.type) {
      case stream_delta::kind::reasoning: result_.reasoning += d.text; break;
      case stream_delta::kind::content: result_.content += d.text; break;
      case stream_delta::kind::tool_call_begin:
        result_.tool_calls.push_back({"call_" + state_->new_id("").substr(0, 16), d.tool_name, {}});
        break;
      case stream_delta::kind::tool_call_args:
        if (!result_.tool_calls.empty()) result_.tool_calls.back().arguments += d.text;
        break;
    }
  }
}

void generation::filter_stop(std::vector<stream_delta>& deltas, bool final) {
  if (stop_.empty() || result_.stopped_early) return;
  size_t longest = 0;
  for (auto& s : stop_) longest = std::max(longest, s.size());
  std::vector<stream_delta> out;
  for (auto& d : deltas) {
    if (d.type != stream_delta::kind::content) {
      // Content held for a possible stop string is complete once anything else follows it: it
      // goes out first, so the order of text and tool calls stays the model's.
      if (!stop_hold_.empty())
        out.push_back({stream_delta::kind::content, std::exchange(stop_hold_, {}), -1, {}});
      out.push_back(std::move(d));
      continue;
    }
    stop_hold_ += d.text;
    size_t cut = std::string::npos;
    for (auto& s : stop_) cut = std::min(cut, stop_hold_.find(s));
    if (cut != std::string::npos) {
      if (cut) out.push_back({stream_delta::kind::content, stop_hold_.substr(0, cut), -1, {}});
      stop_hold_.clear();
      result_.stopped_early = true;
      break;
    }
    size_t keep = std::min(stop_hold_.size(), longest - 1);
    size_t emit = stop_hold_.size() - keep;
    while (emit > 0 && emit < stop_hold_.size() && (stop_hold_[emit] & 0xC0) == 0x80) --emit;
    if (emit) out.push_back({stream_delta::kind::content, stop_hold_.substr(0, emit), -1, {}});
    stop_hold_.erase(0, emit);
  }
  if (final && !result_.stopped_early && !stop_hold_.empty())
    out.push_back({stream_delta::kind::content, std::exchange(stop_hold_, {}), -1, {}});
  deltas = std::move(out);
}

void generation::limit_tool_calls(std::vector<stream_delta>& deltas) {
  if (parallel_tool_calls_) return;
  auto second = std::find_if(deltas.begin(), deltas.end(), [](const stream_delta& d) {
    return d.type == stream_delta::kind::tool_call_begin && d.tool_index > 0;
  });
  if (second == deltas.end()) return;
  deltas.erase(second, deltas.end());
  result_.stopped_early = true;
}

void generation::finish(finish_reason why, std::string error) {
  if (done_) return;
  done_ = true;
  // A finished generation no longer counts as active, even while its socket keeps it for the
  // next turn: --max-active and the drain count only work still in flight.
  state_->metrics.num_active_generations.fetch_sub(1);
  if (why == finish_reason::error) state_->metrics.num_requests_failed.fetch_add(1);
  result_.finished = why;
  result_.error = std::move(error);
  if (!sink_) return;
  writer_->end(result_, *sink_);
  sink_->generation_done();
}

}  // namespace cedar::net
