// The bad-input table (see serve_bad_input.sh). Every row runs while a healthy client streams.
import assert from "node:assert/strict";
import net from "node:net";
import crypto from "node:crypto";

const MAIN = process.env.URL_MAIN, FLOOD = process.env.URL_FLOOD, BUSY = process.env.URL_BUSY;
const KEY = { Authorization: "Bearer sk-bad", "Content-Type": "application/json" };
const hostPort = (url) => { const u = new URL(url); return { host: u.hostname, port: Number(u.port) }; };
let passed = 0;
async function row(name, fn) {
  const t0 = Date.now();
  await fn();
  passed++;
  console.log(`  ok  ${name} (${Date.now() - t0} ms)`);
}
async function post(path, body, headers = KEY, base = MAIN) {
  const r = await fetch(base + path, { method: "POST", headers, body });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: r.status, json, text };
}
function expectError(r, status, code, param) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json && r.json.error, "not an OpenAI error object: " + r.text);
  const e = r.json.error;
  for (const k of ["message", "type", "param", "code"]) assert.ok(k in e, `error lacks ${k}`);
  if (code) assert.equal(e.code, code);
  if (param !== undefined) assert.equal(e.param, param);
}
async function metric(base, name) {
  const text = await (await fetch(base + "/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return Number(line.split(" ")[1]);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const chat = (extra = {}) => JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 4, ...extra });

// The healthy client: streams short chats from both servers until told to stop.
const healthy = { ok: 0, failed: [], stop: false };
const healthyLoop = (async () => {
  while (!healthy.stop) {
    for (const [base, headers] of [[MAIN, KEY], [FLOOD, { "Content-Type": "application/json" }]]) {
      try {
        const r = await fetch(base + "/v1/chat/completions", { method: "POST", headers,
          body: chat({ stream: true, max_tokens: 5 }), signal: AbortSignal.timeout(15000) });
        const text = await r.text();
        if (r.status !== 200 || !text.endsWith("data: [DONE]\n\n")) healthy.failed.push(`${r.status} ${text.slice(0, 80)}`);
        else healthy.ok++;
      } catch (e) { healthy.failed.push(String(e)); }
    }
    await sleep(20);
  }
})();

await row("malformed JSON -> 400 invalid_json", async () => {
  expectError(await post("/v1/chat/completions", '{"messages": [ {"role": "user", '), 400, "invalid_json");
  expectError(await post("/v1/responses", "[1,2,"), 400, "invalid_json");
  expectError(await post("/v1/chat/completions", "[]"), 400, "invalid_json");
});

await row("wrong field types -> 400 naming the field", async () => {
  const cases = [
    [{ messages: "hello" }, "messages"],
    [{ messages: [{ role: "user", content: "x" }], temperature: "hot" }, "temperature"],
    [{ messages: [{ role: "user", content: "x" }], temperature: 7 }, "temperature"],
    [{ messages: [{ role: "user", content: "x" }], max_tokens: -1 }, "max_tokens"],
    [{ messages: [{ role: "user", content: "x" }], max_tokens: 2.5 }, "max_tokens"],
    [{ messages: [{ role: "user", content: "x" }], stream: "yes" }, "stream"],
    [{ messages: [{ role: "user", content: "x" }], n: 3 }, "n"],
    [{ messages: [{ role: "user", content: "x" }], stop: [1, 2] }, "stop"],
    [{ messages: [{ role: "user", content: "x" }], tools: {} }, "tools"],
    [{ messages: [{ role: "wizard", content: "x" }] }, "messages.role"],
    [{ messages: [{ role: "user", content: 42 }] }, "messages.content"],
    [{ messages: [{ role: "user", content: "x" }], reasoning_effort: "extreme" }, "reasoning_effort"],
  ];
  for (const [body, param] of cases) expectError(await post("/v1/chat/completions", JSON.stringify(body)), 400, undefined, param);
  expectError(await post("/v1/completions", JSON.stringify({ prompt: { a: 1 } })), 400, undefined, "prompt");
  expectError(await post("/v1/responses", JSON.stringify({ input: 5 })), 400, undefined, "input");
});

await row("unknown fields are ignored -> 200", async () => {
  const r = await post("/v1/chat/completions", chat({ frobnicate: { deep: [1, 2] }, service_tier: "auto",
    messages: [{ role: "user", content: "x", extra_field: true }] }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.object, "chat.completion");
});

await row("empty messages -> 400 empty_messages; missing prompt/input -> 400", async () => {
  expectError(await post("/v1/chat/completions", JSON.stringify({ messages: [] })), 400, "empty_messages", "messages");
  expectError(await post("/v1/chat/completions", JSON.stringify({})), 400, "missing_required_parameter", "messages");
  expectError(await post("/v1/completions", JSON.stringify({ prompt: "" })), 400, undefined, "prompt");
  expectError(await post("/v1/completions", JSON.stringify({ prompt: [5, 200000] })), 400, undefined, "prompt");
  expectError(await post("/v1/completions", JSON.stringify({ prompt: [5, 129264, 6] })), 400, undefined, "prompt");
  // a raw prompt's control-token text is those tokens: the image token's name is the image
  // token, refused as its id is; other control tokens are taken
  expectError(await post("/v1/completions", JSON.stringify({ prompt: "a <｜deepseek_image｜> b" })), 400, undefined, "prompt");
  assert.equal((await post("/v1/completions", JSON.stringify({ prompt: "<｜User｜>hi<｜Assistant｜></think>", max_tokens: 2 }))).status, 200);
  expectError(await post("/v1/responses", JSON.stringify({ model: "null" })), 400, undefined, "input");
});

await row("invalid UTF-8 -> 400 invalid_utf8", async () => {
  const body = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"bad '), Buffer.from([0xff, 0xfe, 0xc3]),
                              Buffer.from('"}]}')]);
  expectError(await post("/v1/chat/completions", body), 400, "invalid_utf8");
});

await row("a 100 MB body -> 413 before the body is read", async () => {
  const { host, port } = hostPort(MAIN);
  const answer = await new Promise((resolve, reject) => {
    const s = net.connect(port, host);
    let got = "";
    s.on("data", (d) => { got += d.toString(); if (got.includes("\r\n\r\n") && got.includes("}}")) { s.destroy(); resolve(got); } });
    s.on("error", () => resolve(got));
    s.on("close", () => resolve(got));
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-bad\r\n` +
            `Content-Type: application/json\r\nContent-Length: ${100 * 1024 * 1024}\r\n\r\n`);
    const chunk = Buffer.alloc(1 << 20, 0x20);
    let sent = 0;
    const pump = () => { while (sent < 100 && !s.destroyed) { sent++; if (!s.write(chunk)) { s.once("drain", pump); return; } } };
    pump();
    setTimeout(() => reject(new Error("no answer to a 100 MB body")), 20000);
  });
  assert.match(answer, /^HTTP\/1\.1 413 /);
  assert.match(answer, /"code":"body_too_large"/);
});

await row("headers over the limit -> 431", async () => {
  const r = await fetch(MAIN + "/v1/models", { headers: { ...KEY, "X-Big": "a".repeat(64 * 1024) } }).catch((e) => e);
  assert.equal(r.status, 431);
});

await row("unknown model -> 404; unknown previous_response_id -> 400; bad key -> 401", async () => {
  expectError(await post("/v1/chat/completions", chat({ model: "gpt-7" })), 404, "model_not_found", "model");
  expectError(await post("/v1/responses", JSON.stringify({ input: "x", previous_response_id: "resp_missing" })), 400,
              "previous_response_not_found", "previous_response_id");
  expectError(await post("/v1/chat/completions", chat(), { "Content-Type": "application/json" }), 401, "invalid_api_key");
  expectError(await post("/v1/chat/completions", chat(), { Authorization: "Bearer nope" }), 401, "invalid_api_key");
});

await row("every refused /v1/ request counts once in the total and once as failed", async () => {
  const total0 = await metric(BUSY, "cedar_http_requests_total");
  const failed0 = await metric(BUSY, "cedar_http_requests_failed_total");
  const json = { "Content-Type": "application/json" };
  expectError(await post("/v1/chat/completions", chat({ model: "gpt-7" }), json, BUSY), 404, "model_not_found");
  expectError(await post("/v1/nothing", "{}", json, BUSY), 404, "unknown_url");
  expectError(await post("/v1/models", "{}", json, BUSY), 405, "method_not_allowed");
  const del = await fetch(BUSY + "/v1/responses/resp_missing", { method: "DELETE" });
  assert.equal(del.status, 404);
  await del.text();
  assert.equal(await metric(BUSY, "cedar_http_requests_total") - total0, 4);
  assert.equal(await metric(BUSY, "cedar_http_requests_failed_total") - failed0, 4);
});

await row("more generations than --max-active -> 429 overloaded", async () => {
  const streams = [];
  for (let i = 0; i < 12; i++)
    streams.push(fetch(BUSY + "/v1/chat/completions", { method: "POST", headers: { "Content-Type": "application/json" },
      body: chat({ stream: true, max_tokens: 3000 }) }));
  const answers = await Promise.all(streams);
  const codes = answers.map((r) => r.status);
  assert.ok(codes.includes(429), "no 429 among " + codes.join(","));
  const refused = answers.find((r) => r.status === 429);
  assert.equal((await refused.json()).error.code, "overloaded");
  for (const r of answers) if (r.status === 200) await r.body.cancel();  // disconnect: cancels them
  for (let i = 0; i < 100 && (await metric(BUSY, "cedar_requests_running")) > 0; i++) await sleep(20);
  assert.equal(await metric(BUSY, "cedar_requests_running"), 0, "disconnected streams were not cancelled");
});

await row("an engine failure mid-answer: a 500 error object, or an error event before [DONE]; nothing stays running", async () => {
  const FAILING = process.env.URL_FAILING, json = { "Content-Type": "application/json" };
  const failed0 = await metric(FAILING, "cedar_http_requests_failed_total");
  for (const path of ["/v1/chat/completions", "/v1/completions"]) {
    const body = path.endsWith("chat/completions") ? chat({ max_tokens: 50 }) : JSON.stringify({ prompt: "hi", max_tokens: 50 });
    const r = await post(path, body, json, FAILING);
    expectError(r, 500, "engine_error");
    assert.equal(r.json.error.type, "server_error");
    assert.match(r.json.error.message, /failed after 3 tokens/);
    const s = await post(path, JSON.stringify({ ...JSON.parse(body), stream: true }), json, FAILING);
    assert.equal(s.status, 200);
    const events = s.text.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => e.slice(6));
    assert.equal(events.at(-1), "[DONE]");
    const last = JSON.parse(events.at(-2));
    assert.equal(last.error?.code, "engine_error", s.text);
    assert.ok(events.slice(0, -2).every((e) => !JSON.parse(e).error), "the error is the stream's last event");
  }
  // Responses report the failure in their own shape: a failed response
  const resp = await post("/v1/responses", JSON.stringify({ input: "hi", max_output_tokens: 50 }), json, FAILING);
  assert.equal(resp.status, 200);
  assert.equal(resp.json.status, "failed");
  assert.equal(await metric(FAILING, "cedar_http_requests_failed_total") - failed0, 5);
  assert.equal(await metric(FAILING, "cedar_requests_running"), 0);
  assert.equal(await metric(FAILING, "cedar_active_generations"), 0);
});

await row(`${process.env.IDLE} concurrent idle connections; the server keeps serving`, async () => {
  const { host, port } = hostPort(MAIN);
  const n = Number(process.env.IDLE), sockets = [];
  let opened = 0, errors = 0;
  await new Promise((resolve) => {
    let pending = n;
    for (let i = 0; i < n; i++) {
      const s = net.connect(port, host, () => { opened++; if (--pending === 0) resolve(); });
      s.on("error", () => { errors++; if (--pending === 0) resolve(); });
      sockets.push(s);
    }
  });
  assert.equal(errors, 0, `${errors} of ${n} connections failed`);
  await sleep(300);
  const open = await metric(MAIN, "cedar_open_connections");
  assert.ok(open >= n, `server counts ${open} open connections, expected ${n}`);
  const t0 = Date.now();
  const r = await post("/v1/chat/completions", chat());
  assert.equal(r.status, 200);
  console.log(`      ${opened} idle sockets open; a chat meanwhile took ${Date.now() - t0} ms`);
  for (const s of sockets) s.destroy();
});

await row("a WebSocket frame announcing 1 GB -> close 1009, nothing allocated", async () => {
  const { host, port } = hostPort(MAIN);
  const result = await new Promise((resolve, reject) => {
    const s = net.connect(port, host);
    let buf = Buffer.alloc(0), upgraded = false;
    s.on("data", (d) => {
      buf = Buffer.concat([buf, d]);
      if (!upgraded) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buf.subarray(0, end).toString();
        if (!head.startsWith("HTTP/1.1 101")) return reject(new Error(head));
        upgraded = true;
        buf = buf.subarray(end + 4);
        const frame = Buffer.alloc(14);
        frame[0] = 0x81; frame[1] = 0x80 | 127;
        frame.writeBigUInt64BE(1n << 30n, 2);
        crypto.randomFillSync(frame, 10, 4);
        s.write(frame);
        s.write(Buffer.alloc(4096, 0x61));
      }
      if (upgraded && buf.length >= 4) resolve({ opcode: buf[0] & 0x0f, code: buf.readUInt16BE(2) });
    });
    s.on("error", reject);
    s.write(`GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
            `Sec-WebSocket-Key: ${crypto.randomBytes(16).toString("base64")}\r\nSec-WebSocket-Version: 13\r\n` +
            `Authorization: Bearer sk-bad\r\n\r\n`);
    setTimeout(() => reject(new Error("no close frame")), 10000);
  });
  assert.equal(result.opcode, 0x8, "expected a close frame");
  assert.equal(result.code, 1009);
});

await row("a client that never reads its stream is dropped and its request cancelled", async () => {
  const { host, port } = hostPort(FLOOD);
  const s = net.connect(port, host);
  s.pause();  // never read
  s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ` +
          `${Buffer.byteLength(chat({ stream: true, max_tokens: 100000000 }))}\r\n\r\n` + chat({ stream: true, max_tokens: 100000000 }));
  let running = 0;
  for (let i = 0; i < 50 && running === 0; i++) { await sleep(20); running = await metric(FLOOD, "cedar_requests_running"); }
  assert.ok(running >= 1, "the flood request never started");
  const t0 = Date.now();
  // The stalled request runs until it is dropped, so one reading of 0 proves it gone; a second
  // reading could count the healthy client's short streams on the same server.
  let dropped = false;
  for (let i = 0; i < 400 && !dropped; i++) {
    dropped = (await metric(FLOOD, "cedar_requests_running")) === 0;
    if (!dropped) await sleep(25);
  }
  assert.ok(dropped, "the stalled stream was not cancelled");
  console.log(`      dropped ${Date.now() - t0} ms after it started stalling`);
  s.destroy();
});

await row("a request pipelined behind a running one is answered after it; a client that leaves mid-answer is cancelled", async () => {
  const { host, port } = hostPort(BUSY);
  const post = (max) => {
    const body = JSON.stringify({ prompt: "hi", max_tokens: max });  // max ms at the server's 1 ms a step
    return `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
           `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
  };
  const startRunning = async (s, request) => {
    s.write(request);
    let running = 0;
    for (let i = 0; i < 50 && running === 0; i++) { await sleep(20); running = await metric(BUSY, "cedar_requests_running"); }
    assert.ok(running >= 1, "the request never started");
  };
  // 1. a request sent while another runs on the connection: both answers arrive, in order
  const a = net.connect(port, host);
  let got = "";
  a.on("data", (d) => { got += d; });
  await startRunning(a, post(300));
  a.write("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  for (let i = 0; i < 200 && !got.includes('{"status":"ok"}'); i++) await sleep(25);
  a.destroy();
  const answers = got.split("HTTP/1.1 ").slice(1);
  assert.equal(answers.length, 2, got.slice(0, 300));
  assert.ok(answers[0].startsWith("200") && answers[0].includes('"text_completion"'), answers[0].slice(0, 200));
  assert.ok(answers[1].startsWith("200") && answers[1].includes('{"status":"ok"}'), answers[1]);
  // 2. a client that pipelines a request, then goes away before the first answer
  const b = net.connect(port, host);
  b.on("data", () => {});
  b.on("error", () => {});
  await startRunning(b, post(20000));  // 20 s
  b.write("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  await sleep(200);
  b.destroy();
  let gone = false;
  for (let i = 0; i < 120 && !gone; i++) {
    gone = (await metric(BUSY, "cedar_requests_running")) === 0;
    if (!gone) await sleep(25);
  }
  assert.ok(gone, "the generation kept running after its client went away");
});

healthy.stop = true;
await healthyLoop;
assert.deepEqual(healthy.failed, [], "the healthy client saw failures");
assert.ok(healthy.ok >= 10, `the healthy client completed only ${healthy.ok} streams`);
console.log(`  ok  the healthy client completed ${healthy.ok} streams with no failure throughout`);
console.log(`serve_bad_input: ${passed + 1} checks passed`);
