// Structured output: a JSON grammar (net/response_format.cpp compiles it from a request's
// response_format), a byte-level matcher that follows a completion through it, and the set of
// vocabulary tokens that keep the completion inside it; and a forced lead, token sequences one
// of which a completion must open with (a forced tool call). Plain C++: the scheduler keeps one
// matcher per constrained request on its thread and builds each sampling step's token mask.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cedar {

/// One node of a JSON grammar; nodes name each other by index into output_grammar::nodes.
struct grammar_node {
  enum kind_t : uint8_t { any, object, array, string, number, integer, literal, any_of };
  uint8_t kind = any;
  /// object: property names (a JSON string's bytes, without quotes or escapes); literal: the
  /// JSON texts allowed, e.g. `true`, `null`, `"low"`, `3`
  std::vector<std::string> names;
  /// object: each name's value node; array: {item node}; any_of: the branches
  std::vector<int32_t> children;
  uint64_t required = 0;  ///< object: bit i set when names[i] must appear
  int32_t extra = -1;     ///< object: value node of keys not in names (-1: no other key)
  int32_t min_count = 0;  ///< array: items; string: characters
  int32_t max_count = -1; ///< the same, at most (-1: no bound)
};

/// A compiled response format. root < 0: no constraint.
struct output_grammar {
  std::vector<grammar_node> nodes;
  int32_t root = -1;
  /// The constraint starts after the completion's first occurrence of this token (the end of
  /// the reasoning, in thinking mode); -1: from the first completion token.
  int32_t start_after = -1;
  int32_t any_node = -1;  ///< any_value()'s node, once added (its helpers follow it)

  bool active() const { return root >= 0; }
  /// Appends a node and returns its index.
  int32_t add(grammar_node n);
  /// The node of any JSON value (objects and arrays of any values), added once; nodes of kind
  /// `any` are copies of it (its helpers follow any_node).
  int32_t any_value();
  /// Most properties an object node may name, literals a literal node may hold, frames deep a
  /// value may nest.
  static constexpr int max_names = 64, max_depth = 32;
  /// Whitespace characters allowed in a row between two JSON tokens, at the outermost level;
  /// two more each level deeper (a newline and the indentation of pretty-printed JSON).
  static constexpr int max_whitespace_run = 2;
};

/// A forced start of a completion (tool_choice "required" or a named function): from just after
/// the first `after` token of the completion (from its first token when -1), its tokens spell
/// one of `choices` in full; what follows is free.
struct forced_lead {
  std::vector<std::vector<int32_t>> choices;
  int32_t after = -1;
  bool active() const { return !choices.empty(); }
};

/// Whether a value of node `node` may begin with byte c (an any_of takes the first branch that
/// may: the compiler refuses branches that overlap).
bool value_may_start(const output_grammar& g, int32_t node, uint8_t c);

/// The bytes of a completion so far against a grammar: feed() takes one byte at a time and
/// refuses any byte after which no completion could match. A value (it holds no pointer into
/// the grammar, which each call names), so a request can move between schedulers with it.
class json_matcher {
 public:
  /// Takes byte c; false (and the matcher is then undefined: feed a copy) when c cannot follow.
  bool feed(const output_grammar& g, uint8_t c);
  /// The bytes so far are one whole value (only whitespace may follow): the end token may come.
  bool can_end(const output_grammar& g) const;
  /// Inside a string that is not a key: its constraint (characters left, -1 without bound).
  bool in_free_string(const output_grammar& g, int32_t& chars_left) const;
  /// Becomes a copy of `other`, copying only its live frames (the mask walk copies a matcher
  /// for every byte it tries).
  void assign(const json_matcher& other);

 private:
  struct frame {
    uint8_t kind = 0, phase = 0, esc = 0, flags = 0;
    int32_t node = -1;
    int32_t count = 0;  ///< array: items; string: characters (a key: bytes); literal: bytes; number: state
    int32_t next = -1;  ///< object: the value node after the current key
    uint64_t mask = 0;  ///< object: names seen; key: names still matching; literal: texts still matching
  };
  bool dispatch(const output_grammar& g, uint8_t c);
  bool start_value(const output_grammar& g, int32_t node, uint8_t c);
  bool push(frame f);
  bool feed_object(const output_grammar& g, frame& f, uint8_t c);
  bool feed_array(const output_grammar& g, frame& f, uint8_t c);
  bool feed_string(const output_grammar& g, frame& f, uint8_t c);
  bool feed_number(const output_grammar& g, frame& f, uint8_t c);
  bool feed_literal(const output_grammar& g, frame& f, uint8_t c);
  bool end_key(const output_grammar& g);
  bool take_whitespace();
  /// Pops the finished top frame (the root's: the value is done).
  void pop();

  std::array<frame, output_grammar::max_depth> stack_{};
  int depth_ = 0;
  int whitespace_run_ = 0;
  bool done_ = false;
};

/// The vocabulary as bytes, indexed for the mask builder: every ordinary token sorted by its
/// bytes (added tokens are never allowed inside a structured output), and the tokens that fit
/// inside a JSON string as they are. Built once a server (net/ fills it from its tokenizer).
class token_vocab {
 public:
  /// bytes[id]: the token's bytes; added[id]: an added (special or control) token; eos_id:
  /// the token that ends a completion.
  token_vocab(std::vector<std::string> bytes, const std::vector<bool>& added, int32_t eos_id);
  int32_t size() const { return int32_t(bytes_.size()); }
  int32_t eos_id() const { return eos_id_; }
  const std::string& bytes(int32_t id) const { return bytes_[std::size_t(id)]; }

  /// Bit id of the returned mask ([ceil(size / 64)] words) is set when token id may come next.
  std::vector<uint64_t> allowed(const output_grammar& g, const json_matcher& m) const;

 private:
  struct sorted_list {
    std::vector<int32_t> ids;   ///< by bytes, ascending
    std::vector<int32_t> lcp;   ///< lcp[k]: bytes shared with ids[k - 1] (0 for k = 0)
  };
  sorted_list sort(std::vector<int32_t> ids) const;
  void walk(const sorted_list& list, const output_grammar& g, const json_matcher& m,
            std::vector<uint64_t>& mask) const;

  std::vector<std::string> bytes_;
  int32_t eos_id_ = -1;
  sorted_list all_;           ///< every ordinary token
  sorted_list not_plain_;     ///< the ordinary tokens holding '"', '\' or a control byte
  std::vector<int32_t> plain_;        ///< the others: string characters as they are
  std::vector<int32_t> plain_chars_;  ///< characters in each plain token (UTF-8 lead bytes)
  std::size_t max_len_ = 0;
};

}  // namespace cedar
