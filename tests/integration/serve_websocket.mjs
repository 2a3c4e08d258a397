// The `ws` npm client against the Responses WebSocket mode (see serve_websocket.sh).
import assert from "node:assert/strict";
import { createRequire } from "node:module";
const require = createRequire(process.env.CEDAR_ROOT + "/tools/node/package.json");
const WebSocket = require("ws");

const wsUrl = (base) => base.replace("http://", "ws://") + "/v1/responses";
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

/// A socket with a queue of received events and a way to wait for the next matching one.
function open(url, headers = {}) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    const events = [], waiters = [];
    ws.on("message", (data) => {
      const e = JSON.parse(data.toString());
      events.push(e);
      for (const w of waiters.splice(0)) w();
    });
    ws.next = async (pred, timeoutMs = 60000) => {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const i = events.findIndex(pred);
        if (i >= 0) return events.splice(0, i + 1).pop();
        if (Date.now() > deadline) throw new Error("timed out waiting for an event");
        await new Promise((r) => { waiters.push(r); setTimeout(r, 200); });
      }
    };
    ws.drainEvents = () => events.splice(0);
    ws.on("open", () => resolve(ws));
    ws.on("error", reject);
  });
}
const isEnd = (e) => ["response.completed", "response.incomplete", "response.cancelled", "response.failed"].includes(e.type);

async function metric(base, name) {
  const text = await (await fetch(base + "/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return Number(line.split(" ")[1]);
}
async function until(fn, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error("timed out: " + what);
    await new Promise((r) => setTimeout(r, 20));
  }
}

await check("an upgrade without the API key is refused", async () => {
  await assert.rejects(open(wsUrl(process.env.URL_TINY)), /401/);
});

await check("20 turns on one socket: each sends only the new input and previous_response_id", async () => {
  const ws = await open(wsUrl(process.env.URL_TINY), { Authorization: "Bearer sk-ws" });
  let prevId = null, prevInput = 0;
  for (let turn = 1; turn <= 20; turn++) {
    // instructions are not carried over by previous_response_id: a client sends them each turn
    const create = { type: "response.create", model: "tiny", max_output_tokens: 3, reasoning: { effort: "none" },
                     instructions: "You are a patient assistant. ".repeat(50),
                     input: [{ role: "user", content: `Turn ${turn}: tell me more.` }] };
    if (prevId) create.previous_response_id = prevId;
    ws.send(JSON.stringify(create));
    const created = await ws.next((e) => e.type === "response.created");
    const done = await ws.next(isEnd);
    assert.equal(done.response.id, created.response.id);
    assert.ok(["completed", "incomplete"].includes(done.response.status));
    assert.equal(done.response.previous_response_id, prevId);
    const u = done.response.usage;
    assert.ok(u.input_tokens > prevInput, `turn ${turn}: input ${u.input_tokens} did not grow past ${prevInput}`);
    if (turn > 1) assert.ok(u.input_tokens_details.cached_tokens >= 256, `turn ${turn}: nothing cached`);
    prevId = done.response.id;
    prevInput = u.input_tokens;
  }
  ws.close();
});

await check("a conversation survives a reconnect: previous_response_id continues its engine session", async () => {
  const page = 64;  // the server's --page-tokens (default)
  const extended0 = await metric(process.env.URL_TINY, "cedar_session_turns_extended_total");
  let ws = await open(wsUrl(process.env.URL_TINY), { Authorization: "Bearer sk-ws" });
  ws.send(JSON.stringify({ type: "response.create", model: "tiny", max_output_tokens: 8, reasoning: { effort: "none" },
                           temperature: 0, input: "Remember the number 7. ".repeat(60) }));
  const first = (await ws.next(isEnd)).response;
  ws.close();
  ws = await open(wsUrl(process.env.URL_TINY), { Authorization: "Bearer sk-ws" });
  ws.send(JSON.stringify({ type: "response.create", model: "tiny", max_output_tokens: 8, reasoning: { effort: "none" },
                           temperature: 0, previous_response_id: first.id, input: "Which number?" }));
  const second = (await ws.next(isEnd)).response;
  assert.equal(second.previous_response_id, first.id);
  const held = first.usage.input_tokens + first.usage.output_tokens;
  assert.ok(second.usage.input_tokens > held);
  assert.ok(second.usage.input_tokens_details.cached_tokens >= Math.floor(held / page) * page);
  assert.equal(await metric(process.env.URL_TINY, "cedar_session_turns_extended_total") - extended0, 1,
               "the reconnected turn did not extend the stored chain's session");
  ws.close();
});

await check("response.cancel stops a response mid-stream; the socket serves the next turn", async () => {
  const ws = await open(wsUrl(process.env.URL_NULL));
  ws.send(JSON.stringify({ type: "response.create", input: "go on forever", max_output_tokens: 100000,
                           reasoning: { effort: "none" } }));
  for (let i = 0; i < 5; i++) await ws.next((e) => e.type === "response.output_text.delta");
  ws.send(JSON.stringify({ type: "response.create", input: "a second one" }));
  const busy = await ws.next((e) => e.type === "error");
  assert.equal(busy.error.code, "response_in_progress");
  ws.send(JSON.stringify({ type: "response.cancel" }));
  const end = await ws.next(isEnd, 5000);
  assert.equal(end.type, "response.cancelled");
  assert.equal(end.response.status, "cancelled");
  assert.ok(end.response.usage.output_tokens < 100000);
  await until(async () => (await metric(process.env.URL_NULL, "cedar_requests_running")) === 0, 2000, "engine request gone");
  ws.send(JSON.stringify({ type: "response.create", input: "short", max_output_tokens: 3, previous_response_id: null }));
  const next = await ws.next(isEnd);
  assert.equal(next.response.status, "incomplete");
  assert.equal(next.response.usage.output_tokens, 3);
  // with nothing in progress a cancel is answered with an error, and the socket goes on
  ws.send(JSON.stringify({ type: "response.cancel" }));
  const idle = await ws.next((e) => e.type === "error");
  assert.equal(idle.error.code, "response_cancel_not_active");
  ws.send(JSON.stringify({ type: "response.create", input: "again", max_output_tokens: 2 }));
  assert.equal((await ws.next(isEnd)).response.usage.output_tokens, 2);
  ws.close();
});

await check("a client that drops its socket mid-response has its request cancelled at once", async () => {
  const ws = await open(wsUrl(process.env.URL_NULL));
  ws.send(JSON.stringify({ type: "response.create", input: "long", max_output_tokens: 100000 }));
  await ws.next((e) => e.type === "response.output_text.delta" || e.type === "response.reasoning_text.delta");
  assert.equal(await metric(process.env.URL_NULL, "cedar_requests_running"), 1);
  const t0 = Date.now();
  ws.terminate();
  await until(async () => (await metric(process.env.URL_NULL, "cedar_requests_running")) === 0, 2000, "request cancelled");
  console.log(`      freed ${Date.now() - t0} ms after the socket dropped`);
});

await check("with the tiny model, a dropped socket frees the request's KV pages at once", async () => {
  const ws = await open(wsUrl(process.env.URL_TINY), { Authorization: "Bearer sk-ws" });
  // greedy: a sampled first token of the random model can be its end token, and then nothing streams
  ws.send(JSON.stringify({ type: "response.create", max_output_tokens: 5000, reasoning: { effort: "none" },
                           temperature: 0, input: "Tell me a very long story. ".repeat(30),
                           previous_response_id: null }));
  await ws.next((e) => e.type === "response.output_text.delta");
  assert.ok((await metric(process.env.URL_TINY, "cedar_kv_pages_used")) > 0, "no pages in use while generating");
  const t0 = Date.now();
  ws.terminate();
  await until(async () => (await metric(process.env.URL_TINY, "cedar_requests_running")) === 0 &&
                          (await metric(process.env.URL_TINY, "cedar_kv_pages_used")) === 0, 5000, "pages freed");
  console.log(`      running 0 and KV pages used 0 ${Date.now() - t0} ms after the socket dropped`);
});

await check("a turn with text.format streams JSON its schema admits; the next turn on the socket is free text", async () => {
  const ws = await open(wsUrl(process.env.URL_TINY), { Authorization: "Bearer sk-ws" });
  const schema = { type: "object", additionalProperties: false, required: ["done", "step"],
                   properties: { done: { type: "boolean" }, step: { enum: ["plan", "act", "check"] } } };
  ws.send(JSON.stringify({ type: "response.create", model: "tiny", max_output_tokens: 200, reasoning: { effort: "none" },
                           input: "Where are you?", text: { format: { type: "json_schema", name: "state", schema } } }));
  let text = "";
  for (;;) {
    const e = await ws.next((x) => x.type === "response.output_text.delta" || isEnd(x));
    if (isEnd(e)) {
      assert.equal(e.type, "response.completed");
      assert.equal(e.response.text.format.type, "json_schema");
      const first = e.response;
      const v = JSON.parse(text);
      assert.equal(typeof v.done, "boolean");
      assert.ok(["plan", "act", "check"].includes(v.step), text);
      ws.send(JSON.stringify({ type: "response.create", model: "tiny", max_output_tokens: 4, reasoning: { effort: "none" },
                               previous_response_id: first.id, input: "And now?" }));
      const next = (await ws.next(isEnd)).response;
      assert.ok(["completed", "incomplete"].includes(next.status), next.status);  // 4 tokens: likely cut
      assert.equal(next.text.format.type, "text");
      break;
    }
    text += e.delta;
  }
  ws.close();
});

await check("a finished turn is not an active generation while its socket stays open", async () => {
  const base = process.env.URL_NULL;
  const sockets = [];
  for (let i = 0; i < 3; i++) {
    const ws = await open(wsUrl(base));
    ws.send(JSON.stringify({ type: "response.create", input: "hi", max_output_tokens: 2 }));
    assert.ok(isEnd(await ws.next(isEnd)));
    sockets.push(ws);
  }
  assert.ok(await metric(base, "cedar_open_websockets") >= 3);
  await until(async () => (await metric(base, "cedar_active_generations")) === 0, 2000,
              "finished turns on open sockets counted as active");
  for (const ws of sockets) ws.close();
});

await check("an HTTP Responses stream dropped mid-answer keeps no engine session; a finished one keeps its chain's", async () => {
  const base = process.env.URL_NULL;
  const sessions0 = await metric(base, "cedar_sessions_open");
  const done = await (await fetch(base + "/v1/responses", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ input: "short", max_output_tokens: 2 }) })).json();
  assert.equal(done.status, "incomplete");
  assert.equal(await metric(base, "cedar_sessions_open"), sessions0 + 1, "a stored turn keeps its session");
  for (let i = 0; i < 3; i++) {
    const abort = new AbortController();
    const r = await fetch(base + "/v1/responses", { method: "POST", signal: abort.signal,
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ input: "long", max_output_tokens: 100000, stream: true, previous_response_id: i ? undefined : done.id }) });
    const reader = r.body.getReader();
    let seen = "";
    while (!seen.includes("_text.delta")) {  // the first reasoning or text delta
      const { done, value } = await reader.read();
      assert.ok(!done, "the stream ended before its first delta: " + seen);
      seen += new TextDecoder().decode(value);
    }
    abort.abort();
  }
  await until(async () => (await metric(base, "cedar_requests_running")) === 0, 2000, "streams cancelled");
  await until(async () => (await metric(base, "cedar_sessions_open")) === sessions0 + 1, 2000,
              "dropped streams' sessions closed, the stored chain's kept");
});

await check("store:false turns chain on their socket; a turn without previous_response_id starts afresh; the socket holds one engine session", async () => {
  const base = process.env.URL_NULL;
  const sessions0 = await metric(base, "cedar_sessions_open");
  const ws = await open(wsUrl(base));
  const turn = async (fields) => {
    ws.send(JSON.stringify({ type: "response.create", max_output_tokens: 2, store: false, ...fields }));
    return (await ws.next(isEnd)).response;
  };
  const first = await turn({ input: "one two three four five six seven eight" });
  const second = await turn({ input: "and more", previous_response_id: first.id });
  assert.equal(second.status, "incomplete");
  assert.equal(second.previous_response_id, first.id);
  assert.ok(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, "the second turn lost the first");
  const fresh = await turn({ input: "and more" });
  assert.equal(fresh.previous_response_id, null);
  assert.ok(fresh.usage.input_tokens < second.usage.input_tokens, "a turn without previous_response_id went on from the last");
  for (let i = 0; i < 8; i++) await turn({ input: `fresh ${i}` });
  ws.send(JSON.stringify({ type: "response.create", input: "long", max_output_tokens: 100000, store: false }));
  await ws.next((e) => e.type.endsWith("_text.delta"));
  ws.send(JSON.stringify({ type: "response.cancel" }));
  assert.equal((await ws.next(isEnd)).response.status, "cancelled");
  // a store:false turn of another socket's chain is not found
  const other = await open(wsUrl(base));
  other.send(JSON.stringify({ type: "response.create", input: "x", previous_response_id: second.id }));
  const err = await other.next((e) => e.type === "error");
  assert.equal(err.status, 400);
  assert.equal(err.error.code, "previous_response_not_found");
  other.close();
  assert.equal(await metric(base, "cedar_sessions_open"), sessions0 + 1, "turns that cannot be continued kept their sessions");
  ws.close();
  await until(async () => (await metric(base, "cedar_sessions_open")) === sessions0, 2000, "the socket's session closed");
});

await check("previous_response_id carries neither instructions nor tools over", async () => {
  const base = process.env.URL_NULL;
  const post = async (body) => (await fetch(base + "/v1/responses", { method: "POST",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })).json();
  const tool = { type: "function", name: "look", parameters: { type: "object", properties: {} } };
  const first = await post({ input: "hi", max_output_tokens: 2, instructions: "Talk like a pirate.", tools: [tool] });
  assert.equal(first.instructions, "Talk like a pirate.");
  assert.equal(first.tools.length, 1);
  const next = await post({ input: "again", max_output_tokens: 2, previous_response_id: first.id, tools: [] });
  assert.equal(next.previous_response_id, first.id);
  assert.equal(next.instructions, null);
  assert.equal(next.tools.length, 0);
  assert.ok(next.usage.input_tokens > 0);
});

await check("Responses echo metadata and a named tool_choice as given; an item cut by max_output_tokens is incomplete", async () => {
  const base = process.env.URL_NULL;
  const post = async (body) => fetch(base + "/v1/responses", { method: "POST",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const tool = { type: "function", name: "look", parameters: { type: "object", properties: {} } };
  const r = await (await post({ input: "hi", max_output_tokens: 2, reasoning: { effort: "none" }, tools: [tool],
    tool_choice: { type: "function", name: "look" }, metadata: { user: "u-7", run: "42" } })).json();
  assert.deepEqual(r.tool_choice, { type: "function", name: "look" });
  assert.deepEqual(r.metadata, { user: "u-7", run: "42" });
  const cut = await (await post({ input: "hi", max_output_tokens: 2, reasoning: { effort: "none" } })).json();
  assert.equal(cut.status, "incomplete");
  assert.equal(cut.output.at(-1).type, "message");
  assert.equal(cut.output.at(-1).status, "incomplete");
  const bad = await post({ input: "hi", metadata: { n: 1 } });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, "metadata.n");
});

await check("a malformed event gets an error event and the socket stays usable", async () => {
  const ws = await open(wsUrl(process.env.URL_NULL));
  ws.send("{not json");
  const err = await ws.next((e) => e.type === "error");
  assert.equal(err.status, 400);
  ws.send(JSON.stringify({ type: "response.create", input: "ok", max_output_tokens: 2 }));
  assert.ok(isEnd(await ws.next(isEnd)));
  ws.close();
});

console.log(`serve_websocket: ${passed} checks passed${skipped ? `, ${skipped} skipped` : ""}`);
