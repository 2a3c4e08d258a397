// `cedar chat-render`: prints the DeepSeek-V4.1 prompt of a conversation file (JSON: an array
// of messages, or {"messages", "tools", "thinking", "reasoning_effort"}), optionally its ids.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "net/chat_format.hpp"
#include "net/tokenizer.hpp"
#include "tools/cli/registry.hpp"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: cedar chat-render --file conversation.json [--thinking on|off] [--effort N|low|high|max]\n"
               "                         [--keep-thinking] [--ids [--tokenizer PATH]]\n"
               "  prints the rendered prompt (thinking defaults to on, effort to high = 75, unless the file\n"
               "  says otherwise); --ids prints its token ids instead (the V4.1 table; special tokens only from\n"
               "  the template, never from message text)\n");
}

int chat_render_main(int argc, char** argv) {
  std::string file, thinking, effort, tok_path = cedar::net::tokenizer::default_path();
  bool ids = false, keep_thinking = false;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    bool has_value = i + 1 < argc;
    if (k == "--file" && has_value) file = argv[++i];
    else if (k == "--thinking" && has_value) thinking = argv[++i];
    else if (k == "--effort" && has_value) effort = argv[++i];
    else if (k == "--tokenizer" && has_value) tok_path = argv[++i];
    else if (k == "--ids") ids = true;
    else if (k == "--keep-thinking") keep_thinking = true;
    else { usage(); return 2; }
  }
  if (file.empty() || (!thinking.empty() && thinking != "on" && thinking != "off")) {
    usage();
    return 2;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cedar: cannot read '%s'\n", file.c_str());
    return 1;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  std::string error;
  auto req = cedar::net::chat::parse_request_json(buf.str(), &error);
  if (!req) {
    std::fprintf(stderr, "cedar: %s: %s\n", file.c_str(), error.c_str());
    return 1;
  }
  cedar::net::chat::render_options opts;
  opts.thinking = thinking.empty() ? req->thinking.value_or(true) : thinking == "on";
  opts.effort = req->effort.value_or(75);
  opts.drop_thinking = !keep_thinking;
  if (!effort.empty()) {
    auto e = cedar::net::chat::parse_effort(effort, &error);
    if (!e) {
      std::fprintf(stderr, "cedar: %s\n", error.c_str());
      return 2;
    }
    opts.effort = *e;
  }
  cedar::net::chat::conversation conv(opts);
  auto text = conv.append(std::move(req->messages), &error);
  if (!text) {
    std::fprintf(stderr, "cedar: %s: %s\n", file.c_str(), error.c_str());
    return 1;
  }
  if (ids) {
    auto tok = cedar::net::tokenizer::load_dsv41(tok_path, &error);
    if (!tok) {
      std::fprintf(stderr, "cedar: %s\n", error.c_str());
      return 1;
    }
    std::string line = "[";
    for (int32_t id : conv.encode_from(*tok)) line += (line.size() > 1 ? "," : "") + std::to_string(id);
    *text = line + "]\n";
  }
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace

CEDAR_COMMAND("chat-render", "print the DeepSeek-V4.1 prompt of a conversation", chat_render_main);
