// The output streams of prompt_codec: plain text for completions, and the chat splitter that
// routes decoded text to reasoning, content or a DSML tool block (spec §3). Partial markers at
// the end of a chunk are held back until they resolve.
#include <string_view>

#include "net/dsv41_tokens.hpp"
#include "net/json_writer.hpp"
#include "net/prompt_codec.hpp"
#include "net/tokenizer.hpp"

namespace cedar::net {

namespace {

using kind = output_delta::kind;

class text_stream final : public output_stream {
 public:
  explicit text_stream(const tokenizer& tok) : dec_(tok, true) {}
  void push(const std::vector<int32_t>& ids, std::vector<output_delta>& out) override {
    emit(dec_.push(ids), out);
  }
  void finish(std::vector<output_delta>& out) override { emit(dec_.finish(), out); }

 private:
  static void emit(std::string text, std::vector<output_delta>& out) {
    if (!text.empty()) out.push_back({kind::content, std::move(text), -1, {}});
  }
  incremental_decoder dec_;
};

/// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

class chat_stream final : public output_stream {
 public:
  chat_stream(const tokenizer& tok, bool thinking)
      : dec_(tok, false), state_(thinking ? state::reasoning : state::content) {}

  void push(const std::vector<int32_t>& ids, std::vector<output_delta>& out) override {
    pending_ += dec_.push(ids);
    drain(out, false);
  }
  void finish(std::vector<output_delta>& out) override {
    pending_ += dec_.finish();
    drain(out, true);
    if (state_ == state::tool) parse_invokes(out, true);
  }

 private:
  enum class state { reasoning, content, tool };
  static constexpr std::string_view think_end = "</think>";
  static constexpr std::string_view tool_open = "<｜DSML｜ calls>";
  static constexpr std::string_view eos = "<｜end▁of▁sentence｜>";

  void drain(std::vector<output_delta>& out, bool final) {
    for (;;) {
      if (state_ == state::tool) {
        tool_text_ += pending_;
        pending_.clear();
        parse_invokes(out, false);
        return;
      }
      size_t cut = std::string_view::npos, skip = 0;
      state next = state_;
      auto consider = [&](std::string_view marker, state to) {
        size_t at = pending_.find(marker);
        if (at != std::string::npos && at < cut) { cut = at; skip = marker.size(); next = to; }
      };
      if (state_ == state::reasoning) consider(think_end, state::content);
      else consider(think_end, state::content);  // a stray </think> in content is absorbed
      consider(tool_open, state::tool);
      consider(eos, state_);
      if (cut == std::string_view::npos) {
        size_t hold = final ? 0 : std::max({partial_suffix(pending_, think_end),
                                            partial_suffix(pending_, tool_open),
                                            partial_suffix(pending_, eos), trailing_newlines()});
        emit(pending_.substr(0, pending_.size() - hold), out);
        pending_.erase(0, pending_.size() - hold);
        return;
      }
      std::string before = pending_.substr(0, cut);
      if (next == state::tool)  // the blank line before a tool block is not content
        while (!before.empty() && before.back() == '\n') before.pop_back();
      emit(before, out);
      pending_.erase(0, cut + skip);
      state_ = next;
    }
  }

  /// Newlines at the end may precede a tool block, so they wait for the next chunk.
  size_t trailing_newlines() const {
    size_t n = 0;
    while (n < pending_.size() && pending_[pending_.size() - 1 - n] == '\n') ++n;
    return n;
  }

  void emit(const std::string& text, std::vector<output_delta>& out) {
    if (text.empty()) return;
    kind k = state_ == state::reasoning ? kind::reasoning : kind::content;
    out.push_back({k, text, -1, {}});
  }

  /// Emits each complete invoke of the tool block as a begin + arguments pair.
  void parse_invokes(std::vector<output_delta>& out, bool final) {
    static constexpr std::string_view open = "invoke name=\"", close = "</｜DSML｜ invoke>";
    for (;;) {
      size_t start = tool_text_.find(open);
      if (start == std::string::npos) return;
      size_t end = tool_text_.find(close, start);
      if (end == std::string::npos && !final) return;
      std::string_view body(tool_text_);
      body = body.substr(start + open.size(),
                         (end == std::string::npos ? tool_text_.size() : end) - start - open.size());
      size_t q = body.find('"');
      std::string name(body.substr(0, q));
      int idx = num_calls_++;
      out.push_back({kind::tool_call_begin, {}, idx, name});
      out.push_back({kind::tool_call_args, arguments_json(body.substr(q == body.npos ? 0 : q)), idx, {}});
      tool_text_.erase(0, end == std::string::npos ? tool_text_.size() : end + close.size());
    }
  }

  /// `parameter name="K" string="true|false">V</｜DSML｜ parameter>` entries -> a JSON object.
  static std::string arguments_json(std::string_view body) {
    static constexpr std::string_view p_open = "parameter name=\"", p_close = "</｜DSML｜ parameter>";
    std::string json = "{";
    for (size_t at = body.find(p_open); at != body.npos; at = body.find(p_open, at)) {
      at += p_open.size();
      size_t q = body.find('"', at);
      size_t gt = body.find('>', q == body.npos ? at : q);
      size_t end = body.find(p_close, gt == body.npos ? at : gt);
      if (q == body.npos || gt == body.npos || end == body.npos) break;
      std::string_view key = body.substr(at, q - at), value = body.substr(gt + 1, end - gt - 1);
      bool is_string = body.substr(q, gt - q).find("string=\"true\"") != body.npos;
      if (json.size() > 1) json += ", ";
      append_json_string(json, key);
      json += ": ";
      if (is_string) append_json_string(json, value); else json += value;
      at = end + p_close.size();
    }
    return json + "}";
  }

  incremental_decoder dec_;
  state state_;
  std::string pending_;
  std::string tool_text_;
  int num_calls_ = 0;
};

}  // namespace

std::unique_ptr<output_stream> prompt_codec::chat_output(bool thinking) const {
  return std::make_unique<chat_stream>(*tok_, thinking);
}

std::unique_ptr<output_stream> prompt_codec::text_output() const {
  return std::make_unique<text_stream>(*tok_);
}

}  // namespace cedar::net
