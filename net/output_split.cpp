// The output streams of prompt_codec: plain text for completions, and chat output split into
// reasoning, content and tool calls by net/output_parser.hpp, as stream_deltas.
#include "net/dsv41_tokens.hpp"
#include "net/output_parser.hpp"
#include "net/prompt_codec.hpp"
#include "net/tokenizer.hpp"

namespace cedar::net {

namespace {

using kind = stream_delta::kind;

/// The raw text: every token spelled out (</think> and the tool-call markers are part of what a
/// completions client parses) but the sequence's own begin and end tokens.
class text_stream final : public output_stream {
 public:
  explicit text_stream(const tokenizer& tok) : dec_(tok, false) {}
  void push(const std::vector<int32_t>& ids, std::vector<stream_delta>& out) override {
    std::vector<int32_t> kept;
    kept.reserve(ids.size());
    for (int32_t id : ids)
      if (id != dsv41::bos_id && id != dsv41::eos_id) kept.push_back(id);
    emit(dec_.push(kept), out);
  }
  void finish(std::vector<stream_delta>& out) override { emit(dec_.finish(), out); }

 private:
  static void emit(std::string text, std::vector<stream_delta>& out) {
    if (!text.empty()) out.push_back({kind::content, std::move(text), -1, {}});
  }
  incremental_decoder dec_;
};

class chat_stream final : public output_stream {
 public:
  chat_stream(const tokenizer& tok, bool thinking) : dec_(tok, false), parser_(thinking) {}

  void push(const std::vector<int32_t>& ids, std::vector<stream_delta>& out) override {
    convert(parser_.feed(dec_.push(ids)), out);
  }
  void finish(std::vector<stream_delta>& out) override {
    convert(parser_.feed(dec_.finish()), out);
    convert(parser_.finish(), out);
  }
  bool in_reasoning() const override { return parser_.in_reasoning(); }

 private:
  static void convert(output_delta d, std::vector<stream_delta>& out) {
    if (!d.reasoning.empty()) out.push_back({kind::reasoning, std::move(d.reasoning), -1, {}});
    if (!d.content.empty()) out.push_back({kind::content, std::move(d.content), -1, {}});
    for (auto& call : d.tool_calls) {
      int idx = int(call.index);
      out.push_back({kind::tool_call_begin, {}, idx, std::move(call.name)});
      out.push_back({kind::tool_call_args, std::move(call.arguments), idx, {}});
    }
  }

  incremental_decoder dec_;
  output_parser parser_;
};

}  // namespace

std::unique_ptr<output_stream> prompt_codec::chat_output(bool thinking) const {
  return std::make_unique<chat_stream>(*tok_, thinking);
}

std::unique_ptr<output_stream> prompt_codec::text_output() const {
  return std::make_unique<text_stream>(*tok_);
}

}  // namespace cedar::net
