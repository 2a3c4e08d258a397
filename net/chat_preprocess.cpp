// Preprocessing of the V4.1 chat encoding (net/chat_preprocess.hpp), as the reference encoder
// does it before rendering.
#include "net/chat_preprocess.hpp"

#include <algorithm>

#include "net/dsv41_tokens.hpp"
#include "net/utf8.hpp"

namespace cedar::net::chat {

namespace {

bool fail(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
  return false;
}

bool valid_utf8(std::string_view s) { return valid_utf8_prefix(s) == s.size(); }

bool valid_blocks(const std::vector<content_block>& blocks) {
  for (const auto& b : blocks)
    if (!valid_utf8(b.text) || !valid_utf8(b.type) || !valid_blocks(b.parts)) return false;
  return true;
}

}  // namespace

bool valid_text(const message& m) {
  if (!valid_utf8(m.content) || !valid_utf8(m.reasoning_content.value_or("")) || !valid_blocks(m.blocks)) return false;
  for (const auto& tc : m.tool_calls)
    if (!valid_utf8(tc.name) || !valid_utf8(tc.name_space) || (tc.arguments.is_string() && !valid_utf8(tc.arguments.text)))
      return false;
  return true;
}

bool process_images(message* m, std::string* error) {
  if (m->content.find(dsv41::image) != std::string::npos && !m->content_is_list)
    return fail(error, "message content contains the image token " + std::string(dsv41::image) +
                           "; images must be content blocks");
  if (m->reasoning_content && m->reasoning_content->find(dsv41::image) != std::string::npos)
    return fail(error, "reasoning_content contains the image token " + std::string(dsv41::image));
  if (!m->content_is_list) return true;
  auto fix = [&](std::vector<content_block>& blocks, auto& self) -> bool {
    for (auto& b : blocks) {
      if (b.type == "image" || b.type == "image_url") {
        if (!b.has_image_source) return fail(error, "image block does not contain a valid source");
        b = content_block{"text", dsv41::image, {}, {}, false, false, true};
      } else if (b.type == "tool_result" && b.parts_is_list) {
        if (!self(b.parts, self)) return false;
      } else if (b.type == "text" && b.text.find(dsv41::image) != std::string::npos) {
        return fail(error, "text block contains the image token " + std::string(dsv41::image) +
                               "; images must be content blocks");
      }
    }
    return true;
  };
  if (!fix(m->blocks, fix)) return false;
  std::string joined;
  bool first = true;
  for (auto& b : m->blocks)
    if (b.type == "text") {
      if (!first) joined += "\n\n";
      joined += b.text;
      first = false;
    }
  m->content = std::move(joined);
  return true;
}

std::vector<message> merge_tool_messages(std::vector<message> msgs) {
  std::vector<message> merged;
  for (auto& m : msgs) {
    if (m.role == "tool") {
      content_block block{"tool_result", m.content, m.tool_call_id, {}, false, false};
      if (!merged.empty() && merged.back().role == "user") {
        merged.back().blocks.push_back(std::move(block));
      } else {
        message u;
        u.role = "user";
        u.content_is_list = true;
        u.blocks.push_back(std::move(block));
        merged.push_back(std::move(u));
      }
    } else if (m.role == "user") {
      if (!m.content_is_list) {
        m.blocks = {content_block{"text", m.content, {}, {}, false, false}};
        m.content_is_list = true;
      }
      if (!merged.empty() && merged.back().role == "user" && merged.back().task.empty()) {
        auto& dst = merged.back().blocks;
        dst.insert(dst.end(), m.blocks.begin(), m.blocks.end());
      } else {
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

void sort_tool_results(std::vector<message>* msgs, std::map<std::string, size_t>* order) {
  for (auto& m : *msgs) {
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      order->clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i)
        if (!m.tool_calls[i].id.empty()) (*order)[m.tool_calls[i].id] = i;
      continue;
    }
    if (m.role != "user" || order->empty()) continue;
    std::vector<content_block> results;
    for (auto& b : m.blocks)
      if (b.type == "tool_result") results.push_back(b);
    if (results.size() < 2) continue;
    auto key = [&](const content_block& b) {
      auto it = order->find(b.tool_use_id);
      return it == order->end() ? size_t{0} : it->second;
    };
    std::stable_sort(results.begin(), results.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
    size_t k = 0;
    for (auto& b : m.blocks)
      if (b.type == "tool_result") b = results[k++];
  }
}

}  // namespace cedar::net::chat
