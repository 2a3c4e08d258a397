// Engram's compressed token map (spec §2.8): token ids that read the same once case, accents and
// whitespace are folded share one compressed id, so their n-grams hash to the same table rows.
// Built from the tokenizer exactly as the checkpoint's reference builds it:
//   text = decode([id]) (byte-level, invalid UTF-8 -> U+FFFD; added tokens as their text);
//   key  = the raw token string when text holds U+FFFD, else normalize(text), else text when
//          that is empty; ids get new ids in order of their key's first appearance.
// normalize = NFKC, NFD, drop marks (General_Category M), lowercase each character, runs of
// [ \t\r\n] -> " ", then strip Unicode whitespace at both ends unless the result is " ".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_args.hpp"

namespace cedar::net {

class tokenizer;

/// normalize() above, on valid UTF-8.
std::string engram_normalize(std::string_view text);

struct engram_token_map {
  std::shared_ptr<const std::vector<int32_t>> map;  ///< [tokenizer vocab size] token id -> compressed id
  int32_t classes = 0;                              ///< number of compressed ids
};

/// The map of every id below tok.vocab_size().
engram_token_map build_engram_token_map(const tokenizer& tok);

/// Sets args.engram_token_map, when the model has Engram layers, from `tok`, the tokenizer that
/// serves it. False with *error when the tokenizer does not cover the model's vocabulary, or
/// its map's class count differs from engram_compressed_vocab_size (the hash would then read
/// rows other than the ones the checkpoint was trained with).
bool attach_engram_token_map(model_args& args, const tokenizer& tok, std::string* error);

}  // namespace cedar::net
