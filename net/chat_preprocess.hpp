// Preprocessing of the V4.1 chat encoding, before rendering: content lists and images, tool
// messages merged into user turns, tool results put in call order. Internal to net/chat_*.cpp.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "net/chat_format.hpp"

namespace cedar::net::chat {

/// Every string of a message is valid UTF-8 (so byte ranges survive tokenization unchanged).
bool valid_text(const message& m);
/// A content list becomes blocks with images as the image token; content = its text blocks
/// joined by a blank line. Rejects the image token typed inside text.
bool process_images(message* m, std::string* error);
/// Tool messages become user turns of tool_result blocks; consecutive user turns merge.
std::vector<message> merge_tool_messages(std::vector<message> msgs);
/// Orders each user turn's tool results as the calls of the latest assistant turn with calls
/// (*order: call id -> position, carried from one append to the next).
void sort_tool_results(std::vector<message>* msgs, std::map<std::string, size_t>* order);

}  // namespace cedar::net::chat
