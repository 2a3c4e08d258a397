// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (DeepSeek's family).
// Owned by whoever loads it (one per server, shared read-only by every session); encode and
// decode are safe to call from many threads at once (the piece cache takes a lock).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cedar::net {

/// A byte range [offset, offset + size) of a text.
struct text_range {
  size_t offset = 0;
  size_t size = 0;
};

/// One entry of the added-token table: matched in text before pre-tokenization.
struct added_token {
  std::string content;  ///< UTF-8 text, e.g. "<｜User｜>"
  int32_t id = 0;
  bool special = true;  ///< dropped by decode(skip_special=true)
};

class tokenizer {
 public:
  /// Loads tokenizer.json as it is (its own added tokens). Returns nullptr and sets *error
  /// (when non-null) on a missing file, bad JSON, or a model/pre-tokenizer it does not support.
  static std::unique_ptr<tokenizer> load(const std::string& path, std::string* error);

  /// Loads the BPE of `path` for serving DeepSeek-V4.1: if the file lacks V4.1's added tokens
  /// (the V3 file does), its table is replaced by V4.1's (net/dsv41_tokens.hpp). Then checks
  /// that every token the chat encoding writes has the id the model expects.
  static std::unique_ptr<tokenizer> load_dsv41(const std::string& path, std::string* error);

  /// Default tokenizer.json: $CEDAR_TOKENIZER, else the npm copy under the source tree.
  static std::string default_path();

  /// The tokenizer.json to serve `model` with: the checkpoint's own file when `model` is a
  /// directory holding tokenizer.json, else default_path().
  static std::string path_for_model(const std::string& model);

  ~tokenizer();
  tokenizer(const tokenizer&) = delete;
  tokenizer& operator=(const tokenizer&) = delete;

  /// Encodes UTF-8 text. Added tokens in the text are matched first (leftmost, longest) unless
  /// match_added is false. Invalid UTF-8 is an error (returns nullopt, *error says where).
  std::optional<std::vector<int32_t>> try_encode(std::string_view text, bool add_bos,
                                                 std::string* error, bool match_added = true) const;

  /// As try_encode; invalid UTF-8 bytes are first replaced by U+FFFD (a defined result).
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool match_added = true) const;

  /// Encodes a rendered prompt whose byte ranges `literal` (sorted, not overlapping) hold message
  /// text: added tokens are matched only outside them, so a user's "<｜User｜>" stays text.
  /// Elsewhere the same as try_encode (which it equals when no added token falls in a range).
  std::optional<std::vector<int32_t>> try_encode_with_literals(std::string_view text,
                                                               const std::vector<text_range>& literal,
                                                               bool add_bos, std::string* error) const;

  /// Ids to UTF-8 bytes. Added tokens are written as their text (kept unless skip_special).
  /// Ids outside the vocabulary are skipped. The result may end inside a UTF-8 character when
  /// the ids do: use incremental_decoder for streams.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  /// The bytes of one id (empty for unknown ids).
  std::string_view token_bytes(int32_t id) const;
  /// Id of an exact vocabulary or added-token string (byte-level form for BPE tokens).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// True for an added token marked special (what decode(skip_special=true) drops).
  bool is_special(int32_t id) const;
  /// Id of an added token by its text.
  std::optional<int32_t> added_token_id(std::string_view content) const;

  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  /// One past the largest id (129280 for V4.1).
  int32_t vocab_size() const;
  const std::vector<added_token>& added_tokens() const;

  /// Replaces the added-token table (ids may overlap the BPE's; an added token wins on decode).
  void set_added_tokens(std::vector<added_token> table);

  struct impl;

 private:
  explicit tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
  int32_t bos_id_ = 0;
  int32_t eos_id_ = 1;
};

/// Turns a stream of ids into text chunks that are always whole UTF-8 characters: bytes of a
/// character split across ids are held until it completes; nothing is ever dropped. One per
/// stream (not thread-safe); the tokenizer must outlive it.
class incremental_decoder {
 public:
  explicit incremental_decoder(const tokenizer& tok, bool skip_special = false)
      : tok_(tok), skip_special_(skip_special) {}

  /// Adds ids; returns the text that is now complete (possibly empty).
  std::string push(const std::vector<int32_t>& ids);
  std::string push(int32_t id) { return push(std::vector<int32_t>{id}); }
  /// Ends the stream: returns held bytes; an incomplete character becomes U+FFFD.
  std::string finish();
  /// Bytes held back waiting for the rest of a character (0-3).
  size_t num_pending_bytes() const { return pending_.size(); }

 private:
  const tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace cedar::net
