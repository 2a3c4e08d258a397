// DeepSeek-V4.1 added-token table (net/dsv41_tokens.hpp).
#include "net/dsv41_tokens.hpp"

#include <map>

namespace cedar::net::dsv41 {

namespace {

// The named ids; every other id in [128000, 129279] is a reserved place holder.
const std::map<int32_t, const char*>& named_ids() {
  static const std::map<int32_t, const char*> table = {
      {system_id, system},
      {128800, "<｜fim▁hole｜>"},
      {128801, "<｜fim▁begin｜>"},
      {128802, "<｜fim▁end｜>"},
      {user_id, user},
      {assistant_id, assistant},
      {128805, "<|EOT|>"},
      {128806, "<｜tool▁calls▁begin｜>"},
      {128807, "<｜tool▁calls▁end｜>"},
      {128808, "<｜tool▁call▁begin｜>"},
      {128809, "<｜tool▁call▁end｜>"},
      {128810, "<｜tool▁outputs▁begin｜>"},
      {128811, "<｜tool▁outputs▁end｜>"},
      {128812, "<｜tool▁output▁begin｜>"},
      {128813, "<｜tool▁output▁end｜>"},
      {128814, "<｜tool▁sep｜>"},
      {think_begin_id, think_begin},
      {think_end_id, think_end},
      {dsml_id, dsml},
      {latest_reminder_id, latest_reminder},
      {128829, "<｜action｜>"},
      {128830, "<｜query｜>"},
      {128831, "<｜authority｜>"},
      {128832, "<｜domain｜>"},
      {128836, "<｜title｜>"},
      {128845, "<｜read_url｜>"},
      {image_id, image},
  };
  return table;
}

}  // namespace

std::vector<added_token> added_token_table() {
  std::vector<added_token> out = {{bos, bos_id, true}, {eos, eos_id, true}, {pad, 2, true}};
  const auto& named = named_ids();
  for (int32_t id = first_added_id; id <= last_added_id; ++id) {
    auto it = named.find(id);
    std::string content = it != named.end()
                              ? std::string(it->second)
                              : "<｜place▁holder▁no▁" + std::to_string(id - first_added_id) + "｜>";
    out.push_back(added_token{std::move(content), id, true});
  }
  return out;
}

bool check_token_ids(const tokenizer& tok, std::string* error) {
  const std::pair<const char*, int32_t> needed[] = {
      {bos, bos_id},       {eos, eos_id},           {system, system_id},
      {user, user_id},     {assistant, assistant_id}, {think_begin, think_begin_id},
      {think_end, think_end_id}, {dsml, dsml_id},   {latest_reminder, latest_reminder_id},
      {image, image_id},   {"<｜action｜>", 128829}, {"<｜query｜>", 128830},
      {"<｜authority｜>", 128831}, {"<｜domain｜>", 128832}, {"<｜title｜>", 128836},
      {"<｜read_url｜>", 128845},
  };
  for (auto [content, id] : needed) {
    auto got = tok.added_token_id(content);
    if (!got || *got != id) {
      if (error)
        *error = std::string(content) + " should be id " + std::to_string(id) + ", found " +
                 (got ? std::to_string(*got) : std::string("none"));
      return false;
    }
  }
  return true;
}

}  // namespace cedar::net::dsv41
