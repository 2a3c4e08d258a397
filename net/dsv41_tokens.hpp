// DeepSeek-V4.1's added-token table and the token strings its chat encoding writes.
// Built in code from the model's published id listing (docs: spec/dsv41-chat-format.md §1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "net/tokenizer.hpp"

namespace cedar::net::dsv41 {

inline constexpr const char* bos = "<｜begin▁of▁sentence｜>";
inline constexpr const char* eos = "<｜end▁of▁sentence｜>";
inline constexpr const char* pad = "<｜▁pad▁｜>";
inline constexpr const char* system = "<｜System｜>";
inline constexpr const char* user = "<｜User｜>";
inline constexpr const char* assistant = "<｜Assistant｜>";
inline constexpr const char* latest_reminder = "<｜latest_reminder｜>";
inline constexpr const char* think_begin = "<think>";
inline constexpr const char* think_end = "</think>";
inline constexpr const char* dsml = "｜DSML｜";
inline constexpr const char* image = "<｜deepseek_image｜>";
/// An assistant turn's tool calls: the block opens after its content, each invoke names its
/// function ("...name=\"" NAME "\">\n" then the parameters).
inline constexpr const char* calls_open = "\n\n<｜DSML｜ calls>\n";
inline constexpr const char* invoke_open = "<｜DSML｜ invoke name=\"";
inline constexpr const char* invoke_name_end = "\">\n";

inline constexpr int32_t bos_id = 0;
inline constexpr int32_t eos_id = 1;
inline constexpr int32_t system_id = 128799;
inline constexpr int32_t user_id = 128803;
inline constexpr int32_t assistant_id = 128804;
inline constexpr int32_t think_begin_id = 128821;
inline constexpr int32_t think_end_id = 128822;
inline constexpr int32_t dsml_id = 128825;
inline constexpr int32_t latest_reminder_id = 128828;
inline constexpr int32_t image_id = 129264;
inline constexpr int32_t first_added_id = 128000;
inline constexpr int32_t last_added_id = 129279;

/// The 1,283 added tokens of V4.1: ids 0-2, and 128000-129279 (named ones from the listing,
/// every other id a reserved "<｜place▁holder▁no▁N｜>" with N = id - 128000).
std::vector<added_token> added_token_table();

/// Checks that every token the chat encoding and the output parser use has V4.1's id.
bool check_token_ids(const tokenizer& tok, std::string* error);

}  // namespace cedar::net::dsv41
