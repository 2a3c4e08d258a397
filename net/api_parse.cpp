// simdjson (DOM) parsing of the three request bodies and the WebSocket events.
#include "net/api_parse.hpp"

#include <simdjson.h>

#include <charconv>
#include <cmath>

#include "net/json_writer.hpp"
#include "net/response_format.hpp"

namespace cedar::net {

namespace dom = simdjson::dom;
using opt_error = std::optional<api_error>;

namespace {

api_error type_error(std::string_view field, std::string_view want) {
  return bad_request(std::string("'") + std::string(field) + "' must be " + std::string(want),
                     std::string(field), "invalid_type");
}

/// Looks up an optional field; absent and null both give false.
bool field(dom::object obj, std::string_view name, dom::element& out) {
  if (obj.at_key(name).get(out) != simdjson::SUCCESS) return false;
  return !out.is_null();
}

opt_error get_string(dom::object obj, std::string_view name, std::string& out) {
  dom::element e;
  if (!field(obj, name, e)) return {};
  std::string_view s;
  if (e.get(s) != simdjson::SUCCESS) return type_error(name, "a string");
  out.assign(s);
  return {};
}

opt_error get_bool(dom::object obj, std::string_view name, bool& out) {
  dom::element e;
  if (!field(obj, name, e)) return {};
  if (e.get(out) != simdjson::SUCCESS) return type_error(name, "a boolean");
  return {};
}

opt_error get_number(dom::object obj, std::string_view name, double lo, double hi, double& out,
                     bool& present) {
  dom::element e;
  present = false;
  if (!field(obj, name, e)) return {};
  double v = 0;
  if (e.is_double()) v = e.get_double().value_unsafe();
  else if (e.is_int64()) v = double(e.get_int64().value_unsafe());
  else if (e.is_uint64()) v = double(e.get_uint64().value_unsafe());
  else return type_error(name, "a number");
  if (!(v >= lo && v <= hi))
    return bad_request("'" + std::string(name) + "' is out of range [" + json_writer().num(lo).take() + ", " +
                           json_writer().num(hi).take() + "]", std::string(name));  // 2, not 2.000000
  out = v;
  present = true;
  return {};
}

opt_error get_int(dom::object obj, std::string_view name, int64_t lo, int64_t hi, int64_t& out,
                  bool& present) {
  dom::element e;
  present = false;
  if (!field(obj, name, e)) return {};
  int64_t v = 0;
  if (e.is_int64()) v = e.get_int64().value_unsafe();
  else if (e.is_uint64()) v = INT64_MAX;
  else return type_error(name, "an integer");
  if (v < lo || v > hi)
    return bad_request("'" + std::string(name) + "' is out of range [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]", std::string(name));
  out = v;
  present = true;
  return {};
}

/// Text of a content value: a string, or a list of parts whose text parts join with "\n\n".
opt_error content_text(dom::element e, std::string_view param, std::string& out) {
  std::string_view s;
  if (e.get(s) == simdjson::SUCCESS) { out.assign(s); return {}; }
  dom::array parts;
  if (e.get(parts) != simdjson::SUCCESS) return type_error(param, "a string or an array of parts");
  bool first = true;
  for (dom::element part : parts) {
    dom::object p;
    if (part.get(p) != simdjson::SUCCESS) return type_error(param, "an array of content parts");
    std::string type, text;
    if (auto err = get_string(p, "type", type)) return type_error(param, "parts with a string type");
    if (type == "text" || type == "input_text" || type == "output_text" || type.empty()) {
      if (auto err = get_string(p, "text", text)) return err;
    } else if (type == "refusal") {
      if (auto err = get_string(p, "refusal", text)) return err;
    } else {
      return bad_request("content part type '" + type + "' is not supported by this model",
                         std::string(param), "unsupported_content");
    }
    if (!first) out += "\n\n";
    out += text;
    first = false;
  }
  return {};
}

opt_error parse_tool_calls(dom::element e, std::vector<tool_call>& out) {
  dom::array arr;
  if (e.get(arr) != simdjson::SUCCESS) return type_error("tool_calls", "an array");
  for (dom::element item : arr) {
    dom::object o, fn;
    if (item.get(o) != simdjson::SUCCESS) return type_error("tool_calls", "an array of objects");
    tool_call call;
    if (auto err = get_string(o, "id", call.id)) return err;
    dom::element f;
    if (!field(o, "function", f) || f.get(fn) != simdjson::SUCCESS)
      return type_error("tool_calls.function", "an object");
    if (auto err = get_string(fn, "name", call.name)) return err;
    dom::element args;
    if (field(fn, "arguments", args)) {
      std::string_view s;
      if (args.get(s) == simdjson::SUCCESS) call.arguments.assign(s);
      else call.arguments = simdjson::minify(args);
    }
    if (call.name.empty()) return bad_request("tool call without a function name", "tool_calls");
    out.push_back(std::move(call));
  }
  return {};
}

opt_error parse_messages(dom::element e, std::vector<chat_message>& out) {
  dom::array arr;
  if (e.get(arr) != simdjson::SUCCESS) return type_error("messages", "an array");
  for (dom::element item : arr) {
    dom::object o;
    if (item.get(o) != simdjson::SUCCESS) return type_error("messages", "an array of objects");
    chat_message m;
    if (auto err = get_string(o, "role", m.role)) return err;
    if (m.role == "developer") m.role = "system";
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool" &&
        m.role != "latest_reminder")
      return bad_request("unknown message role '" + m.role + "'", "messages.role");
    dom::element c;
    if (field(o, "content", c))
      if (auto err = content_text(c, "messages.content", m.content)) return err;
    if (auto err = get_string(o, "reasoning_content", m.reasoning_content)) return err;
    if (m.reasoning_content.empty())
      if (auto err = get_string(o, "reasoning", m.reasoning_content)) return err;
    if (auto err = get_string(o, "tool_call_id", m.tool_call_id)) return err;
    dom::element tc;
    if (m.role == "assistant" && field(o, "tool_calls", tc))
      if (auto err = parse_tool_calls(tc, m.tool_calls)) return err;
    out.push_back(std::move(m));
  }
  if (out.empty()) return bad_request("'messages' must not be empty", "messages", "empty_messages");
  return {};
}

/// Chat tools {type, function:{name,...}}; Responses tools are flat {type, name, ...}.
opt_error parse_tools(dom::object obj, bool flat, std::vector<tool_def>& out) {
  dom::element e;
  if (!field(obj, "tools", e)) return {};
  dom::array arr;
  if (e.get(arr) != simdjson::SUCCESS) return type_error("tools", "an array");
  for (dom::element item : arr) {
    dom::object t;
    if (item.get(t) != simdjson::SUCCESS) return type_error("tools", "an array of objects");
    std::string type = "function";
    if (auto err = get_string(t, "type", type)) return err;
    if (type != "function") continue;  // built-in tools are not served here
    dom::object fn = t;
    dom::element f;
    if (!flat) {
      if (!field(t, "function", f) || f.get(fn) != simdjson::SUCCESS)
        return type_error("tools.function", "an object");
    }
    tool_def def;
    if (auto err = get_string(fn, "name", def.name)) return err;
    if (def.name.empty()) return bad_request("tool without a name", "tools");
    if (flat) {
      std::string d = "{\"name\":";
      append_json_string(d, def.name);
      dom::element x;
      if (field(fn, "description", x)) d += ",\"description\":" + simdjson::minify(x);
      if (field(fn, "parameters", x)) d += ",\"parameters\":" + simdjson::minify(x);
      def.function_json = d + "}";
    } else {
      def.function_json = simdjson::minify(fn);
    }
    out.push_back(std::move(def));
  }
  return {};
}

opt_error parse_tool_choice(dom::object obj, tool_choice_spec& out) {
  dom::element e;
  if (!field(obj, "tool_choice", e)) return {};
  std::string_view s;
  if (e.get(s) == simdjson::SUCCESS) {
    if (s != "auto" && s != "none" && s != "required")
      return bad_request("'tool_choice' must be auto, none, required or a function", "tool_choice");
    out = {std::string(s), {}};
    return {};
  }
  dom::object o;
  if (e.get(o) != simdjson::SUCCESS) return type_error("tool_choice", "a string or an object");
  dom::element f;
  dom::object fn = o;
  if (field(o, "function", f) && f.get(fn) != simdjson::SUCCESS)
    return type_error("tool_choice.function", "an object");
  out.mode = "function";
  if (auto err = get_string(fn, "name", out.function)) return err;
  if (out.function.empty()) return bad_request("'tool_choice' names no function", "tool_choice");
  return {};
}

opt_error parse_stop(dom::object obj, std::vector<std::string>& out) {
  dom::element e;
  if (!field(obj, "stop", e)) return {};
  std::string_view s;
  if (e.get(s) == simdjson::SUCCESS) { if (!s.empty()) out.emplace_back(s); return {}; }
  dom::array arr;
  if (e.get(arr) != simdjson::SUCCESS) return type_error("stop", "a string or an array of strings");
  for (dom::element x : arr) {
    if (x.get(s) != simdjson::SUCCESS) return type_error("stop", "an array of strings");
    if (!s.empty()) out.emplace_back(s);
  }
  if (out.size() > 16) return bad_request("at most 16 stop sequences", "stop");
  return {};
}

/// logit_bias: {"token id": bias in [-100, 100], ...}; the ids are checked against the model's
/// vocabulary when the request is submitted.
opt_error parse_logit_bias(dom::object obj, std::vector<std::pair<int32_t, float>>& out) {
  dom::element e;
  if (!field(obj, "logit_bias", e)) return {};
  dom::object bias;
  if (e.get(bias) != simdjson::SUCCESS) return type_error("logit_bias", "an object of token ids to numbers");
  for (auto [key, value] : bias) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX)
      return bad_request("'logit_bias' keys must be token ids (got '" + std::string(key) + "')", "logit_bias");
    double v = 0;
    if (value.is_double()) v = value.get_double().value_unsafe();
    else if (value.is_int64()) v = double(value.get_int64().value_unsafe());
    else return type_error("logit_bias", "an object of token ids to numbers");
    if (!(v >= -100 && v <= 100)) return bad_request("'logit_bias' values must be in [-100, 100]", "logit_bias");
    out.emplace_back(int32_t(id), float(v));
  }
  if (out.size() > 1024) return bad_request("'logit_bias' holds at most 1024 tokens", "logit_bias");
  return {};
}

/// Sampling and output fields shared by the three endpoints.
opt_error parse_generation(dom::object obj, generation_options& g) {
  double d = 0;
  int64_t i = 0;
  bool has = false;
  if (auto err = get_number(obj, "temperature", 0, 2, d, has)) return err;
  if (has) g.sampling.temperature = float(d);
  if (auto err = get_number(obj, "top_p", 0, 1, d, has)) return err;
  if (has) {
    if (d <= 0) return bad_request("'top_p' must be greater than 0", "top_p");
    g.sampling.top_p = float(d);
  }
  if (auto err = get_number(obj, "min_p", 0, 1, d, has)) return err;
  if (has) g.sampling.min_p = float(d);
  if (auto err = get_number(obj, "frequency_penalty", -2, 2, d, has)) return err;
  if (has) g.sampling.frequency_penalty = float(d);
  if (auto err = get_number(obj, "presence_penalty", -2, 2, d, has)) return err;
  if (has) g.sampling.presence_penalty = float(d);
  if (auto err = get_number(obj, "repetition_penalty", 0, 1e6, d, has)) return err;
  if (has) {
    if (d <= 0) return bad_request("'repetition_penalty' must be greater than 0", "repetition_penalty");
    g.sampling.repetition_penalty = float(d);
  }
  if (auto err = parse_logit_bias(obj, g.sampling.logit_bias)) return err;
  if (auto err = get_int(obj, "top_k", -1, 1 << 20, i, has)) return err;
  if (has) g.sampling.top_k = i < 0 ? 0 : int(i);
  if (auto err = get_int(obj, "seed", INT64_MIN, INT64_MAX, i, has)) return err;
  if (has) { g.sampling.seed = uint64_t(i); g.sampling.has_seed = true; }
  for (auto name : {"max_tokens", "max_completion_tokens", "max_output_tokens"}) {
    if (auto err = get_int(obj, name, 1, 1 << 30, i, has)) return err;
    if (has) g.max_tokens = int(i);
  }
  if (auto err = get_int(obj, "n", 1, 1, i, has))
    return bad_request("only n=1 is supported", "n", "unsupported_value");
  if (auto err = parse_stop(obj, g.stop)) return err;
  if (auto err = get_bool(obj, "ignore_eos", g.ignore_eos)) return err;
  if (auto err = get_int(obj, "min_tokens", 0, 1 << 30, i, has)) return err;
  if (has) g.min_tokens = int(i);
  if (g.max_tokens > 0 && g.min_tokens > g.max_tokens)
    return bad_request("'min_tokens' must not exceed the answer's token limit", "min_tokens");
  dom::element ids;
  if (field(obj, "stop_token_ids", ids)) {
    dom::array arr;
    if (ids.get(arr) != simdjson::SUCCESS) return type_error("stop_token_ids", "an array of token ids");
    for (dom::element e : arr) {
      int64_t id = -1;
      if (e.get(id) != simdjson::SUCCESS || id < 0 || id > INT32_MAX)
        return type_error("stop_token_ids", "an array of token ids");
      g.stop_token_ids.push_back(int32_t(id));
    }
    if (g.stop_token_ids.size() > 64) return bad_request("at most 64 stop_token_ids", "stop_token_ids");
  }
  if (auto err = get_bool(obj, "stream", g.stream)) return err;
  dom::element so;
  if (field(obj, "stream_options", so)) {
    dom::object o;
    if (so.get(o) != simdjson::SUCCESS) return type_error("stream_options", "an object");
    if (auto err = get_bool(o, "include_usage", g.include_usage)) return err;
  }
  return {};
}

opt_error parse_reasoning(dom::object obj, reasoning_options& r) {
  dom::element e;
  if (field(obj, "chat_template_kwargs", e)) {
    dom::object k;
    if (e.get(k) != simdjson::SUCCESS) return type_error("chat_template_kwargs", "an object");
    if (auto err = get_bool(k, "thinking", r.thinking)) return err;
    if (auto err = get_bool(k, "enable_thinking", r.thinking)) return err;
    dom::element eff;
    if (field(k, "reasoning_effort", eff)) {
      std::string_view s;
      if (eff.get(s) != simdjson::SUCCESS || !parse_effort(s, r))
        return bad_request("unknown reasoning effort", "chat_template_kwargs.reasoning_effort");
    }
  }
  for (auto name : {"reasoning_effort"}) {
    if (!field(obj, name, e)) continue;
    std::string_view s;
    int64_t v = 0;
    if (e.get(s) == simdjson::SUCCESS) {
      if (!parse_effort(s, r)) return bad_request("unknown reasoning_effort '" + std::string(s) + "'", name);
    } else if (e.is_int64() && (v = e.get_int64().value_unsafe()) >= 1 && v <= 100) {
      r.effort = int(v), r.effort_name.clear();
    } else {
      return bad_request("'reasoning_effort' must be low, medium, high, max, none or 1-100", name);
    }
  }
  dom::element thinking;
  if (field(obj, "thinking", thinking)) {  // DeepSeek/Anthropic style {"type":"enabled"|"disabled"}
    dom::object t;
    std::string type;
    if (thinking.get(t) == simdjson::SUCCESS && !get_string(t, "type", type) && !type.empty())
      r.thinking = type != "disabled";
  }
  return {};
}

opt_error parse_root(std::string_view body, dom::parser& parser, dom::object& root) {
  simdjson::padded_string padded(body);
  dom::element doc;
  auto err = parser.parse(padded).get(doc);
  if (err == simdjson::UTF8_ERROR)
    return bad_request("request body is not valid UTF-8", {}, "invalid_utf8");
  if (err) return bad_request(std::string("malformed JSON: ") + simdjson::error_message(err), {},
                              "invalid_json");
  if (doc.get(root) != simdjson::SUCCESS)
    return bad_request("request body must be a JSON object", {}, "invalid_json");
  return {};
}

}  // namespace

opt_error check_tool_choice(const tool_choice_spec& choice, const std::vector<tool_def>& tools) {
  if (choice.mode == "required" && tools.empty())
    return bad_request("'tool_choice' is 'required' but no tools are given", "tool_choice");
  if (!choice.names_function()) return {};
  for (const tool_def& t : tools)
    if (t.name == choice.function) return {};
  return bad_request("'tool_choice' names '" + choice.function + "', which is not among the tools", "tool_choice");
}

bool parse_effort(std::string_view name, reasoning_options& out) {
  if (name == "none") { out.thinking = false; return true; }
  if (name == "minimal" || name == "low") out.effort = 50;
  else if (name == "medium" || name == "high" || name == "xhigh") out.effort = 75;
  else if (name == "max") out.effort = 100;
  else return false;
  out.effort_name = name;
  return true;
}

std::string effort_name(const reasoning_options& r) {
  if (!r.thinking) return "none";
  if (!r.effort_name.empty()) return r.effort_name;
  return r.effort <= 62 ? "low" : r.effort < 88 ? "medium" : "max";
}

opt_error parse_chat_request(std::string_view body, chat_request& out) {
  dom::parser parser;
  dom::object root;
  if (auto err = parse_root(body, parser, root)) return err;
  if (auto err = get_string(root, "model", out.model)) return err;
  dom::element msgs;
  if (!field(root, "messages", msgs))
    return bad_request("'messages' is required", "messages", "missing_required_parameter");
  if (auto err = parse_messages(msgs, out.messages)) return err;
  if (auto err = parse_tools(root, false, out.tools)) return err;
  if (auto err = parse_tool_choice(root, out.tool_choice)) return err;
  if (auto err = check_tool_choice(out.tool_choice, out.tools)) return err;
  if (auto err = parse_generation(root, out.gen)) return err;
  if (auto err = get_bool(root, "parallel_tool_calls", out.gen.parallel_tool_calls)) return err;
  if (auto err = parse_reasoning(root, out.reasoning)) return err;
  if (auto err = get_bool(root, "logprobs", out.gen.logprobs)) return err;
  int64_t k = 0;
  bool has = false;
  if (auto err = get_int(root, "top_logprobs", 0, 20, k, has)) return err;
  if (has) {
    out.gen.top_logprobs = int(k);
    if (!out.gen.logprobs) return bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  }
  if (auto err = get_string(root, "user", out.user)) return err;
  dom::element rf;
  if (field(root, "response_format", rf))
    if (auto err = parse_response_format(rf, true, "response_format", out.gen.format)) return err;
  return {};
}

opt_error parse_completion_request(std::string_view body, completion_request& out) {
  dom::parser parser;
  dom::object root;
  if (auto err = parse_root(body, parser, root)) return err;
  if (auto err = get_string(root, "model", out.model)) return err;
  dom::element p;
  if (!field(root, "prompt", p))
    return bad_request("'prompt' is required", "prompt", "missing_required_parameter");
  std::string_view s;
  dom::array arr;
  if (p.get(s) == simdjson::SUCCESS) {
    out.prompt_text.assign(s);
  } else if (p.get(arr) == simdjson::SUCCESS) {
    for (dom::element x : arr) {
      if (x.get(s) == simdjson::SUCCESS) {
        if (arr.size() != 1) return bad_request("only one prompt per request", "prompt");
        out.prompt_text.assign(s);
      } else if (x.is_int64() && x.get_int64().value_unsafe() >= 0 &&
                 x.get_int64().value_unsafe() < (1 << 30)) {
        out.prompt_ids.push_back(int32_t(x.get_int64().value_unsafe()));
        out.prompt_is_ids = true;
      } else {
        return type_error("prompt", "a string or an array of token ids");
      }
    }
  } else {
    return type_error("prompt", "a string or an array of token ids");
  }
  if (out.prompt_text.empty() && out.prompt_ids.empty())
    return bad_request("'prompt' must not be empty", "prompt");
  out.gen.max_tokens = 16;
  if (auto err = parse_generation(root, out.gen)) return err;
  if (auto err = get_bool(root, "echo", out.echo)) return err;
  int64_t k = 0;
  bool has = false;
  if (auto err = get_int(root, "logprobs", 0, 20, k, has)) return err;
  if (has) { out.gen.logprobs = true; out.gen.top_logprobs = int(k); }
  dom::element rf;
  if (field(root, "response_format", rf))
    if (auto err = parse_response_format(rf, true, "response_format", out.gen.format)) return err;
  return {};
}

namespace {

/// Responses input items -> messages (spec §2.2, Responses mapping).
opt_error parse_input_items(dom::array items, std::vector<chat_message>& out) {
  std::string pending_reasoning;
  for (dom::element item : items) {
    dom::object o;
    if (item.get(o) != simdjson::SUCCESS) return type_error("input", "an array of objects");
    std::string type;
    if (auto err = get_string(o, "type", type)) return err;
    if (type.empty() || type == "message") {
      chat_message m;
      if (auto err = get_string(o, "role", m.role)) return err;
      if (m.role == "developer") m.role = "system";
      if (m.role != "system" && m.role != "user" && m.role != "assistant")
        return bad_request("unknown input role '" + m.role + "'", "input.role");
      dom::element c;
      if (field(o, "content", c))
        if (auto err = content_text(c, "input.content", m.content)) return err;
      if (m.role == "assistant") m.reasoning_content = std::exchange(pending_reasoning, {});
      out.push_back(std::move(m));
    } else if (type == "function_call") {
      tool_call call;
      if (auto err = get_string(o, "call_id", call.id)) return err;
      if (auto err = get_string(o, "name", call.name)) return err;
      if (auto err = get_string(o, "arguments", call.arguments)) return err;
      if (call.name.empty()) return bad_request("function_call without a name", "input.name");
      // Calls join the assistant message right before them: cedar's own output lists a turn's
      // text and its calls as a message item then function_call items, and the model wrote them
      // as one turn. A reasoning item in between starts a new turn.
      if (out.empty() || out.back().role != "assistant" || !pending_reasoning.empty()) {
        chat_message m;
        m.role = "assistant";
        m.reasoning_content = std::exchange(pending_reasoning, {});
        out.push_back(std::move(m));
      }
      out.back().tool_calls.push_back(std::move(call));
    } else if (type == "function_call_output") {
      chat_message m;
      m.role = "tool";
      if (auto err = get_string(o, "call_id", m.tool_call_id)) return err;
      dom::element outp;
      if (field(o, "output", outp))
        if (auto err = content_text(outp, "input.output", m.content)) return err;
      out.push_back(std::move(m));
    } else if (type == "reasoning") {
      for (auto key : {"content", "summary"}) {
        dom::element parts;
        dom::array arr;
        if (!field(o, key, parts) || parts.get(arr) != simdjson::SUCCESS) continue;
        for (dom::element part : arr) {
          dom::object po;
          std::string text;
          if (part.get(po) == simdjson::SUCCESS && !get_string(po, "text", text)) pending_reasoning += text;
        }
        if (!pending_reasoning.empty()) break;
      }
    } else {
      return bad_request("input item type '" + type + "' is not supported", "input.type",
                         "unsupported_value");
    }
  }
  return {};
}

/// metadata: up to 16 string values under keys of up to 64 characters, values of up to 512
/// (OpenAI's limits); null is none.
opt_error parse_metadata(dom::object root, std::string& out) {
  dom::element e;
  if (!field(root, "metadata", e) || e.is_null()) return {};
  dom::object o;
  if (e.get(o) != simdjson::SUCCESS) return type_error("metadata", "an object of strings");
  size_t n = 0;
  for (auto [k, v] : o) {
    if (++n > 16) return bad_request("'metadata' holds more than 16 keys", "metadata");
    if (k.size() > 64) return bad_request("a 'metadata' key is longer than 64 characters", "metadata");
    std::string_view text;
    if (v.get(text) != simdjson::SUCCESS) return type_error("metadata." + std::string(k), "a string");
    if (text.size() > 512) return bad_request("'metadata." + std::string(k) + "' is longer than 512 characters", "metadata");
  }
  out = simdjson::minify(e);
  return {};
}

opt_error parse_responses_object(dom::object root, responses_request& out) {
  if (auto err = get_string(root, "model", out.model)) return err;
  if (auto err = get_string(root, "instructions", out.instructions)) return err;
  if (auto err = get_string(root, "previous_response_id", out.previous_response_id)) return err;
  dom::element in;
  if (field(root, "input", in)) {
    std::string_view s;
    dom::array arr;
    if (in.get(s) == simdjson::SUCCESS) {
      out.input.push_back(chat_message{"user", std::string(s), {}, {}, {}});
    } else if (in.get(arr) == simdjson::SUCCESS) {
      if (auto err = parse_input_items(arr, out.input)) return err;
    } else {
      return type_error("input", "a string or an array of items");
    }
  }
  if (out.input.empty() && out.previous_response_id.empty())
    return bad_request("'input' is required", "input", "missing_required_parameter");
  if (auto err = parse_tools(root, true, out.tools)) return err;
  if (auto err = parse_tool_choice(root, out.tool_choice)) return err;  // checked once tools are known
  if (auto err = parse_generation(root, out.gen)) return err;
  if (auto err = get_bool(root, "parallel_tool_calls", out.gen.parallel_tool_calls)) return err;
  if (auto err = parse_reasoning(root, out.reasoning)) return err;
  dom::element r;
  if (field(root, "reasoning", r)) {
    dom::object ro;
    if (r.get(ro) != simdjson::SUCCESS) return type_error("reasoning", "an object");
    std::string effort;
    if (auto err = get_string(ro, "effort", effort)) return err;
    if (!effort.empty() && !parse_effort(effort, out.reasoning))
      return bad_request("unknown reasoning.effort '" + effort + "'", "reasoning.effort");
  }
  if (auto err = get_bool(root, "store", out.store)) return err;
  std::string truncation = "disabled";
  if (auto err = get_string(root, "truncation", truncation)) return err;
  if (truncation != "auto" && truncation != "disabled")
    return bad_request("'truncation' must be auto or disabled", "truncation");
  out.truncation_auto = truncation == "auto";
  if (auto err = parse_metadata(root, out.metadata_json)) return err;
  dom::element text;
  if (field(root, "text", text)) {
    dom::object to;
    if (text.get(to) != simdjson::SUCCESS) return type_error("text", "an object");
    dom::element fmt;
    if (field(to, "format", fmt)) {
      if (auto err = parse_response_format(fmt, false, "text.format", out.gen.format)) return err;
      out.gen.format_json = simdjson::minify(fmt);
    }
  }
  return {};
}

}  // namespace

opt_error parse_responses_request(std::string_view body, responses_request& out) {
  dom::parser parser;
  dom::object root;
  if (auto err = parse_root(body, parser, root)) return err;
  return parse_responses_object(root, out);
}

opt_error parse_layout_request(std::string_view body, std::string& layout) {
  dom::parser parser;
  dom::object root;
  if (auto err = parse_root(body, parser, root)) return err;
  if (auto err = get_string(root, "layout", layout)) return err;
  if (layout.empty()) return bad_request("'layout' is required", "layout", "missing_required_parameter");
  return {};
}

opt_error parse_ws_event(std::string_view text, ws_client_event& out) {
  dom::parser parser;
  dom::object root;
  if (auto err = parse_root(text, parser, root)) return err;
  std::string type;
  if (auto err = get_string(root, "type", type)) return err;
  if (type == "response.cancel") { out.type = ws_client_event::kind::cancel; return {}; }
  if (type != "response.create")
    return bad_request("unknown event type '" + type + "'", "type", "unknown_event");
  out.type = ws_client_event::kind::create;
  dom::element inner;
  dom::object body = root;
  if (field(root, "response", inner) && inner.get(body) != simdjson::SUCCESS)
    return type_error("response", "an object");
  return parse_responses_object(body, out.create);
}

}  // namespace cedar::net
