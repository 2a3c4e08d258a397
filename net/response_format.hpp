// Structured output at the edge: a request's response format (chat and completions:
// `response_format`; Responses: `text.format`) compiled from JSON into the runtime's grammar
// (actors/output_grammar.hpp), which the scheduler then holds every sampled token to.
//
// Formats: {"type": "text"} (no constraint), {"type": "json_object"} (one JSON object) and
// {"type": "json_schema"} with a schema of this subset: type (one or a list), properties,
// required, additionalProperties (absent means false: only the named keys), items, minItems,
// maxItems, minLength, maxLength, enum, const, anyOf / oneOf (branches that start differently),
// $ref into $defs / definitions (recursion allowed), and the annotations (title, description,
// default, examples, $schema, $id, $comment). Any other keyword is refused with its path, so
// that nothing a schema asks for is silently left unchecked.
#pragma once

#include <simdjson.h>

#include <memory>
#include <optional>
#include <string_view>

#include "actors/output_grammar.hpp"
#include "net/api_error.hpp"

namespace cedar::net {

class tokenizer;

/// The served vocabulary for the scheduler's token masks: every id's bytes, the added tokens
/// marked (never allowed inside a format), `eos_id` the model's end token.
std::shared_ptr<const token_vocab> make_token_vocab(const tokenizer& tok, int32_t eos_id);

/// Compiles format object `format` into `out` (root < 0 for "text"). Chat's json_schema holds
/// its schema under "json_schema" (nested); Responses' text.format holds it directly. `param`
/// names the field in errors ("response_format" or "text.format").
std::optional<api_error> parse_response_format(simdjson::dom::element format, bool nested, std::string_view param,
                                               output_grammar& out);

/// Compiles JSON schema `schema` into `g` (root set); empty on success, else why not, with the
/// schema path of the keyword at fault.
std::string compile_json_schema(simdjson::dom::element schema, output_grammar& g);

}  // namespace cedar::net
