// Endpoint logic: validation beyond JSON shape (model name, limits), prompt building, and
// starting generations with the right writer.
#include "net/handlers.hpp"

#include <algorithm>
#include <cstdlib>

#include "net/api_writers.hpp"
#include "net/dsv41_tokens.hpp"
#include "net/json_writer.hpp"
#include "net/tokenizer.hpp"
#include "net/utf8.hpp"

namespace cedar::net {

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

std::optional<api_error> check_model(const server_state& state, const std::string& model) {
  if (model.empty() || model == state.model_name || model == "cedar" || model == "default") return {};
  return not_found("The model '" + model + "' does not exist", "model", "model_not_found");
}

/// The served model as /v1/models lists it.
void model_object(server_state& state, json_writer& w) {
  auto s = state.engine->summary();
  w.obj().kv("id", state.model_name).kv("object", "model")
      .kv("created", int64_t(std::chrono::system_clock::to_time_t(state.started)))
      .kv("owned_by", "cedar").kv("max_model_len", int64_t{s.max_context_tokens}).end_obj();
}

/// `text` with each %XX escape replaced by its byte (a malformed escape stays as written).
std::string percent_decoded(std::string_view text) {
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out += char(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::optional<api_error> check_ready(const server_state& state) {
  if (state.draining.load()) return not_ready("server is shutting down");
  if (!state.engine->ready()) return not_ready("engine is not ready");
  return {};
}

/// The generation of `ids` with `g`; after a chat prompt that opens the reasoning, a response
/// format holds only from the reasoning's end on.
generate_request make_request(const server_state& state, std::vector<int32_t> ids, const generation_options& g,
                              const reasoning_options* reasoning = nullptr) {
  generate_request req;
  req.prompt_ids = std::move(ids);
  req.sampling = g.sampling;
  req.max_tokens = g.max_tokens > 0 ? g.max_tokens : state.options.default_max_tokens;
  if (!g.ignore_eos) req.stop_ids = state.codec->stop_ids();
  req.stop_ids.insert(req.stop_ids.end(), g.stop_token_ids.begin(), g.stop_token_ids.end());
  req.ignore_eos = g.ignore_eos;
  req.min_tokens = g.min_tokens;
  req.top_logprobs = g.logprobs ? g.top_logprobs : -1;
  req.grammar = g.format;
  if (req.grammar.active() && reasoning && reasoning->thinking) req.grammar.start_after = dsv41::think_end_id;
  return req;
}

/// prompt_param: the request field the prompt came from (errors about the prompt name it).
started launch(const std::shared_ptr<server_state>& state, boost::asio::any_io_executor strand,
               std::unique_ptr<output_stream> parser, std::unique_ptr<response_writer> writer,
               const generation_options& g, generate_request req, frame_sink* sink, const std::string& prompt_param) {
  auto gen = std::make_shared<generation>(state, std::move(strand), std::move(parser),
                                          std::move(writer), g.stop, g.parallel_tool_calls, sink);
  if (auto err = gen->start(std::move(req), prompt_param)) return {nullptr, std::move(err), g.stream};
  return {std::move(gen), {}, g.stream};
}

writer_context context(const server_state& state, std::string id, const generation_options& g) {
  return {std::move(id), state.model_name, unix_now(), g.stream, g.include_usage, g.logprobs,
          state.codec.get()};
}

/// tool_choice "none": the tools stay in the prompt (it renders as every other turn of the
/// conversation does, so its prefix stays cached) and the tool-call marker is never sampled.
/// "required" or a function's name: the reply (after the reasoning, when thinking) opens a call
/// of one of the tools, or of that function; a response format then has nothing to hold.
void apply_tool_choice(generate_request& req, const prompt_codec& codec, const tool_choice_spec& choice,
                       const std::vector<tool_def>& tools, const reasoning_options& reasoning) {
  if (tools.empty() || choice.mode == "auto") return;
  if (choice.mode == "none") {
    req.banned_ids.push_back(dsv41::dsml_id);
    return;
  }
  for (const auto& tool : tools)
    if (!choice.names_function() || tool.name == choice.function)
      req.lead.choices.push_back(codec.tool_call_lead(tool.name));
  req.lead.after = reasoning.thinking ? dsv41::think_end_id : -1;
  req.grammar = {};
}

/// The Responses prompt of `conversation` from scratch: the instructions, then the messages.
context_prompt render_responses(const server_state& state, const responses_request& req,
                                const std::vector<chat_message>& conversation) {
  std::vector<chat_message> rendered;
  if (!req.instructions.empty()) rendered.push_back({"system", req.instructions, {}, {}, {}});
  rendered.insert(rendered.end(), conversation.begin(), conversation.end());
  return state.codec->extend_chat(nullptr, rendered, req.tools, req.reasoning);
}

/// truncation "auto": drops the conversation's oldest turns (a turn starts at a user message;
/// what comes before the first one, such as a developer message, stays) until the prompt
/// leaves room for the answer in the context window, or only the newest turn is left; the
/// fewest turns that fit are dropped. `prompt` and `conversation` become the truncated ones.
void truncate_to_window(const server_state& state, const responses_request& req, std::vector<chat_message>& conversation,
                        context_prompt& prompt) {
  const int64_t window = state.engine->summary().max_context_tokens;
  const int64_t answer = req.gen.max_tokens > 0 ? req.gen.max_tokens : state.options.default_max_tokens;
  const int64_t limit = window - std::min<int64_t>(answer, window / 2);
  if (window <= 0 || int64_t(prompt.ids.size()) <= limit) return;
  std::vector<std::size_t> starts;  // where each turn begins
  for (std::size_t i = 0; i < conversation.size(); ++i)
    if (conversation[i].role == "user") starts.push_back(i);
  if (starts.size() < 2) return;
  auto without = [&](std::size_t turns) {  // the conversation less its `turns` oldest turns
    std::vector<chat_message> kept(conversation.begin(), conversation.begin() + long(starts[0]));
    kept.insert(kept.end(), conversation.begin() + long(starts[turns]), conversation.end());
    return kept;
  };
  std::size_t lo = 1, hi = starts.size() - 1;  // drop hi turns at most (the newest stays)
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    const context_prompt p = render_responses(state, req, without(mid));
    if (p.error.empty() && int64_t(p.ids.size()) <= limit) hi = mid;
    else lo = mid + 1;
  }
  conversation = without(lo);
  prompt = render_responses(state, req, conversation);
}

/// The value of `name` in a URL query ("a=1&b=2"), percent-decoded; nullopt when absent.
std::optional<std::string> query_value(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const std::string_view pair = query.substr(0, query.find('&'));
    query.remove_prefix(std::min(query.size(), pair.size() + 1));
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) == name) return percent_decoded(eq == std::string_view::npos ? "" : pair.substr(eq + 1));
  }
  return std::nullopt;
}

/// One conversation entry as the Responses items it was given as: a message, or an assistant
/// turn's reasoning, text and function calls, or a function call's output. Each with an id
/// made of the response's and the item's place, so that `after` finds it again.
struct input_item {
  std::string id;
  const chat_message* m;
  enum class part { message, reasoning, call, output } what;
  std::size_t call = 0;  ///< part::call: which of m->tool_calls
};

std::vector<input_item> input_items_of(const stored_response& s) {
  std::vector<input_item> items;
  const std::string tag = s.id.substr(s.id.find('_') + 1);
  // the last entry is this response's reply (its output), not part of its input
  const std::size_t n = s.conversation.empty() ? 0 : s.conversation.size() - 1;
  for (std::size_t i = 0; i < n; ++i) {
    const chat_message& m = s.conversation[i];
    const auto add = [&](const char* prefix, input_item::part what, std::size_t call = 0) {
      items.push_back({prefix + tag + "_" + std::to_string(items.size()), &m, what, call});
    };
    if (m.role == "tool") {
      add("fco_", input_item::part::output);
    } else if (m.role == "assistant") {
      if (!m.reasoning_content.empty()) add("rs_", input_item::part::reasoning);
      if (!m.content.empty() || m.tool_calls.empty()) add("msg_", input_item::part::message);
      for (std::size_t c = 0; c < m.tool_calls.size(); ++c) add("fc_", input_item::part::call, c);
    } else {
      add("msg_", input_item::part::message);
    }
  }
  return items;
}

void input_item_json(json_writer& w, const input_item& it) {
  const chat_message& m = *it.m;
  w.obj().kv("id", it.id);
  switch (it.what) {
    case input_item::part::output:
      w.kv("type", "function_call_output").kv("call_id", m.tool_call_id).kv("output", m.content)
          .kv("status", "completed");
      break;
    case input_item::part::reasoning:
      w.kv("type", "reasoning").key("summary").arr().end_arr().key("content").arr()
          .obj().kv("type", "reasoning_text").kv("text", m.reasoning_content).end_obj().end_arr();
      break;
    case input_item::part::call: {
      const tool_call& c = m.tool_calls[it.call];
      w.kv("type", "function_call").kv("status", "completed").kv("call_id", c.id).kv("name", c.name)
          .kv("arguments", c.arguments);
      break;
    }
    case input_item::part::message: {
      const bool reply = m.role == "assistant";
      w.kv("type", "message").kv("status", "completed").kv("role", m.role == "latest_reminder" ? "system" : m.role)
          .key("content").arr().obj().kv("type", reply ? "output_text" : "input_text").kv("text", m.content);
      if (reply) w.key("annotations").arr().end_arr();
      w.end_obj().end_arr();
      break;
    }
  }
  w.end_obj();
}

/// GET /v1/responses/{id}/input_items: OpenAI's list, newest first unless order=asc, `limit`
/// (1-100, default 20) items after the item `after`.
simple_response input_items_response(const stored_response& s, std::string_view query) {
  int64_t limit = 20;
  if (auto v = query_value(query, "limit")) {
    char* end = nullptr;
    limit = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || limit < 1 || limit > 100)
      return error_response(bad_request("'limit' must be an integer from 1 to 100", "limit"));
  }
  const std::string order = query_value(query, "order").value_or("desc");
  if (order != "asc" && order != "desc")
    return error_response(bad_request("'order' must be 'asc' or 'desc'", "order"));
  std::vector<input_item> items = input_items_of(s);
  if (order == "desc") std::reverse(items.begin(), items.end());
  std::size_t first = 0;
  if (auto after = query_value(query, "after")) {
    auto at = std::find_if(items.begin(), items.end(), [&](const input_item& it) { return it.id == *after; });
    if (at == items.end())
      return error_response(bad_request("No input item with id '" + *after + "' in response '" + s.id + "'", "after"));
    first = std::size_t(at - items.begin()) + 1;
  }
  const std::size_t last = std::min(items.size(), first + std::size_t(limit));
  json_writer w;
  w.obj().kv("object", "list").key("data").arr();
  for (std::size_t i = first; i < last; ++i) input_item_json(w, items[i]);
  w.end_arr().key("first_id");
  if (first < last) w.str(items[first].id); else w.null();
  w.key("last_id");
  if (first < last) w.str(items[last - 1].id); else w.null();
  w.kv("has_more", last < items.size()).end_obj();
  return {200, "application/json", w.take()};
}

}  // namespace

simple_response error_response(const api_error& e) {
  return {e.status, "application/json", e.to_json()};
}

std::optional<simple_response> handle_get(server_state& state, std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  if (path == "/" || path == "/index.html")
    return simple_response{200, "text/html; charset=utf-8", std::string(chat_page_html())};
  if (path == "/health") {
    bool ok = state.ready();
    json_writer w;
    w.obj().kv("status", ok ? "ok" : state.draining ? "draining" : "starting").end_obj();
    return simple_response{ok ? 200 : 503, "application/json", w.take()};
  }
  if (path == "/metrics")
    return simple_response{200, "text/plain; version=0.0.4",
                           state.metrics.render(state.engine->metrics(), state.engine->ready(),
                                                state.draining)};
  if (path == "/v1/models") {
    json_writer w;
    w.obj().kv("object", "list").key("data").arr();
    model_object(state, w);
    w.end_arr().end_obj();
    return simple_response{200, "application/json", w.take()};
  }
  if (path.substr(0, 11) == "/v1/models/") {
    // The served model under any of its names; ids such as "org/name" keep their slash.
    std::string id = percent_decoded(path.substr(11));
    if (id.empty()) return error_response(not_found("No model id given", "model", "model_not_found"));
    if (auto err = check_model(state, id)) return error_response(*err);
    json_writer w;
    model_object(state, w);
    return simple_response{200, "application/json", w.take()};
  }
  if (path.substr(0, 14) == "/v1/responses/") {
    std::string_view id = path.substr(14);
    constexpr std::string_view items_suffix = "/input_items";
    const bool items = id.size() > items_suffix.size() && id.ends_with(items_suffix);
    if (items) id.remove_suffix(items_suffix.size());
    auto stored = state.responses->get(std::string(id));
    if (!stored)
      return error_response(not_found("No response with id '" + std::string(id) + "'", "response_id",
                                      "response_not_found"));
    if (items) {
      const auto q = target.find('?');
      return input_items_response(*stored, q == std::string_view::npos ? "" : target.substr(q + 1));
    }
    return simple_response{200, "application/json", stored->json};
  }
  return {};
}

simple_response handle_admin(server_state& state, std::string_view method, std::string_view target) {
  if (method == "GET" && target == "/admin/state") {
    auto m = state.engine->metrics();
    auto s = state.engine->summary();
    json_writer w;
    w.obj().kv("model", state.model_name).kv("layout", s.layout)
        .kv("kv_capacity_tokens", s.kv_capacity_tokens).kv("running", m.num_running)
        .kv("waiting", m.num_waiting).kv("topology", m.topology).kv("topology_state", m.topology_state)
        .kv("stored_responses", int64_t(state.responses->size()))
        .kv("stored_responses_bytes", int64_t(state.responses->bytes()))
        .kv("draining", state.draining.load()).end_obj();
    return {200, "application/json", w.take()};
  }
  return error_response(not_found("Unknown admin endpoint", {}, "unknown_url"));
}

started start_chat(const std::shared_ptr<server_state>& state, boost::asio::any_io_executor strand,
                   std::string_view body, frame_sink* sink) {
  chat_request req;
  if (auto err = parse_chat_request(body, req)) return {nullptr, std::move(err)};
  if (auto err = check_model(*state, req.model)) return {nullptr, std::move(err)};
  if (auto err = check_ready(*state)) return {nullptr, std::move(err)};
  auto prompt = state->codec->render_chat(req.messages, req.tools, req.reasoning);
  if (!prompt.error.empty()) return {nullptr, bad_request(prompt.error, "messages")};
  auto writer = make_chat_writer(context(*state, state->new_id("chatcmpl-"), req.gen));
  auto gen_request = make_request(*state, std::move(prompt.ids), req.gen, &req.reasoning);
  apply_tool_choice(gen_request, *state->codec, req.tool_choice, req.tools, req.reasoning);
  return launch(state, std::move(strand), state->codec->chat_output(req.reasoning.thinking),
                std::move(writer), req.gen, std::move(gen_request), sink, "messages");
}

started start_completion(const std::shared_ptr<server_state>& state,
                         boost::asio::any_io_executor strand, std::string_view body, frame_sink* sink) {
  completion_request req;
  if (auto err = parse_completion_request(body, req)) return {nullptr, std::move(err)};
  if (auto err = check_model(*state, req.model)) return {nullptr, std::move(err)};
  if (auto err = check_ready(*state)) return {nullptr, std::move(err)};
  std::vector<int32_t> ids = req.prompt_ids;
  if (!req.prompt_is_ids) {
    auto prompt = state->codec->encode_text(req.prompt_text);
    if (!prompt.error.empty()) return {nullptr, bad_request(prompt.error, "prompt")};
    ids = std::move(prompt.ids);
  } else {
    for (int32_t id : ids)
      if (id >= state->codec->vocab_size())
        return {nullptr, bad_request("token id " + std::to_string(id) + " is outside the vocabulary",
                                     "prompt")};
  }
  // The image token stands for an image's features, which a text prompt cannot carry.
  if (std::find(ids.begin(), ids.end(), dsv41::image_id) != ids.end())
    return {nullptr, bad_request("the prompt holds the image token (id " + std::to_string(dsv41::image_id) +
                                     "); this server takes text only",
                                 "prompt")};
  // A token-id prompt echoes as its text, control tokens spelled out as a text prompt would type
  // them; bytes that are not whole UTF-8 characters become U+FFFD.
  std::string echo;
  if (req.echo)
    echo = req.prompt_is_ids ? sanitize_utf8(state->codec->text_tokenizer().decode(req.prompt_ids))
                             : req.prompt_text;
  auto writer = make_completion_writer(context(*state, state->new_id("cmpl-"), req.gen), echo);
  return launch(state, std::move(strand), state->codec->text_output(), std::move(writer), req.gen,
                make_request(*state, std::move(ids), req.gen), sink, "prompt");
}

started start_responses(const std::shared_ptr<server_state>& state,
                        boost::asio::any_io_executor strand, responses_request req,
                        std::shared_ptr<const stored_response> previous, frame_sink* sink,
                        std::function<void(std::shared_ptr<const stored_response>)> on_stored) {
  if (auto err = check_model(*state, req.model)) return {nullptr, std::move(err)};
  if (auto err = check_ready(*state)) return {nullptr, std::move(err)};
  if (!req.previous_response_id.empty()) {
    previous = state->responses->get(req.previous_response_id);
    if (!previous)
      return {nullptr, bad_request("Previous response with id '" + req.previous_response_id +
                                       "' not found.", "previous_response_id",
                                   "previous_response_not_found")};
  }
  if (req.input.empty()) return {nullptr, bad_request("'input' is required", "input")};
  responses_turn turn;
  turn.state = state;
  if (previous) {
    turn.conversation = previous->conversation;
    turn.previous_response_id = previous->id;
    turn.session_id = previous->session_id;
  } else {
    turn.session_id = state->next_id.fetch_add(1);
  }
  if (auto err = check_tool_choice(req.tool_choice, req.tools)) return {nullptr, std::move(err)};
  for (auto& m : req.input) turn.conversation.push_back(m);
  // Continue the previous turn's rendered conversation when nothing that shapes the rendering
  // changed: only the new input is rendered and tokenized, and the prompt extends the ids the
  // engine session already holds. Otherwise render the whole chain again.
  context_prompt prompt;
  if (previous && previous->context && req.instructions == previous->instructions &&
      state->codec->can_continue(*previous->context, req.tools, req.reasoning)) {
    prompt = state->codec->extend_chat(previous->context, req.input, req.tools, req.reasoning);
  } else {
    prompt = render_responses(*state, req, turn.conversation);
  }
  if (!prompt.error.empty()) return {nullptr, bad_request(prompt.error, "input")};
  if (req.truncation_auto) truncate_to_window(*state, req, turn.conversation, prompt);
  turn.context = std::move(prompt.context);
  turn.tools = req.tools;
  turn.instructions = req.instructions;
  turn.tool_choice = req.tool_choice;
  turn.parallel_tool_calls = req.gen.parallel_tool_calls;
  turn.reasoning = req.reasoning;
  turn.sampling = req.gen.sampling;
  turn.max_output_tokens = req.gen.max_tokens;
  turn.format_json = req.gen.format_json;
  turn.metadata_json = req.metadata_json;
  turn.store = req.store;
  turn.truncation_auto = req.truncation_auto;
  turn.on_stored = std::move(on_stored);
  auto gen_request = make_request(*state, std::move(prompt.ids), req.gen, &req.reasoning);
  gen_request.session_id = turn.session_id;
  apply_tool_choice(gen_request, *state->codec, req.tool_choice, req.tools, req.reasoning);
  const uint64_t session_id = turn.session_id;
  auto writer = make_responses_writer(context(*state, state->new_id("resp_"), req.gen), std::move(turn));
  auto s = launch(state, std::move(strand), state->codec->chat_output(req.reasoning.thinking),
                  std::move(writer), req.gen, std::move(gen_request), sink, "input");
  if (s.error && !previous) state->responses->release(session_id);
  s.session_id = session_id;
  return s;
}

}  // namespace cedar::net
