// Streaming overhead of `cedar serve` with the null model: C concurrent clients each stream N
// tokens over SSE (chat completions) or the Responses WebSocket mode; reports tokens/s delivered,
// client-side gaps between messages, and the server's own added latency per message (engine
// emitted -> bytes written to the socket, from cedar_server_added_latency_seconds). The null
// engine's token is " hi"; a WebSocket delta may carry several (merged while the socket was behind).
// usage: node serve_stream_bench.mjs URL sse|ws CLIENTS TOKENS STEP_US
// (start the server first: cedar serve --model null --null-step-us STEP_US --max-active 4096)
import { createRequire } from "node:module";
import http from "node:http";
const require = createRequire((process.env.CEDAR_ROOT || process.cwd()) + "/tools/node/package.json");
const WebSocket = require("ws");

const [url, mode, clientsArg, tokensArg, stepArg] = process.argv.slice(2);
const clients = Number(clientsArg), tokens = Number(tokensArg), stepUs = Number(stepArg);
const agent = new http.Agent({ keepAlive: true, maxSockets: clients });
const gaps = [];

function sseClient() {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ messages: [{ role: "user", content: "x" }], max_tokens: tokens, stream: true,
                                  chat_template_kwargs: { thinking: false } });
    const u = new URL(url + "/v1/chat/completions");
    const req = http.request({ hostname: u.hostname, port: u.port, path: u.pathname, method: "POST", agent,
                               headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) } },
      (res) => {
        let buf = "", got = 0, last = 0;
        res.setEncoding("utf8");
        res.on("data", (d) => {
          buf += d;
          let i;
          while ((i = buf.indexOf("\n\n")) >= 0) {
            const ev = buf.slice(0, i);
            buf = buf.slice(i + 2);
            if (ev.includes('"content":" hi"')) {
              const now = performance.now();
              if (last) gaps.push(now - last);
              last = now;
              got++;
            }
          }
        });
        res.on("end", () => resolve(got));
        res.on("error", reject);
      });
    req.on("error", reject);
    req.end(body);
  });
}

function wsClient() {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url.replace("http", "ws") + "/v1/responses");
    let got = 0, last = 0;
    ws.on("open", () => ws.send(JSON.stringify({ type: "response.create", input: "x", max_output_tokens: tokens,
                                                  reasoning: { effort: "none" } })));
    ws.on("message", (data) => {
      const s = data.toString();
      if (s.startsWith('{"type":"response.output_text.delta"')) {
        const now = performance.now();
        if (last) gaps.push(now - last);
        last = now;
        got += s.split(" hi").length - 1;  // a socket that fell behind gets several tokens per delta
      } else if (s.includes('"type":"response.incomplete"') || s.includes('"type":"response.completed"')) {
        ws.close();
        resolve(got);
      }
    });
    ws.on("error", reject);
  });
}

async function histogram(name) {
  const text = await (await fetch(url + "/metrics")).text();
  const buckets = [];
  for (const line of text.split("\n")) {
    const m = line.match(new RegExp(`^${name}_bucket\\{le="([^"]+)"\\} (\\d+)`));
    if (m) buckets.push([m[1] === "+Inf" ? Infinity : Number(m[1]), Number(m[2])]);
  }
  return buckets;
}
function quantileDelta(before, after, q) {
  const counts = after.map(([le, c], i) => [le, c - before[i][1]]);
  const total = counts[counts.length - 1][1];
  const target = q * total;
  let prevLe = 0, prevC = 0;
  for (const [le, c] of counts) {
    if (c >= target) return (prevLe + ((le === Infinity ? prevLe * 2 : le) - prevLe) * (target - prevC) / Math.max(1, c - prevC));
    prevLe = le; prevC = c;
  }
  return prevLe;
}
// NaN (null in the JSON) when every client got one message (no gaps).
const pct = (arr, q) => { const s = [...arr].sort((a, b) => a - b); return s.length ? s[Math.min(s.length - 1, Math.floor(q * s.length))] : NaN; };

const before = await histogram("cedar_server_added_latency_seconds");
const t0 = performance.now();
const counts = await Promise.all(Array.from({ length: clients }, () => (mode === "ws" ? wsClient() : sseClient())));
const seconds = (performance.now() - t0) / 1000;
const after = await histogram("cedar_server_added_latency_seconds");
const total = counts.reduce((a, b) => a + b, 0);
const expected = clients * tokens;
const result = {
  mode, clients, tokens_per_client: tokens, null_step_us: stepUs, tokens_delivered: total, complete: total === expected,
  wall_s: +seconds.toFixed(3), tokens_per_s: Math.round(total / seconds),
  client_gap_p50_ms: +pct(gaps, 0.5).toFixed(3), client_gap_p99_ms: +pct(gaps, 0.99).toFixed(3),
  server_added_p50_ms: +(quantileDelta(before, after, 0.5) * 1e3).toFixed(3),
  server_added_p99_ms: +(quantileDelta(before, after, 0.99) * 1e3).toFixed(3),
};
console.log(JSON.stringify(result));
agent.destroy();
