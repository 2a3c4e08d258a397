// conversation: trace request -> messages. Token counts are estimates (one filler word ~ one token);
// chat templates add a few tokens per message, which a replay of this kind accepts.
#include "tools/bench/conversation.hpp"

#include <algorithm>

#include "tools/bench/filler.hpp"

namespace cedar::bench {

conversation::conversation(std::string marker, uint64_t scope, int64_t system_tokens)
    : marker_(std::move(marker)), scope_(scope), system_tokens_(system_tokens) {}

std::string conversation::blocks_text(const std::vector<int64_t>& ids, size_t begin,
                                      size_t end) const {
  std::string text;
  for (size_t i = begin; i < end && i < ids.size(); ++i) append_block(text, scope_, ids[i]);
  return text;
}

void conversation::rebuild(const trace_request& req) {
  messages_.clear();
  const auto& ids = req.hash_ids;
  size_t num_system_blocks = std::min(ids.size(), size_t(system_tokens_ / kWordsPerBlock));
  size_t user_begin = 0;
  if (num_system_blocks > 0) {
    std::string text = marker_ + blocks_text(ids, 0, num_system_blocks);
    messages_.push_back({"system", std::move(text), int64_t(num_system_blocks) * kWordsPerBlock});
    user_begin = num_system_blocks;
  }
  std::string text = user_begin == 0 ? marker_ : std::string();
  text += blocks_text(ids, user_begin, ids.size());
  int64_t num_tail = std::max<int64_t>(
      1, req.num_input_tokens - int64_t(ids.size()) * kWordsPerBlock);
  append_words(text, scope_ ^ hash_string(marker_) ^ num_turns_, num_tail);
  messages_.push_back({"user", std::move(text),
                       int64_t(ids.size() - user_begin) * kWordsPerBlock + num_tail});
  num_tokens_ = 0;
  for (auto& m : messages_) num_tokens_ += m.num_tokens;
}

turn_input conversation::next_turn(const trace_request& req) {
  turn_input in;
  size_t num_common = 0;
  while (num_common < prev_ids_.size() && num_common < req.hash_ids.size() &&
         prev_ids_[num_common] == req.hash_ids[num_common])
    ++num_common;
  bool pulled_back = num_common * 10 < prev_ids_.size() * 9;
  if (messages_.empty() || pulled_back) {
    rebuild(req);
    in.rewritten = true;
  } else {
    in.first_new_idx = messages_.size();
    // The new blocks are those past what the history (the last reply included) already covers.
    int64_t num_new = std::max<int64_t>(8, req.num_input_tokens - num_tokens_);
    size_t first_block = std::min(num_common, size_t(num_tokens_ / kWordsPerBlock));
    std::string text = blocks_text(req.hash_ids, first_block, req.hash_ids.size());
    int64_t num_words = count_words(text);
    if (num_words > num_new) {
      // Each filler word is preceded by one space: cut at the space that starts word num_new.
      size_t cut = 0;
      for (int64_t w = 0; w < num_new; ++w) cut = text.find(' ', cut + 1);
      text.resize(cut);
    } else {
      append_words(text, scope_ ^ hash_string(marker_) ^ num_turns_, num_new - num_words);
    }
    messages_.push_back({"user", std::move(text), num_new});
    num_tokens_ += num_new;
  }
  prev_ids_ = req.hash_ids;
  ++num_turns_;
  return in;
}

void conversation::add_reply(std::string text, int64_t num_tokens) {
  num_tokens_ += num_tokens;
  messages_.push_back({"assistant", std::move(text), num_tokens});
}

void conversation::fast_forward(const std::vector<trace_request>& reqs, size_t count) {
  for (size_t i = 0; i < count && i < reqs.size(); ++i) {
    next_turn(reqs[i]);
    std::string reply;
    append_words(reply, hash_string(marker_) + i, reqs[i].num_output_tokens);
    add_reply(std::move(reply), reqs[i].num_output_tokens);
  }
}

}  // namespace cedar::bench

