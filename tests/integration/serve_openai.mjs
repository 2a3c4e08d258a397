// The openai npm SDK against `cedar serve` (see serve_openai.sh). Each check throws on failure.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
const require = createRequire(process.env.CEDAR_ROOT + "/tools/node/package.json");
const { OpenAI } = require("openai");

const tiny = new OpenAI({ baseURL: process.env.URL_TINY + "/v1", apiKey: "sk-test" });
const nul = new OpenAI({ baseURL: process.env.URL_NULL + "/v1", apiKey: "unused" });
const chatMode = { chat_template_kwargs: { thinking: false } };
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather for a city",
  parameters: { type: "object", properties: { location: { type: "string" }, days: { type: "integer" } },
                required: ["location"] } } }];
// CEDAR_SKIP_CHECKS: a regular expression; checks whose name matches are listed as skipped, not run
// (a server that cannot do that part, e.g. a GPU server of one shard cannot switch layouts).
const skip = process.env.CEDAR_SKIP_CHECKS ? new RegExp(process.env.CEDAR_SKIP_CHECKS) : null;
let passed = 0, skipped = 0;
async function check(name, fn) {
  if (skip?.test(name)) {
    skipped++;
    console.log(`  skip ${name}`);
    return;
  }
  const t0 = Date.now();
  await fn();
  passed++;
  console.log(`  ok  ${name} (${Date.now() - t0} ms)`);
}

await check("models lists the served model", async () => {
  const models = await tiny.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].id, "tiny");
});

await check("models.retrieve answers for the served name and its aliases; another name is a 404", async () => {
  for (const name of ["tiny", "cedar", "default"]) {
    const m = await tiny.models.retrieve(name);
    assert.equal(m.id, "tiny");
    assert.equal(m.object, "model");
    assert.ok(m.max_model_len > 0);
  }
  await assert.rejects(tiny.models.retrieve("gpt-7"), (e) => e.status === 404 && e.code === "model_not_found");
});

await check("a wrong API key is refused with 401", async () => {
  const bad = new OpenAI({ baseURL: process.env.URL_TINY + "/v1", apiKey: "sk-wrong", maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.code === "invalid_api_key");
});

await check("chat, not streamed: content, finish_reason and usage", async () => {
  const r = await tiny.chat.completions.create({ model: "tiny", max_tokens: 6, temperature: 0,
    messages: [{ role: "user", content: "Say hello" }], ...chatMode });
  assert.equal(r.object, "chat.completion");
  const c = r.choices[0];
  assert.equal(c.message.role, "assistant");
  assert.equal(typeof c.message.content, "string");
  assert.ok(c.message.content.length > 0, "no text");
  assert.ok(["length", "stop"].includes(c.finish_reason));
  assert.ok(r.usage.prompt_tokens > 3);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 6);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, "number");
});

await check("greedy chat gives the same answer from the prefix cache (--swa-replay full)", async () => {
  const req = { model: "tiny", max_tokens: 5, temperature: 0, ...chatMode,
    messages: [{ role: "system", content: "You are terse. ".repeat(60) }, { role: "user", content: "Hi" }] };
  const a = await tiny.chat.completions.create(req);
  const b = await tiny.chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.ok(a.usage.prompt_tokens > 64, `prompt ${a.usage.prompt_tokens} tokens is shorter than a page`);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, "second identical prompt found nothing cached");
});

await check("chat, streamed: role first, text deltas, finish chunk, usage chunk", async () => {
  const stream = await tiny.chat.completions.create({ model: "tiny", max_tokens: 8, temperature: 0.7, seed: 7,
    messages: [{ role: "user", content: "Count to five" }], stream: true,
    stream_options: { include_usage: true }, ...chatMode });
  let text = "", chunks = 0, finish = null, usage = null, role = null;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(role, "assistant");
  assert.ok(text.length > 0);
  assert.ok(chunks >= 4, `only ${chunks} chunks`);
  assert.ok(finish);
  assert.ok(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= 8);
});

await check("thinking on: the output is reasoning_content", async () => {
  const r = await tiny.chat.completions.create({ model: "tiny", max_tokens: 4,
    messages: [{ role: "user", content: "Think" }], reasoning_effort: "high" });
  assert.ok(r.choices[0].message.reasoning_content.length > 0);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
});

await check("a tool-call round trip with the tiny model (assistant call + tool result + next turn)", async () => {
  const base = [{ role: "user", content: "Weather in Paris?" }];
  const first = await tiny.chat.completions.create({ model: "tiny", max_tokens: 4, temperature: 0, tools, messages: base });
  const next = await tiny.chat.completions.create({ model: "tiny", max_tokens: 4, temperature: 0, tools, messages: [
    ...base,
    { role: "assistant", content: "", reasoning_content: "I need the weather.",
      tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"location":"Paris"}' } }] },
    { role: "tool", tool_call_id: "call_1", content: '{"temp_c": 21}' }] });
  assert.ok(next.usage.prompt_tokens > first.usage.prompt_tokens + 20);
  assert.ok(next.choices[0].message.reasoning_content !== undefined || next.choices[0].message.content !== undefined);
});

await check("the parser path: a scripted DSML call comes back as tool_calls, reasoning apart", async () => {
  const r = await nul.chat.completions.create({ model: "null", tools, max_tokens: 500,
    messages: [{ role: "user", content: "Weather in Paris?" }] });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, "tool_calls");
  assert.equal(m.reasoning_content, "I should call\n\nthe weather tool.");
  assert.equal(m.content, "Let me check.");
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, "function");
  assert.equal(m.tool_calls[0].function.name, "get_weather");
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { location: "Paris", days: 3 });
  assert.ok(m.tool_calls[0].id.startsWith("call_"));
  // The next turn carries the call and its result back.
  const next = await nul.chat.completions.create({ model: "null", tools, max_tokens: 500, messages: [
    { role: "user", content: "Weather in Paris?" }, m,
    { role: "tool", tool_call_id: m.tool_calls[0].id, content: "sunny, 21 C" }] });
  assert.ok(next.usage.prompt_tokens > r.usage.prompt_tokens);
});

await check("the parser path, streamed: tool_calls deltas with index, id and name, then arguments", async () => {
  const stream = await nul.chat.completions.create({ model: "null", tools, max_tokens: 500, stream: true,
    messages: [{ role: "user", content: "Weather?" }] });
  let reasoning = "", name = null, id = null, args = "", finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.reasoning_content) reasoning += c.delta.reasoning_content;
    for (const t of c.delta.tool_calls || []) {
      assert.equal(t.index, 0);
      if (t.id) id = t.id;
      if (t.function?.name) name = t.function.name;
      if (t.function?.arguments) args += t.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(reasoning, "I should call\n\nthe weather tool.");
  assert.equal(name, "get_weather");
  assert.ok(id);
  assert.deepEqual(JSON.parse(args), { location: "Paris", days: 3 });
  assert.equal(finish, "tool_calls");
});

await check("stop strings cut the text and end the request with finish_reason stop", async () => {
  const r = await nul.completions.create({ model: "null", prompt: "x", max_tokens: 500, stop: ["weather", "zzz"] });
  assert.equal(r.choices[0].text, "I should call\n\nthe ");
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.ok(r.usage.completion_tokens < 20);
});

await check("completions: the raw text keeps </think> and the tool-call markers, only the end token is dropped", async () => {
  const r = await nul.completions.create({ model: "null", prompt: "x", max_tokens: 500 });
  assert.equal(r.choices[0].text, process.env.NULL_SCRIPT);
  assert.equal(r.choices[0].finish_reason, "stop");
});

await check("completions: text prompt and token-id prompt", async () => {
  const a = await tiny.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 5, temperature: 0 });
  assert.equal(a.object, "text_completion");
  assert.ok(a.choices[0].text.length > 0);
  const b = await tiny.completions.create({ model: "tiny", prompt: [0, 5, 17, 300, 4242], max_tokens: 3 });
  assert.equal(b.usage.prompt_tokens, 5);
  assert.ok(b.usage.completion_tokens >= 1);
});

await check("completions echo: the prompt comes back before the text, a token-id prompt as its text", async () => {
  const a = await tiny.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 3, echo: true,
    logprobs: 1 });
  assert.ok(a.choices[0].text.startsWith("Once upon a time"), a.choices[0].text);
  assert.equal(a.choices[0].logprobs.text_offset[0], "Once upon a time".length);
  // id 0 is the begin-of-sentence token: its text leads the echo
  const b = await tiny.completions.create({ model: "tiny", prompt: [0, 5, 17, 300, 4242], max_tokens: 1, echo: true,
    logprobs: 1 });
  const echoed = b.choices[0].text.slice(0, b.choices[0].logprobs.text_offset[0]);
  assert.ok(echoed.startsWith("<｜begin▁of▁sentence｜>") && echoed.length > "<｜begin▁of▁sentence｜>".length, echoed);
  const c = await tiny.completions.create({ model: "tiny", prompt: [0, 5, 17, 300, 4242], max_tokens: 1 });
  assert.ok(!c.choices[0].text.startsWith("<｜begin"), "echoed without echo");
});

await check("frequency_penalty and presence_penalty: negative ones repeat a token, positive ones avoid repeats", async () => {
  const tokens = async (penalty) => {
    const r = await tiny.completions.create({ model: "tiny", prompt: "Hello there", max_tokens: 24, temperature: 0,
      logprobs: 0, frequency_penalty: penalty, presence_penalty: penalty });
    return r.choices[0].logprobs.tokens;
  };
  const favoured = await tokens(-2), avoided = await tokens(2);
  assert.equal(favoured.length, 24);
  assert.ok(new Set(favoured).size <= 3, `-2: ${favoured.join("|")}`);
  assert.equal(new Set(avoided).size, avoided.length, `2: ${avoided.join("|")}`);
  // chat takes them too; past [-2, 2] is a 400 naming the field
  const chat = await tiny.chat.completions.create({ model: "tiny", max_tokens: 4, frequency_penalty: 0.5,
    presence_penalty: -0.5, messages: [{ role: "user", content: "x" }], ...chatMode });
  assert.equal(chat.usage.completion_tokens, 4);
  await assert.rejects(tiny.chat.completions.create({ model: "tiny", max_tokens: 4, presence_penalty: 2.5,
    messages: [{ role: "user", content: "x" }] }), (e) => e.status === 400 && e.param === "presence_penalty");
});

await check("repetition_penalty: a large one keeps the prompt's and the answer's tokens out, a small one brings them back", async () => {
  // the prompt holds the model's own greedy answer, so those tokens are the ones it would repeat
  const base = await tiny.completions.create({ model: "tiny", prompt: "Hi", max_tokens: 8, temperature: 0,
    logprobs: 0 });
  const inPrompt = new Set(base.choices[0].logprobs.tokens);
  const run = async (repetition_penalty) => (await tiny.completions.create({ model: "tiny",
    prompt: "Hi" + base.choices[0].text, max_tokens: 16, temperature: 0, logprobs: 0, repetition_penalty,
  })).choices[0].logprobs.tokens;
  const plain = await run(1), avoided = await run(50), favoured = await run(0.02);
  const repeats = (ts) => ts.filter((t, i) => inPrompt.has(t) || ts.indexOf(t) < i).length;
  // the first answer token can only repeat the prompt: plain, it does not; favoured, it does
  assert.ok(!inPrompt.has(plain[0]) && inPrompt.has(favoured[0]), `1: ${plain[0]}, 0.02: ${favoured[0]}`);
  assert.ok(repeats(favoured) >= 12, `0.02: ${favoured.join("|")}`);
  assert.equal(avoided.length, 16);
  assert.equal(repeats(avoided), 0, `50: ${avoided.join("|")}`);
  await assert.rejects(tiny.chat.completions.create({ model: "tiny", max_tokens: 4, repetition_penalty: 0,
    messages: [{ role: "user", content: "x" }] }), (e) => e.status === 400 && e.param === "repetition_penalty");
});

await check("logit_bias: +100 makes a token the answer, -100 keeps it out; a bad key or id is a 400", async () => {
  const texts = async (logit_bias) => {
    const r = await tiny.completions.create({ model: "tiny", prompt: [5, 6, 7], max_tokens: 6, temperature: 0,
      logprobs: 0, logit_bias });
    return r.choices[0].logprobs.tokens;
  };
  const free = await texts({});
  const a = await texts({ 1000: 100 });
  const b = await texts({ 1000: -100, 1001: 100 });
  const c = await texts({ 1000: 100, 1001: 100, 5: 0 });
  assert.ok(a.every((t) => t === a[0]) && a[0] !== free[0], `${free.join("|")} / ${a.join("|")}`);
  assert.ok(b.every((t) => t === b[0]) && b[0] !== a[0], `${a.join("|")} / ${b.join("|")}`);
  assert.ok(c.every((t) => t === a[0] || t === b[0]), c.join("|"));
  await assert.rejects(tiny.completions.create({ model: "tiny", prompt: [5], max_tokens: 1, logit_bias: { abc: 1 } }),
    (e) => e.status === 400 && e.param === "logit_bias");
  await assert.rejects(tiny.completions.create({ model: "tiny", prompt: [5], max_tokens: 1, logit_bias: { 5: 101 } }),
    (e) => e.status === 400 && e.param === "logit_bias");
  await assert.rejects(tiny.completions.create({ model: "tiny", prompt: [5], max_tokens: 1, logit_bias: { 999999: 1 } }),
    (e) => e.status === 400 && /outside the vocabulary/.test(e.message));
});

await check("vLLM's extras: ignore_eos, min_tokens, stop_token_ids and min_p", async () => {
  const run = async (extra) => {
    const r = await tiny.completions.create({ model: "tiny", prompt: [5, 6], max_tokens: 8, temperature: 0, ...extra });
    return [r.usage.completion_tokens, r.choices[0].finish_reason];
  };
  const eos = { logit_bias: { 1: 100 } };  // the end token, always
  assert.deepEqual(await run(eos), [1, "stop"]);
  assert.deepEqual(await run({ ...eos, ignore_eos: true }), [8, "length"]);
  assert.deepEqual(await run({ ...eos, min_tokens: 5 }), [6, "stop"]);
  assert.deepEqual(await run({ logit_bias: { 1000: 100 }, stop_token_ids: [1000] }), [1, "stop"]);
  await assert.rejects(run({ min_tokens: 9 }), (e) => e.status === 400 && e.param === "min_tokens");
  // min_p 1 keeps only the likeliest token: sampled at temperature 1, the greedy answer
  const text = async (extra) => (await tiny.completions.create({ model: "tiny", prompt: [5, 6], max_tokens: 8,
    ...extra })).choices[0].text;
  assert.equal(await text({ temperature: 1, seed: 11, min_p: 1 }), await text({ temperature: 0 }));
  await assert.rejects(run({ min_p: 1.5 }), (e) => e.status === 400 && e.param === "min_p");
  await assert.rejects(run({ stop_token_ids: ["x"] }), (e) => e.status === 400 && e.param === "stop_token_ids");
});

await check("logprobs with top_logprobs", async () => {
  const r = await tiny.chat.completions.create({ model: "tiny", max_tokens: 3, logprobs: true, top_logprobs: 2,
    messages: [{ role: "user", content: "x" }], ...chatMode });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 2);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
  }
});

await check("completions logprobs: tokens, their logprobs, the top ones and text offsets, streamed or not", async () => {
  const r = await nul.completions.create({ model: "null", prompt: "x", max_tokens: 5, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert.ok(lp, "no logprobs object");
  assert.equal(lp.tokens.length, r.usage.completion_tokens);
  assert.equal(lp.tokens.join(""), r.choices[0].text);  // the script is plain ASCII
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  for (const v of lp.token_logprobs) assert.ok(v <= 0);
  for (const top of lp.top_logprobs) assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 2);
  let at = 0;
  lp.tokens.forEach((t, i) => { assert.equal(lp.text_offset[i], at); at += t.length; });
  // streamed: each chunk carries its own tokens; together they are the same answer
  const stream = await nul.completions.create({ model: "null", prompt: "x", max_tokens: 5, logprobs: 2, stream: true });
  const tokens = [], offsets = [];
  let text = "";
  for await (const c of stream) {
    const ch = c.choices[0];
    if (!ch) continue;
    text += ch.text;
    if (ch.logprobs) tokens.push(...ch.logprobs.tokens), offsets.push(...ch.logprobs.text_offset);
  }
  assert.equal(text, r.choices[0].text);
  assert.deepEqual(tokens, lp.tokens);
  assert.deepEqual(offsets, lp.text_offset);
  const plain = await nul.completions.create({ model: "null", prompt: "x", max_tokens: 2 });
  assert.equal(plain.choices[0].logprobs, null);
});

await check("reasoning_tokens counts every token of the reasoning, paragraph breaks included", async () => {
  // the script's reasoning is "I should call\n\nthe weather tool.": a cut inside it is all reasoning
  for (let k = 1; k <= 6; k++) {
    const r = await nul.chat.completions.create({ model: "null", max_tokens: k, messages: [{ role: "user", content: "x" }] });
    assert.equal(r.choices[0].finish_reason, "length");
    assert.equal(r.usage.completion_tokens_details.reasoning_tokens, r.usage.completion_tokens, `cut after ${k} tokens`);
  }
  const whole = await nul.chat.completions.create({ model: "null", tools, max_tokens: 500, messages: [{ role: "user", content: "x" }] });
  const u = whole.usage;
  assert.ok(u.completion_tokens_details.reasoning_tokens > 6 && u.completion_tokens_details.reasoning_tokens < u.completion_tokens);
});

await check("text held for a stop string streams before the tool call that follows it", async () => {
  const stream = await nul.chat.completions.create({ model: "null", tools, max_tokens: 500, stream: true,
    stop: ["no such stop string"], messages: [{ role: "user", content: "Weather?" }] });
  const order = [];
  let content = "";
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta;
    if (!d) continue;
    if (d.content) content += d.content, order.push("content");
    if (d.tool_calls) order.push("tool");
  }
  assert.equal(content, "Let me check.");
  assert.ok(order.includes("tool"));
  assert.ok(order.lastIndexOf("content") < order.indexOf("tool"), order.join(","));
});

await check("responses: a three-turn chain with previous_response_id, usage and cached tokens", async () => {
  const r1 = await tiny.responses.create({ model: "tiny", input: "My name is Ada. " + "Remember it, please. ".repeat(100),
    instructions: "Be brief.", max_output_tokens: 4, reasoning: { effort: "none" } });
  assert.equal(r1.object, "response");
  assert.ok(["completed", "incomplete"].includes(r1.status));
  assert.ok(r1.output_text.length > 0);
  assert.ok(r1.usage.input_tokens > 256 && r1.usage.output_tokens >= 1);
  // instructions are not carried over by previous_response_id: a client sends them each turn
  const r2 = await tiny.responses.create({ model: "tiny", previous_response_id: r1.id, input: "What is my name?",
    instructions: "Be brief.", max_output_tokens: 4, reasoning: { effort: "none" } });
  assert.equal(r2.previous_response_id, r1.id);
  assert.equal(r1.reasoning.effort, "none");  // echoed as the string clients send, never a number
  assert.ok(r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens, "the chain was not carried");
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= 256, "the earlier turn's KV was not reused");
  const r3 = await tiny.responses.create({ model: "tiny", previous_response_id: r2.id, input: "Again?",
    instructions: "Be brief.", max_output_tokens: 4, reasoning: { effort: "low" } });
  assert.equal(r3.reasoning.effort, "low");
  assert.ok(r3.usage.input_tokens > r2.usage.input_tokens);
  const fetched = await tiny.responses.retrieve(r3.id);
  assert.equal(fetched.id, r3.id);
  await assert.rejects(tiny.responses.create({ model: "tiny", previous_response_id: "resp_nope", input: "x" }),
                       (e) => e.status === 400 && e.code === "previous_response_not_found");
});

async function metric(base, name) {
  const text = await (await fetch(base + "/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return Number(line.split(" ")[1]);
}

await check("responses: a chain runs in one engine session; turn N's cached tokens cover every earlier turn", async () => {
  const page = 64;  // the server's --page-tokens (default): the cache holds whole pages
  const extended0 = await metric(process.env.URL_TINY, "cedar_session_turns_extended_total");
  let prev = await tiny.responses.create({ model: "tiny", input: "Tell me a story. " + "Once more. ".repeat(120),
    max_output_tokens: 24, reasoning: { effort: "none" }, temperature: 0 });
  for (let turn = 2; turn <= 4; turn++) {
    const r = await tiny.responses.create({ model: "tiny", previous_response_id: prev.id, temperature: 0,
      input: `Turn ${turn}: <｜User｜> go on. ` + "And then? ".repeat(40), max_output_tokens: 24, reasoning: { effort: "none" } });
    // The engine holds the earlier prompts and completions; this turn's prompt extends them.
    const held = prev.usage.input_tokens + prev.usage.output_tokens;
    assert.ok(r.usage.input_tokens > held, `turn ${turn}: ${r.usage.input_tokens} prompt tokens, ${held} held`);
    const cached = r.usage.input_tokens_details.cached_tokens;
    assert.ok(cached >= Math.floor(held / page) * page && cached >= page,
              `turn ${turn}: ${cached} cached of ${held} held (pages of ${page})`);
    console.log(`      turn ${turn}: ${r.usage.input_tokens} prompt tokens, ${held} held from turns 1-${turn - 1}, ${cached} cached`);
    prev = r;
  }
  assert.equal(await metric(process.env.URL_TINY, "cedar_session_turns_extended_total") - extended0, 3,
               "a turn did not extend the chain's engine session");
});

await check("responses, streamed: created, item added, text deltas, completed with usage", async () => {
  const stream = await tiny.responses.create({ model: "tiny", input: "Hello", max_output_tokens: 6, stream: true,
    reasoning: { effort: "none" } });
  const types = [];
  let text = "", final = null;
  for await (const e of stream) {
    types.push(e.type);
    if (e.type === "response.output_text.delta") text += e.delta;
    if (e.type === "response.completed" || e.type === "response.incomplete") final = e.response;
  }
  assert.equal(types[0], "response.created");
  assert.ok(types.includes("response.output_item.added"));
  assert.ok(types.includes("response.output_text.done"));
  assert.ok(final && final.usage.output_tokens >= 1);
  assert.equal(final.output[0].content[0].text, text);
});

await check("responses with the parser path: reasoning item and function_call item, then the tool output", async () => {
  const rtools = [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters }];
  const r = await nul.responses.create({ model: "null", input: "Weather?", tools: rtools, max_output_tokens: 500 });
  const kinds = r.output.map((o) => o.type);
  assert.deepEqual(kinds, ["reasoning", "message", "function_call"]);
  // the tools come back as given, parameters included
  assert.deepEqual(r.tools, [{ type: "function", name: "get_weather", parameters: rtools[0].parameters }]);
  const call = r.output[2];
  assert.equal(call.name, "get_weather");
  assert.deepEqual(JSON.parse(call.arguments), { location: "Paris", days: 3 });
  const r2 = await nul.responses.create({ model: "null", previous_response_id: r.id, tools: rtools, max_output_tokens: 500,
    input: [{ type: "function_call_output", call_id: call.call_id, output: "sunny" }] });
  assert.ok(r2.usage.input_tokens > r.usage.input_tokens);
  // tools are per request, as instructions are: a chained turn that may call one names them again
  const r3 = await nul.responses.create({ model: "null", previous_response_id: r2.id, input: "And tomorrow?",
    tools: rtools, tool_choice: "required", max_output_tokens: 500 });
  assert.equal(r3.tool_choice, "required");
  // a tool_choice the tools cannot meet is a 400 naming tool_choice
  await assert.rejects(nul.responses.create({ model: "null", input: "x", tools: rtools, max_output_tokens: 4,
    tool_choice: { type: "function", name: "get_time" } }), (e) => e.status === 400 && e.param === "tool_choice");
  await assert.rejects(nul.chat.completions.create({ model: "null", max_tokens: 4, tool_choice: "required",
    messages: [{ role: "user", content: "x" }] }), (e) => e.status === 400 && e.param === "tool_choice");
});

await check("responses input_items: the items a response was made from, newest first, paged with after; gone once deleted", async () => {
  const rtools = [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters }];
  const r = await nul.responses.create({ model: "null", input: "Weather?", tools: rtools, max_output_tokens: 500 });
  const call = r.output.find((o) => o.type === "function_call");
  const r2 = await nul.responses.create({ model: "null", previous_response_id: r.id, tools: rtools,
    max_output_tokens: 500, input: [{ type: "function_call_output", call_id: call.call_id, output: "sunny" }] });
  // r2 was made from the question, r's reply (reasoning, text, call) and the call's output; not from r2's reply
  const asc = (await nul.responses.inputItems.list(r2.id, { order: "asc" })).data;
  assert.deepEqual(asc.map((i) => i.type), ["message", "reasoning", "message", "function_call", "function_call_output"]);
  assert.equal(asc[0].role, "user");
  assert.deepEqual(asc[0].content, [{ type: "input_text", text: "Weather?" }]);
  assert.equal(asc[1].content[0].text, r.output[0].content[0].text);
  assert.equal(asc[2].role, "assistant");
  assert.equal(asc[2].content[0].text, r.output[1].content[0].text);
  assert.equal(asc[3].call_id, call.call_id);
  assert.equal(asc[3].name, "get_weather");
  assert.deepEqual(JSON.parse(asc[3].arguments), JSON.parse(call.arguments));
  assert.equal(asc[4].call_id, call.call_id);
  assert.equal(asc[4].output, "sunny");
  assert.equal(new Set(asc.map((i) => i.id)).size, asc.length, "ids repeat");
  // the default order is newest first; the SDK's pages of one item walk them all through `after`
  const desc = await (await fetch(`${process.env.URL_NULL}/v1/responses/${r2.id}/input_items`)).json();
  assert.equal(desc.object, "list");
  assert.deepEqual(desc.data.map((i) => i.id), asc.map((i) => i.id).reverse());
  assert.deepEqual([desc.first_id, desc.last_id, desc.has_more], [asc[4].id, asc[0].id, false]);
  const page = await (await fetch(`${process.env.URL_NULL}/v1/responses/${r2.id}/input_items?limit=2&after=${asc[4].id}`)).json();
  assert.deepEqual(page.data.map((i) => i.id), [asc[3].id, asc[2].id]);
  assert.equal(page.has_more, true);
  const paged = [];
  for await (const item of nul.responses.inputItems.list(r2.id, { order: "asc", limit: 1 })) paged.push(item.id);
  assert.deepEqual(paged, asc.map((i) => i.id));
  // bad queries name their parameter; an unknown response is a 404
  await assert.rejects(nul.responses.inputItems.list(r2.id, { limit: 101 }), (e) => e.status === 400 && e.param === "limit");
  await assert.rejects(nul.responses.inputItems.list(r2.id, { after: "msg_nope" }),
    (e) => e.status === 400 && e.param === "after");
  await nul.responses.delete(r2.id);
  await assert.rejects(nul.responses.inputItems.list(r2.id), (e) => e.status === 404 && e.code === "response_not_found");
  await assert.rejects(nul.responses.retrieve(r2.id), (e) => e.status === 404);
  assert.equal((await nul.responses.retrieve(r.id)).id, r.id);  // the earlier turn stays
});

await check("tool_choice none keeps the tools in the prompt, so an agent's turn reuses its cached prefix", async () => {
  const messages = [{ role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function",
      function: { name: "get_weather", arguments: '{"location":"Paris"}' } }] },
    { role: "tool", tool_call_id: "c1", content: "sunny" }];
  const auto = await tiny.chat.completions.create({ model: "tiny", max_tokens: 2, messages, tools });
  const none = await tiny.chat.completions.create({ model: "tiny", max_tokens: 8, messages, tools, tool_choice: "none" });
  assert.equal(none.usage.prompt_tokens, auto.usage.prompt_tokens, "the prompt changed with tool_choice none");
  assert.ok(none.usage.prompt_tokens_details.cached_tokens > 0, "the turn found nothing cached");
  assert.equal(none.choices[0].message.tool_calls ?? undefined, undefined);
  assert.notEqual(none.choices[0].finish_reason, "tool_calls");
});

await check("tool_choice required or a named function: the reply opens a call of it (the tiny model's weights then wander)", async () => {
  const two = [...tools, { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {} } } }];
  const messages = [{ role: "user", content: "Weather in Paris?" }];
  // The random weights never finish a call, so the opened invoke comes back as content, cut by max_tokens.
  const opened = (text) => /^<｜DSML｜ invoke name="([^"]*)">\n/.exec(text)?.[1];
  two.push({ type: "function", function: { name: "none", parameters: { type: "object", properties: {} } } });
  const cases = [[{ type: "function", function: { name: "get_time" } }, ["get_time"]],
                 [{ type: "function", function: { name: "none" } }, ["none"]],  // a tool named like a mode
                 [{ type: "function", function: { name: "get_weather" } }, ["get_weather"]],
                 ["required", ["get_weather", "get_time", "none"]]];
  for (const [tool_choice, names] of cases) {
    for (const temperature of [0, 1]) {
      const r = await tiny.chat.completions.create({ model: "tiny", max_tokens: 16, temperature, seed: 5, tools: two,
        tool_choice, messages, ...chatMode });
      const text = r.choices[0].message.content;
      assert.ok(names.includes(opened(text)), `${JSON.stringify(tool_choice)}: ${text}`);
    }
  }
  const free = await tiny.chat.completions.create({ model: "tiny", max_tokens: 16, temperature: 0, tools: two,
    messages, ...chatMode });
  assert.equal(opened(free.choices[0].message.content ?? ""), undefined, "tool_choice auto forced a call");
  // Responses: the same, with reasoning off
  const rtools = two.map((t) => ({ type: "function", name: t.function.name, parameters: t.function.parameters }));
  const rr = await tiny.responses.create({ model: "tiny", input: "Weather?", tools: rtools, max_output_tokens: 16,
    reasoning: { effort: "none" }, tool_choice: { type: "function", name: "get_weather" } });
  assert.deepEqual(rr.tool_choice, { type: "function", name: "get_weather" });
  assert.equal(opened(rr.output_text), "get_weather", rr.output_text);
});

await check("parallel_tool_calls false: the reply ends with its first tool call", async () => {
  const calls = new OpenAI({ baseURL: process.env.URL_TWOCALLS + "/v1", apiKey: "unused" });
  const base = { model: "null", tools, max_tokens: 500, messages: [{ role: "user", content: "Paris and London?" }],
    ...chatMode };
  const cities = (tc) => tc.map((c) => JSON.parse(c.function.arguments).location);
  const both = await calls.chat.completions.create(base);
  assert.deepEqual(cities(both.choices[0].message.tool_calls), ["Paris", "London"]);
  const one = await calls.chat.completions.create({ ...base, parallel_tool_calls: false });
  assert.deepEqual(cities(one.choices[0].message.tool_calls), ["Paris"]);
  assert.equal(one.choices[0].finish_reason, "tool_calls");
  const stream = await calls.chat.completions.create({ ...base, parallel_tool_calls: false, stream: true });
  const seen = new Map();
  let finish = null;
  for await (const c of stream) {
    for (const t of c.choices[0]?.delta?.tool_calls ?? [])
      seen.set(t.index, (seen.get(t.index) ?? "") + (t.function?.arguments ?? ""));
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.deepEqual([...seen.keys()], [0]);
  assert.equal(JSON.parse(seen.get(0)).location, "Paris");
  assert.equal(finish, "tool_calls");
  const rtools = [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters }];
  const rboth = await calls.responses.create({ model: "null", input: "Paris and London?", tools: rtools,
    max_output_tokens: 500, reasoning: { effort: "none" } });
  assert.equal(rboth.parallel_tool_calls, true);
  assert.equal(rboth.output.filter((o) => o.type === "function_call").length, 2);
  const rone = await calls.responses.create({ model: "null", input: "Paris and London?", tools: rtools,
    max_output_tokens: 500, reasoning: { effort: "none" }, parallel_tool_calls: false });
  assert.equal(rone.parallel_tool_calls, false);
  assert.equal(rone.status, "completed");
  assert.deepEqual(rone.output.filter((o) => o.type === "function_call").map((o) => JSON.parse(o.arguments).location),
    ["Paris"]);
  await assert.rejects(calls.chat.completions.create({ ...base, parallel_tool_calls: "no" }),
    (e) => e.status === 400 && e.param === "parallel_tool_calls");
});

// Structured output: the tiny model's weights are random, so only the grammar makes its text JSON.
const verdict = { type: "object", additionalProperties: false, required: ["ok", "level", "why", "tags"],
  properties: { ok: { type: "boolean" }, level: { enum: ["low", "high"] }, why: { type: "string", maxLength: 24 },
                tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 2 } } };
function checkVerdict(text) {
  const v = JSON.parse(text);
  assert.deepEqual(Object.keys(v).sort(), ["level", "ok", "tags", "why"]);
  assert.equal(typeof v.ok, "boolean");
  assert.ok(["low", "high"].includes(v.level));
  assert.ok(typeof v.why === "string" && [...v.why].length <= 24);
  assert.ok(Array.isArray(v.tags) && v.tags.length <= 2);
}

await check("response_format json_schema: random weights still answer with JSON the schema admits", async () => {
  for (const seed of [1, 2, 3]) {
    const r = await tiny.chat.completions.create({ model: "tiny", max_tokens: 300, temperature: 1, seed, ...chatMode,
      messages: [{ role: "user", content: "Judge this." }],
      response_format: { type: "json_schema", json_schema: { name: "verdict", schema: verdict, strict: true } } });
    assert.equal(r.choices[0].finish_reason, "stop");
    checkVerdict(r.choices[0].message.content);
  }
});

await check("response_format json_schema streamed, and json_object", async () => {
  const stream = await tiny.chat.completions.create({ model: "tiny", max_tokens: 300, temperature: 0, stream: true,
    messages: [{ role: "user", content: "Judge that." }], ...chatMode,
    response_format: { type: "json_schema", json_schema: { name: "verdict", schema: verdict } } });
  let text = "", finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, "stop");
  checkVerdict(text);
  const o = await tiny.chat.completions.create({ model: "tiny", max_tokens: 120, temperature: 0, ...chatMode,
    messages: [{ role: "user", content: "Any object." }], response_format: { type: "json_object" } });
  const text2 = o.choices[0].message.content;
  assert.ok(text2.startsWith("{"), text2);
  if (o.choices[0].finish_reason === "stop") assert.equal(typeof JSON.parse(text2), "object");
});

await check("Responses text.format json_schema: the output text parses and the format is echoed", async () => {
  const format = { type: "json_schema", name: "verdict", schema: verdict, strict: true };
  const r = await tiny.responses.create({ model: "tiny", input: "Judge.", max_output_tokens: 300,
    reasoning: { effort: "none" }, text: { format } });
  assert.equal(r.status, "completed");
  checkVerdict(r.output_text);
  assert.deepEqual(r.text.format, format);
});

await check("a schema cedar cannot enforce is refused with 400, naming the keyword", async () => {
  await assert.rejects(tiny.chat.completions.create({ model: "tiny", max_tokens: 4, messages: [{ role: "user", content: "x" }],
    response_format: { type: "json_schema", json_schema: { name: "e", schema: { type: "string", pattern: "^a+$" } } } }),
  (e) => e.status === 400 && e.code === "unsupported_schema" && /'pattern'/.test(e.message) &&
         e.param === "response_format.json_schema.schema");
  await assert.rejects(nul.chat.completions.create({ model: "null", max_tokens: 4, messages: [{ role: "user", content: "x" }],
    response_format: { type: "json_object" } }), (e) => e.status === 400 && /null engine/.test(e.message));
});

await check("POST /admin/layout switches TP -> DEP while a stream runs; the stream loses nothing", async () => {
  const admin = (layout) => fetch(process.env.URL_TINY + "/admin/layout", { method: "POST",
    headers: { Authorization: "Bearer adm" }, body: JSON.stringify({ layout }) });
  const stream = await tiny.chat.completions.create({ model: "tiny", max_tokens: 24, temperature: 0, stream: true,
    messages: [{ role: "user", content: "Go on" }], ...chatMode });
  let tokens = 0, finish = null, switched = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (c?.delta?.content) {
      tokens++;
      if (tokens === 2) switched = admin("dep2").then(async (r) => ({ status: r.status, body: await r.json() }));
    }
    if (c?.finish_reason) finish = c.finish_reason;
  }
  const s = await switched;
  assert.equal(s.status, 200, JSON.stringify(s.body));
  assert.equal(s.body.layout, "dep2");
  assert.equal(finish, "length");
  const metrics = await (await fetch(process.env.URL_TINY + "/metrics")).text();
  assert.match(metrics, /cedar_topology_info\{topology="dep2",state="serving"/);
  // back to the layout the server started in (CEDAR_LAYOUT_BACK: tp2 for two GPUs, whose models are
  // placed for two devices)
  assert.equal((await admin(process.env.CEDAR_LAYOUT_BACK || "tp1")).status, 200);
  const bad = await admin("tp3x");
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, "layout");
});

await check("the context window: a prompt past it is a 400 naming its field; a max_tokens past it ends with length", async () => {
  // a server whose KV budget makes the window small (max_model_len)
  const win = new OpenAI({ baseURL: process.env.URL_WINDOW + "/v1", apiKey: "unused", maxRetries: 0 });
  const window = (await win.models.list()).data[0].max_model_len;
  assert.ok(window > 16 && window < 4096, `max_model_len ${window}`);
  const tooLong = (e, param) => e.status === 400 && e.code === "context_length_exceeded" && e.param === param &&
    /prompt/.test(e.message);
  await assert.rejects(win.completions.create({ model: "tiny", prompt: Array(window + 1).fill(5), max_tokens: 4 }),
    (e) => tooLong(e, "prompt"));
  await assert.rejects(win.chat.completions.create({ model: "tiny", max_tokens: 4, ...chatMode,
    messages: [{ role: "user", content: "word ".repeat(2 * window) }] }), (e) => tooLong(e, "messages"));
  await assert.rejects(win.responses.create({ model: "tiny", input: "word ".repeat(2 * window), max_output_tokens: 4 }),
    (e) => tooLong(e, "input"));
  // far past the window: taken, and cut where prompt and answer fill it
  const r = await win.completions.create({ model: "tiny", prompt: Array(window - 3).fill(5), max_tokens: 100000,
    temperature: 0 });
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 3);
  assert.equal(r.usage.total_tokens, window);
  // nothing held by the refused or cut requests: a whole-window request still fits
  const again = await win.completions.create({ model: "tiny", prompt: Array(window - 1).fill(6), max_tokens: 4 });
  assert.equal(again.usage.completion_tokens, 1);
});

await check("Responses truncation auto: a chain past the context window drops its oldest turns and goes on", async () => {
  const win = new OpenAI({ baseURL: process.env.URL_WINDOW + "/v1", apiKey: "unused", maxRetries: 0 });
  const window = (await win.models.list()).data[0].max_model_len;
  const input = (i) => `turn ${i}: ` + "word ".repeat(Math.floor(window / 4));
  const chain = async (truncation) => {
    let prev = null;
    const seen = [];
    for (let i = 0; i < 7; i++) {
      const r = await win.responses.create({ model: "tiny", input: input(i), max_output_tokens: 4, temperature: 0,
        reasoning: { effort: "none" }, previous_response_id: prev, ...(truncation ? { truncation } : {}) });
      seen.push(r);
      prev = r.id;
    }
    return seen;
  };
  const turns = await chain("auto");
  assert.ok(turns.every((r) => r.truncation === "auto" && r.usage.input_tokens <= window - 4),
            turns.map((r) => r.usage.input_tokens).join(","));
  assert.ok(turns[6].usage.input_tokens < turns[2].usage.input_tokens + window / 4, "nothing was dropped");
  console.log(`      window ${window}; input tokens by turn: ${turns.map((r) => r.usage.input_tokens).join(", ")}`);
  // the default, disabled: the same chain is refused once it outgrows the window
  await assert.rejects(chain(undefined), (e) => e.status === 400 && e.code === "context_length_exceeded");
  await assert.rejects(win.responses.create({ model: "tiny", input: "x", truncation: "sometimes" }),
    (e) => e.status === 400 && e.param === "truncation");
});

console.log(`serve_openai: ${passed} checks passed${skipped ? `, ${skipped} skipped` : ""}`);
