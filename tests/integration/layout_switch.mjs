// 32 multi-turn WebSocket sessions against an unswitched server and against one switching
// layouts while they stream (see layout_switch.sh).
import assert from "node:assert/strict";
import { createRequire } from "node:module";
const require = createRequire(process.env.CEDAR_ROOT + "/tools/node/package.json");
const WebSocket = require("ws");

const sessions = 32, turns = 3, maxTokens = 8;
const plan = (process.env.LAYOUT_PLAN || "dep2,tp4,tp1").split(",");
const shardsOf = (layout) => Number(layout.replace(/^(tp|dep)/, ""));

function open(url) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url.replace("http://", "ws://") + "/v1/responses");
    const events = [], waiters = [];
    ws.on("message", (data) => {
      events.push(JSON.parse(data.toString()));
      for (const w of waiters.splice(0)) w();
    });
    ws.next = async (pred) => {
      const deadline = Date.now() + 300000;
      for (;;) {
        const i = events.findIndex(pred);
        if (i >= 0) return events.splice(0, i + 1).pop();
        if (Date.now() > deadline) throw new Error("timed out waiting for an event");
        await new Promise((r) => { waiters.push(r); setTimeout(r, 200); });
      }
    };
    ws.on("open", () => resolve(ws));
    ws.on("error", reject);
  });
}
const isEnd = (e) => ["response.completed", "response.incomplete", "response.cancelled", "response.failed"].includes(e.type);
const textOf = (r) => (r.output || []).flatMap((o) => o.content || []).map((c) => c.text || "").join("");

/// Runs every session to the end; onTurnDone(count) after each finished turn.
async function run(url, onTurnDone = () => {}) {
  let done = 0;
  const one = async (s) => {
    const ws = await open(url);
    const out = [];
    let previous = null;  // each turn goes on from the last: the session's context grows
    for (let t = 0; t < turns; t++) {
      ws.send(JSON.stringify({ type: "response.create", model: "micro", max_output_tokens: maxTokens, temperature: 0,
                               reasoning: { effort: "none" }, previous_response_id: previous,
                               input: [{ role: "user", content: `Session ${s}, turn ${t}: go on.` }] }));
      const end = await ws.next(isEnd);
      previous = end.response.id;
      out.push({ status: end.response.status, text: textOf(end.response), tokens: end.response.usage.output_tokens });
      onTurnDone(++done);
    }
    ws.close();
    return out;
  };
  return Promise.all(Array.from({ length: sessions }, (_, s) => one(s)));
}

const admin = { Authorization: "Bearer adm-layout", "Content-Type": "application/json" };
async function status() {
  const r = await fetch(process.env.URL_LIVE + "/admin/status", { headers: admin });
  assert.equal(r.status, 200);
  return r.json();
}

async function switchTo(layout) {
  const r = await fetch(process.env.URL_LIVE + "/admin/layout", {
    method: "POST", headers: { Authorization: "Bearer adm-layout", "Content-Type": "application/json" },
    body: JSON.stringify({ layout }) });
  const body = await r.text();
  assert.equal(r.status, 200, body);
  return JSON.parse(body);
}

const want = await run(process.env.URL_REF);
const results = [];
let next = 0, chain = Promise.resolve();
const got = await run(process.env.URL_LIVE, (count) => {
  // Switch at 1/8, 2/8 and 3/8 of the turns (one switch at a time: the runtime refuses a
  // second while one runs), without waiting: the sessions keep streaming.
  if (next < plan.length && count >= Math.ceil(((next + 1) * sessions * turns) / 8)) {
    const layout = plan[next++];
    chain = chain.then(async () => results.push(await switchTo(layout)));
  }
});
await chain;
assert.deepEqual(results.map((r) => r.layout), plan);
let failed = 0, truncated = 0, differ = 0;
for (let s = 0; s < sessions; s++)
  for (let t = 0; t < turns; t++) {
    const a = want[s][t], b = got[s][t];
    if (!["completed", "incomplete"].includes(b.status)) failed++;
    if (b.tokens !== a.tokens) truncated++;
    if (b.text !== a.text) differ++;
  }
for (const r of results)
  console.log(`  switch to ${r.layout}: pause ${r.pause_ms.toFixed(1)} ms (re-homing ${r.rehome_ms.toFixed(1)} ms), ` +
              `${r.requests_moved} requests, ${r.pages_copied} pages`);
console.log(`  ${failed} failed, ${truncated} with another token count, ${differ} of ${sessions * turns} turns differ`);
assert.equal(failed, 0);
assert.equal(truncated, 0);
// LAYOUT_TEXT_MAY_DIFFER=1 (GPU fast kernels): a prompt's bits depend on the rows it is batched
// with outside the decode path, so two runs may answer differently; counted, not asserted
if (process.env.LAYOUT_TEXT_MAY_DIFFER !== "1") assert.equal(differ, 0);
const st = await status();
assert.equal(st.layout, plan[plan.length - 1]);
assert.equal(st.switches, plan.length);
assert.equal(st.shards.length, shardsOf(plan[plan.length - 1]));
assert.ok(st.shards.every((s) => s.steps > 0 && s.alive));
// where each shard computes: rank r on CUDA device r for GPU layouts
const onGpu = (process.env.CEDAR_SERVE_MODEL_ARGS || "").includes("--device cuda");
assert.deepEqual(st.shards.map((s) => s.device), st.shards.map((s) => (onGpu ? `cuda:${s.rank}` : "cpu")));
if (process.env.LAYOUT_KILL === "0") {
  console.log("layout_switch: ok (no shard killed)");
  process.exit(0);
}

// A shard killed mid-stream (test hook): every stream ends within 10 s, /health answers
// throughout, and new sessions are served after the rebuild.
results.push(await switchTo("dep2"));
const t0 = Date.now();
let healthFailures = 0, killed = false;
const probe = setInterval(async () => {
  try { if ((await fetch(process.env.URL_LIVE + "/health")).status !== 200) healthFailures++; } catch { healthFailures++; }
}, 100);
const after = await Promise.all(Array.from({ length: 8 }, async (_, s) => {
  const ws = await open(process.env.URL_LIVE);
  ws.send(JSON.stringify({ type: "response.create", model: "micro", max_output_tokens: 24, temperature: 0,
                           reasoning: { effort: "none" }, input: [{ role: "user", content: `After ${s}` }] }));
  await ws.next((e) => e.type === "response.output_text.delta" || e.type === "response.reasoning_text.delta");
  if (!killed) {
    killed = true;
    const r = await fetch(process.env.URL_LIVE + "/admin/kill-shard", { method: "POST", headers: admin,
                                                                       body: JSON.stringify({ rank: 1 }) });
    assert.equal(r.status, 200, await r.text());
  }
  const end = await ws.next(isEnd);
  ws.close();
  return { status: end.response.status, ms: Date.now() - t0 };
}));
clearInterval(probe);
const slowest = Math.max(...after.map((a) => a.ms));
console.log(`  shard killed: ${after.filter((a) => a.status === "incomplete" || a.status === "completed").length}/8 ` +
            `streams completed, ${after.filter((a) => a.status === "failed").length} failed cleanly, last ended ${slowest} ms ` +
            `after the streams started; /health failures: ${healthFailures}`);
assert.ok(after.every((a) => ["completed", "incomplete", "failed"].includes(a.status)));
assert.ok(slowest < 10000);
assert.equal(healthFailures, 0);
const rebuilt = await status();
assert.equal(rebuilt.rebuilds, 1);
assert.ok(rebuilt.shards.every((s) => s.alive));
const fresh = await run(process.env.URL_LIVE);
assert.ok(fresh.every((turnsOut) => turnsOut.every((t) => ["completed", "incomplete"].includes(t.status))));
console.log("layout_switch: ok");
