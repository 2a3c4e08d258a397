// 32 multi-turn WebSocket sessions against an unswitched server and against one switching
// layouts while they stream (see layout_switch.sh).
import assert from "node:assert/strict";
import { createRequire } from "node:module";
const require = createRequire(process.env.CEDAR_ROOT + "/tools/node/package.json");
const WebSocket = require("ws");

const sessions = 32, turns = 3, maxTokens = 8;
const plan = ["dep2", "tp4", "tp1"];

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
    for (let t = 0; t < turns; t++) {
      ws.send(JSON.stringify({ type: "response.create", model: "micro", max_output_tokens: maxTokens, temperature: 0,
                               reasoning: { effort: "none" },
                               input: [{ role: "user", content: `Session ${s}, turn ${t}: go on.` }] }));
      const end = await ws.next(isEnd);
      out.push({ status: end.response.status, text: textOf(end.response), tokens: end.response.usage.output_tokens });
      onTurnDone(++done);
    }
    ws.close();
    return out;
  };
  return Promise.all(Array.from({ length: sessions }, (_, s) => one(s)));
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
assert.equal(differ, 0);
console.log("layout_switch: ok");
