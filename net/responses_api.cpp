// The Responses API writer: the response object, its streaming events (created, output items,
// reasoning / text / function-call argument deltas, completed with usage), and storing the turn
// for previous_response_id when it ends.
#include "net/api_parse.hpp"
#include "net/api_writers.hpp"
#include "net/json_writer.hpp"

namespace cedar::net {

namespace {

/// One output item as it is built.
struct output_item {
  enum class kind { reasoning, message, function_call } type;
  std::string id;
  std::string text;     ///< reasoning text, message text, or call arguments
  std::string call_id;  ///< function_call
  std::string name;     ///< function_call
  bool done = false;
  const char* status = "in_progress";  ///< completed once closed; incomplete if the response ended it
};

class responses_writer final : public response_writer {
 public:
  responses_writer(writer_context ctx, responses_turn turn)
      : ctx_(std::move(ctx)), turn_(std::move(turn)) {}
  /// A turn that never ended (its connection closed, or it never started) keeps no engine
  /// session, unless a stored turn or the WebSocket that opened it still holds it.
  ~responses_writer() override {
    if (!ended_ && !turn_.on_stored) turn_.state->responses->release(turn_.session_id);
  }

  void begin(frame_sink& sink) override {
    if (!ctx_.stream) return;
    event(sink, "response.created", [&](json_writer& w) { w.key("response"); response(w, nullptr); });
    event(sink, "response.in_progress", [&](json_writer& w) { w.key("response"); response(w, nullptr); });
  }

  void deltas(const std::vector<stream_delta>& deltas, const token_batch& batch, const turn_result& r,
              frame_sink& sink) override {
    generated_.insert(generated_.end(), batch.ids.begin(), batch.ids.end());
    for (auto& d : deltas) {
      switch (d.type) {
        case stream_delta::kind::reasoning:
          open(output_item::kind::reasoning, sink, {}, {});
          delta(sink, "response.reasoning_text.delta", d.text);
          break;
        case stream_delta::kind::content:
          open(output_item::kind::message, sink, {}, {});
          delta(sink, "response.output_text.delta", d.text);
          break;
        case stream_delta::kind::tool_call_begin:
          close_current(sink);
          open(output_item::kind::function_call, sink, d.tool_name,
               r.tool_calls[size_t(d.tool_index)].id);
          break;
        case stream_delta::kind::tool_call_args:
          delta(sink, "response.function_call_arguments.delta", d.text);
          break;
      }
    }
  }

  void end(const turn_result& r, frame_sink& sink) override {
    ended_ = true;
    // An item still open when the response stops short (max_output_tokens, cancel, failure) is
    // incomplete: its text or arguments may be cut.
    if (!items_.empty() && !items_.back().done && r.finished != finish_reason::stop)
      items_.back().status = "incomplete";
    if (!items_.empty()) close_current(sink);
    status_ = r.finished == finish_reason::cancelled ? "cancelled"
              : r.finished == finish_reason::length  ? "incomplete"
              : r.finished == finish_reason::error   ? "failed"
                                                     : "completed";
    json_writer full;
    response(full, &r);
    std::string body = full.take();
    if (r.finished != finish_reason::error && r.finished != finish_reason::cancelled) store(r, body);
    else if (!turn_.on_stored) turn_.state->responses->release(turn_.session_id);
    if (!ctx_.stream) { sink.send_frame({}, std::move(body), std::chrono::steady_clock::now()); return; }
    const char* name = status_ == "completed" ? "response.completed"
                       : status_ == "incomplete" ? "response.incomplete"
                       : status_ == "cancelled" ? "response.cancelled" : "response.failed";
    event(sink, name, [&](json_writer& w) { w.key("response").raw(body); });
  }

 private:
  template <class F>
  void event(frame_sink& sink, const char* type, F&& fields) {
    json_writer w;
    w.obj().kv("type", type).kv("sequence_number", seq_++);
    fields(w);
    sink.send_frame(type, w.end_obj().take(), std::chrono::steady_clock::now());
  }

  void delta(frame_sink& sink, const char* type, const std::string& text) {
    auto& item = items_.back();
    item.text += text;
    if (!ctx_.stream) return;
    event(sink, type, [&](json_writer& w) {
      w.kv("item_id", item.id).kv("output_index", int64_t(items_.size() - 1));
      if (item.type != output_item::kind::function_call) w.kv("content_index", 0);
      w.kv("delta", text);
    });
  }

  void open(output_item::kind k, frame_sink& sink, const std::string& name, const std::string& call_id) {
    if (!items_.empty() && !items_.back().done && items_.back().type == k &&
        k != output_item::kind::function_call)
      return;
    if (!items_.empty() && !items_.back().done) close_current(sink);
    const char* prefix = k == output_item::kind::reasoning ? "rs_"
                         : k == output_item::kind::message ? "msg_" : "fc_";
    items_.push_back({k, turn_.state->new_id(prefix), {}, call_id, name});
    if (!ctx_.stream) return;
    int64_t index = int64_t(items_.size() - 1);
    event(sink, "response.output_item.added", [&](json_writer& w) {
      w.kv("output_index", index).key("item");
      item_json(w, items_.back());
    });
    if (k == output_item::kind::message)
      event(sink, "response.content_part.added", [&](json_writer& w) {
        w.kv("item_id", items_.back().id).kv("output_index", index).kv("content_index", 0)
            .key("part").obj().kv("type", "output_text").kv("text", "").key("annotations").arr()
            .end_arr().end_obj();
      });
  }

  void close_current(frame_sink& sink) {
    if (items_.empty() || items_.back().done) return;
    auto& item = items_.back();
    item.done = true;
    if (std::string_view(item.status) == "in_progress") item.status = "completed";
    if (!ctx_.stream) return;
    int64_t index = int64_t(items_.size() - 1);
    auto ids = [&](json_writer& w) { w.kv("item_id", item.id).kv("output_index", index); };
    switch (item.type) {
      case output_item::kind::reasoning:
        event(sink, "response.reasoning_text.done", [&](json_writer& w) {
          ids(w); w.kv("content_index", 0).kv("text", item.text);
        });
        break;
      case output_item::kind::message:
        event(sink, "response.output_text.done", [&](json_writer& w) {
          ids(w); w.kv("content_index", 0).kv("text", item.text);
        });
        event(sink, "response.content_part.done", [&](json_writer& w) {
          ids(w); w.kv("content_index", 0).key("part");
          text_part(w, item.text);
        });
        break;
      case output_item::kind::function_call:
        event(sink, "response.function_call_arguments.done", [&](json_writer& w) {
          ids(w); w.kv("name", item.name).kv("arguments", item.text);
        });
        break;
    }
    event(sink, "response.output_item.done", [&](json_writer& w) {
      w.kv("output_index", index).key("item");
      item_json(w, item);
    });
  }

  static void text_part(json_writer& w, const std::string& text) {
    w.obj().kv("type", "output_text").kv("text", text).key("annotations").arr().end_arr().end_obj();
  }

  static void item_json(json_writer& w, const output_item& item) {
    const bool complete = item.done;
    const char* status = item.status;
    w.obj().kv("id", item.id);
    switch (item.type) {
      case output_item::kind::reasoning:
        w.kv("type", "reasoning").key("summary").arr().end_arr().key("content").arr();
        if (complete) w.obj().kv("type", "reasoning_text").kv("text", item.text).end_obj();
        w.end_arr();
        break;
      case output_item::kind::message:
        w.kv("type", "message").kv("status", status).kv("role", "assistant").key("content").arr();
        if (complete) text_part(w, item.text);
        w.end_arr();
        break;
      case output_item::kind::function_call:
        w.kv("type", "function_call").kv("status", status).kv("call_id", item.call_id)
            .kv("name", item.name).kv("arguments", complete ? item.text : "");
        break;
    }
    w.end_obj();
  }

  /// The response object; `r` null while in progress.
  void response(json_writer& w, const turn_result* r) {
    w.obj().kv("id", ctx_.id).kv("object", "response").kv("created_at", ctx_.created)
        .kv("status", r ? status_ : "in_progress").kv("model", ctx_.model);
    w.key("error");
    if (r && r->finished == finish_reason::error)
      w.obj().kv("code", "server_error").kv("message", r->error).end_obj();
    else
      w.null();
    w.key("incomplete_details");
    if (r && r->finished == finish_reason::length) w.obj().kv("reason", "max_output_tokens").end_obj();
    else w.null();
    w.key("instructions");
    if (turn_.instructions.empty()) w.null(); else w.str(turn_.instructions);
    w.key("previous_response_id");
    if (turn_.previous_response_id.empty()) w.null(); else w.str(turn_.previous_response_id);
    w.key("max_output_tokens");
    if (turn_.max_output_tokens) w.num(int64_t{turn_.max_output_tokens}); else w.null();
    w.kv("temperature", double(turn_.sampling.temperature)).kv("top_p", double(turn_.sampling.top_p))
        .kv("parallel_tool_calls", turn_.parallel_tool_calls).key("tool_choice");
    const auto& choice = turn_.tool_choice;
    if (choice.names_function()) w.obj().kv("type", "function").kv("name", choice.function).end_obj();
    else w.str(choice.mode);
    w.kv("store", turn_.store).kv("truncation", turn_.truncation_auto ? "auto" : "disabled");
    w.key("tools").arr();
    // as given: a Responses tool's function_json is {"name":..., "description":..., "parameters":...}
    for (auto& t : turn_.tools) w.raw("{\"type\":\"function\"," + t.function_json.substr(1));
    w.end_arr();
    w.key("reasoning").obj();
    w.kv("effort", effort_name(turn_.reasoning));
    w.key("summary").null().end_obj();
    w.key("text").obj().key("format");
    if (turn_.format_json.empty()) w.obj().kv("type", "text").end_obj();
    else w.raw(turn_.format_json);
    w.end_obj();
    w.key("metadata").raw(turn_.metadata_json);
    w.key("output").arr();
    if (r) for (auto& item : items_) item_json(w, item);
    w.end_arr();
    w.key("usage");
    if (r) {
      w.obj().kv("input_tokens", r->num_prompt_tokens)
          .key("input_tokens_details").obj().kv("cached_tokens", r->num_cached_tokens).end_obj()
          .kv("output_tokens", r->num_completion_tokens)
          .key("output_tokens_details").obj().kv("reasoning_tokens", r->num_reasoning_tokens).end_obj()
          .kv("total_tokens", r->num_prompt_tokens + r->num_completion_tokens).end_obj();
    } else {
      w.null();
    }
    w.end_obj();
  }

  void store(const turn_result& r, const std::string& body) {
    auto s = std::make_shared<stored_response>();
    s->id = ctx_.id;
    s->conversation = std::move(turn_.conversation);
    chat_message reply{"assistant", r.content, r.reasoning, r.tool_calls, {}};
    s->conversation.push_back(std::move(reply));
    s->instructions = turn_.instructions;
    s->session_id = turn_.session_id;
    s->context = ctx_.codec->with_reply(turn_.context, s->conversation.back(), generated_);
    s->json = body;
    s->bytes = sizeof(stored_response) + s->id.size() + s->instructions.size() + s->json.size() +
               (s->context ? prompt_codec::context_bytes(*s->context) : 0);
    for (auto& m : s->conversation) {
      s->bytes += sizeof(chat_message) + m.content.size() + m.reasoning_content.size();
      for (auto& c : m.tool_calls) s->bytes += sizeof(c) + c.id.size() + c.name.size() + c.arguments.size();
    }
    std::shared_ptr<const stored_response> frozen = std::move(s);
    if (turn_.store) turn_.state->responses->put(frozen);
    else if (!turn_.on_stored) turn_.state->responses->release(turn_.session_id);
    if (turn_.on_stored) turn_.on_stored(frozen);
  }

  writer_context ctx_;
  responses_turn turn_;
  std::vector<output_item> items_;
  bool ended_ = false;
  std::vector<int32_t> generated_;  ///< the reply's ids as the model emitted them
  std::string status_ = "in_progress";
  int64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<response_writer> make_responses_writer(writer_context ctx, responses_turn turn) {
  return std::make_unique<responses_writer>(std::move(ctx), std::move(turn));
}

}  // namespace cedar::net
