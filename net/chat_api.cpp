// Chat Completions and Completions writers (OpenAI shapes, with DeepSeek's reasoning_content).
#include "net/api_writers.hpp"
#include "net/json_writer.hpp"

namespace cedar::net {

void write_chat_usage(json_writer& w, const turn_result& r) {
  w.key("usage").obj()
      .kv("prompt_tokens", r.num_prompt_tokens)
      .kv("completion_tokens", r.num_completion_tokens)
      .kv("total_tokens", r.num_prompt_tokens + r.num_completion_tokens);
  w.key("prompt_tokens_details").obj().kv("cached_tokens", r.num_cached_tokens).end_obj();
  w.key("completion_tokens_details").obj().kv("reasoning_tokens", r.num_reasoning_tokens).end_obj();
  w.end_obj();
}

namespace {

void write_logprob_entry(json_writer& w, const prompt_codec& codec, int32_t id, float logprob,
                         const std::vector<token_logprob>* top) {
  std::string text = codec.token_text(id);
  w.obj().kv("token", text).kv("logprob", double(logprob)).key("bytes").arr();
  for (unsigned char c : text) w.num(int64_t{c});
  w.end_arr();
  if (top) {
    w.key("top_logprobs").arr();
    for (auto& t : *top) write_logprob_entry(w, codec, t.id, t.logprob, nullptr);
    w.end_arr();
  }
  w.end_obj();
}

void write_logprobs(json_writer& w, const prompt_codec& codec, const token_logprobs* begin,
                    const token_logprobs* end) {
  w.key("logprobs").obj().key("content").arr();
  for (auto* p = begin; p != end; ++p) write_logprob_entry(w, codec, p->id, p->logprob, &p->top);
  w.end_arr().end_obj();
}

/// An engine failure mid-answer: the error object as the body (the session answers 500), or as
/// the stream's last event before [DONE], which the SDKs raise as an APIError.
void fail(const turn_result& r, const writer_context& ctx, frame_sink& sink) {
  const auto now = std::chrono::steady_clock::now();
  sink.send_frame({}, engine_failed(r.error).to_json(), now);
  if (ctx.stream) sink.send_frame({}, "[DONE]", now);
}

/// The Completions form: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; `offset`
/// (characters of text before the first of these tokens) moves past them.
void write_completion_logprobs(json_writer& w, const prompt_codec& codec, const token_logprobs* begin,
                               const token_logprobs* end, int64_t& offset) {
  std::vector<std::string> texts;
  for (auto* p = begin; p != end; ++p) texts.push_back(codec.token_text(p->id));
  w.key("logprobs").obj().key("tokens").arr();
  for (auto* p = begin; p != end; ++p) w.str(codec.token_name(p->id));
  w.end_arr().key("token_logprobs").arr();
  for (auto* p = begin; p != end; ++p) w.num(double(p->logprob));
  w.end_arr().key("top_logprobs").arr();
  for (auto* p = begin; p != end; ++p) {
    w.obj();
    for (auto& t : p->top) w.kv(codec.token_name(t.id), double(t.logprob));
    w.end_obj();
  }
  w.end_arr().key("text_offset").arr();
  for (auto& t : texts) {  // the text's characters, as the answer's text holds them
    w.num(offset);
    for (unsigned char c : t) offset += (c & 0xC0) != 0x80;  // characters: UTF-8 lead bytes
  }
  w.end_arr().end_obj();
}

class chat_writer final : public response_writer {
 public:
  explicit chat_writer(writer_context ctx) : ctx_(std::move(ctx)) {}

  void deltas(const std::vector<stream_delta>& deltas, const token_batch&, const turn_result& r,
              frame_sink& sink) override {
    if (!ctx_.stream) return;
    pending_logprobs_ = &r.logprobs;
    if (!role_sent_) {
      role_sent_ = true;
      chunk(sink, [](json_writer& w) { w.kv("role", "assistant").kv("content", ""); }, nullptr);
    }
    for (auto& d : deltas) {
      chunk(sink, [&](json_writer& w) {
        switch (d.type) {
          case stream_delta::kind::reasoning: w.kv("reasoning_content", d.text); break;
          case stream_delta::kind::content: w.kv("content", d.text); break;
          case stream_delta::kind::tool_call_begin:
            w.key("tool_calls").arr().obj().kv("index", d.tool_index)
                .kv("id", r.tool_calls[size_t(d.tool_index)].id).kv("type", "function")
                .key("function").obj().kv("name", d.tool_name).kv("arguments", "")
                .end_obj().end_obj().end_arr();
            break;
          case stream_delta::kind::tool_call_args:
            w.key("tool_calls").arr().obj().kv("index", d.tool_index).key("function").obj()
                .kv("arguments", d.text).end_obj().end_obj().end_arr();
            break;
        }
      }, nullptr);
    }
    if (ctx_.logprobs && logprobs_sent_ < r.logprobs.size())  // tokens whose text is held back
      chunk(sink, [](json_writer&) {}, nullptr);
  }

  void end(const turn_result& r, frame_sink& sink) override {
    if (r.finished == finish_reason::error) return fail(r, ctx_, sink);
    if (!ctx_.stream) { sink.send_frame({}, full(r), now()); return; }
    pending_logprobs_ = &r.logprobs;
    std::string reason = r.finish_reason_text();
    chunk(sink, [](json_writer&) {}, &reason);
    if (ctx_.include_usage) {
      json_writer w;
      head(w);
      w.key("choices").arr().end_arr();
      write_chat_usage(w, r);
      sink.send_frame({}, w.end_obj().take(), now());
    }
    sink.send_frame({}, "[DONE]", now());
  }

 private:
  static std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }

  void head(json_writer& w) const {
    w.obj().kv("id", ctx_.id).kv("object", ctx_.stream ? "chat.completion.chunk" : "chat.completion")
        .kv("created", ctx_.created).kv("model", ctx_.model).kv("system_fingerprint", "cedar");
  }

  template <class F>
  void chunk(frame_sink& sink, F&& body, const std::string* finish) {
    json_writer w;
    head(w);
    w.key("choices").arr().obj().kv("index", 0).key("delta").obj();
    body(w);
    w.end_obj();
    if (ctx_.logprobs && pending_logprobs_) {
      write_logprobs(w, *ctx_.codec, pending_logprobs_->data() + logprobs_sent_,
                     pending_logprobs_->data() + pending_logprobs_->size());
      logprobs_sent_ = pending_logprobs_->size();
    } else {
      w.key("logprobs").null();
    }
    w.key("finish_reason");
    if (finish) w.str(*finish); else w.null();
    w.end_obj().end_arr();
    if (ctx_.include_usage) w.key("usage").null();
    sink.send_frame({}, w.end_obj().take(), now());
  }

  std::string full(const turn_result& r) const {
    json_writer w;
    head(w);
    w.key("choices").arr().obj().kv("index", 0).key("message").obj().kv("role", "assistant");
    w.key("content");
    if (r.content.empty() && !r.tool_calls.empty()) w.null(); else w.str(r.content);
    if (!r.reasoning.empty()) w.kv("reasoning_content", r.reasoning);
    if (!r.tool_calls.empty()) {
      w.key("tool_calls").arr();
      for (auto& c : r.tool_calls)
        w.obj().kv("id", c.id).kv("type", "function").key("function").obj().kv("name", c.name)
            .kv("arguments", c.arguments).end_obj().end_obj();
      w.end_arr();
    }
    w.end_obj();
    if (ctx_.logprobs) write_logprobs(w, *ctx_.codec, r.logprobs.data(), r.logprobs.data() + r.logprobs.size());
    else w.key("logprobs").null();
    w.kv("finish_reason", r.finish_reason_text()).end_obj().end_arr();
    write_chat_usage(w, r);
    return w.end_obj().take();
  }

  writer_context ctx_;
  bool role_sent_ = false;
  size_t logprobs_sent_ = 0;
  const std::vector<token_logprobs>* pending_logprobs_ = nullptr;  ///< the result's, once seen
};

class completion_writer final : public response_writer {
 public:
  completion_writer(writer_context ctx, std::string echo) : ctx_(std::move(ctx)), echo_(std::move(echo)) {}

  void deltas(const std::vector<stream_delta>& deltas, const token_batch&, const turn_result& r,
              frame_sink& sink) override {
    if (!ctx_.stream) return;
    std::string text = std::exchange(echo_pending_, {});
    for (auto& d : deltas) text += d.text;
    const bool new_logprobs = ctx_.logprobs && logprobs_sent_ < r.logprobs.size();
    if (!text.empty() || new_logprobs) chunk(sink, text, nullptr, nullptr, &r);
  }

  void end(const turn_result& r, frame_sink& sink) override {
    if (r.finished == finish_reason::error) return fail(r, ctx_, sink);
    std::string reason = r.finish_reason_text();
    if (!ctx_.stream) {
      json_writer w;
      head(w);
      w.key("choices").arr().obj().kv("index", 0).kv("text", echo_ + r.content);
      logprobs(w, r);
      w.kv("finish_reason", reason).end_obj().end_arr();
      write_chat_usage(w, r);
      sink.send_frame({}, w.end_obj().take(), std::chrono::steady_clock::now());
      return;
    }
    chunk(sink, std::exchange(echo_pending_, {}), &reason, nullptr, &r);
    if (ctx_.include_usage) chunk(sink, {}, nullptr, &r, nullptr);
    sink.send_frame({}, "[DONE]", std::chrono::steady_clock::now());
  }

 private:
  void head(json_writer& w) const {
    w.obj().kv("id", ctx_.id).kv("object", "text_completion").kv("created", ctx_.created)
        .kv("model", ctx_.model);
  }
  /// The logprobs of the tokens not sent yet (null unless asked for).
  void logprobs(json_writer& w, const turn_result& r) {
    if (!ctx_.logprobs) { w.key("logprobs").null(); return; }
    write_completion_logprobs(w, *ctx_.codec, r.logprobs.data() + logprobs_sent_,
                              r.logprobs.data() + r.logprobs.size(), text_offset_);
    logprobs_sent_ = r.logprobs.size();
  }

  void chunk(frame_sink& sink, const std::string& text, const std::string* finish,
             const turn_result* usage, const turn_result* tokens) {
    json_writer w;
    head(w);
    w.key("choices").arr();
    if (!usage) {
      w.obj().kv("index", 0).kv("text", text);
      if (tokens) logprobs(w, *tokens); else w.key("logprobs").null();
      w.key("finish_reason");
      if (finish) w.str(*finish); else w.null();
      w.end_obj();
    }
    w.end_arr();
    if (usage) write_chat_usage(w, *usage);
    sink.send_frame({}, w.end_obj().take(), std::chrono::steady_clock::now());
  }

  writer_context ctx_;
  std::string echo_;
  std::string echo_pending_ = echo_;
  size_t logprobs_sent_ = 0;
  int64_t text_offset_ = [this] {  // the generated text starts after the echoed prompt
    int64_t n = 0;
    for (unsigned char c : echo_) n += (c & 0xC0) != 0x80;
    return n;
  }();
};

}  // namespace

std::unique_ptr<response_writer> make_chat_writer(writer_context ctx) {
  return std::make_unique<chat_writer>(std::move(ctx));
}

std::unique_ptr<response_writer> make_completion_writer(writer_context ctx, std::string echo_text) {
  return std::make_unique<completion_writer>(std::move(ctx), std::move(echo_text));
}

}  // namespace cedar::net
