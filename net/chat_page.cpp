// The chat page served at GET /: one static HTML file with inline JS, embedded in the binary.
// It talks to the Responses WebSocket mode (one socket, only new input per turn), streams text as
// it arrives, shows reasoning and tool calls apart from the answer, and polls /metrics.
#include "net/handlers.hpp"

namespace cedar::net {

namespace {

constexpr std::string_view page = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cedar chat</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:15px/1.45 system-ui,sans-serif;margin:0;display:flex;height:100vh;background:#f6f7f9;color:#222}
main{flex:1;display:flex;flex-direction:column;min-width:0}
#log{flex:1;overflow:auto;padding:16px}
.turn{max-width:820px;margin:0 auto 14px;padding:10px 14px;border-radius:10px;white-space:pre-wrap;word-wrap:break-word}
.user{background:#dbeafe}.assistant{background:#fff;border:1px solid #e3e5e8}
.reasoning{color:#6b7280;font-style:italic;border-left:3px solid #d1d5db;padding-left:8px;margin-bottom:6px}
.reasoning:empty,.tools:empty{display:none}
.tools{font-family:ui-monospace,monospace;font-size:13px;background:#fef3c7;padding:6px;border-radius:6px;margin-top:6px}
.meta{color:#9ca3af;font-size:12px;margin-top:6px}.error{color:#b91c1c}
form{display:flex;gap:8px;padding:12px;border-top:1px solid #e3e5e8;background:#fff}
textarea{flex:1;resize:none;height:54px;font:inherit;padding:6px}
aside{width:250px;border-left:1px solid #e3e5e8;background:#fff;padding:12px;font-size:13px;overflow:auto}
aside table{width:100%;border-collapse:collapse}aside td{padding:2px 0}aside td+td{text-align:right;font-family:ui-monospace,monospace}
label{display:block;margin:6px 0}
</style></head><body>
<main><div id="log"></div>
<form id="form"><textarea id="input" placeholder="Message (Enter to send, Shift+Enter for a new line)"></textarea>
<div><button id="send" type="submit">Send</button><br><button id="stop" type="button" disabled>Stop</button></div></form></main>
<aside><b>cedar</b> <span id="conn">connecting...</span>
<label><input type="checkbox" id="thinking"> thinking</label>
<label>max tokens <input id="maxtok" type="number" value="128" style="width:70px"></label>
<label>API key <input id="key" type="password" style="width:120px"></label>
<button id="reset" type="button">New conversation</button>
<h4>Live metrics</h4><table id="metrics"></table></aside>
<script>
"use strict";
const $ = id => document.getElementById(id);
let ws = null, busy = false, cur = null, lastId = null;
function connect() {
  const key = $("key").value;
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/v1/responses" +
              (key ? "?api_key=" + encodeURIComponent(key) : "");
  ws = new WebSocket(url);
  ws.onopen = () => { $("conn").textContent = "connected"; };
  ws.onclose = () => { $("conn").textContent = "disconnected"; setBusy(false); };
  ws.onmessage = ev => handle(JSON.parse(ev.data));
}
function bubble(cls, text) {
  const d = document.createElement("div"); d.className = "turn " + cls; d.textContent = text || "";
  $("log").appendChild(d); d.scrollIntoView(); return d;
}
function setBusy(b) { busy = b; $("send").disabled = b; $("stop").disabled = !b; }
function handle(e) {
  if (e.type === "error") { bubble("assistant error", e.error.message); setBusy(false); return; }
  if (e.type === "response.created") {
    const d = bubble("assistant");
    d.innerHTML = '<div class="reasoning"></div><div class="text"></div><div class="tools"></div><div class="meta"></div>';
    cur = {reasoning: d.querySelector(".reasoning"), text: d.querySelector(".text"),
           tools: d.querySelector(".tools"), meta: d.querySelector(".meta"), el: d};
    return;
  }
  if (!cur) return;
  if (e.type === "response.reasoning_text.delta") cur.reasoning.textContent += e.delta;
  else if (e.type === "response.output_text.delta") cur.text.textContent += e.delta;
  else if (e.type === "response.output_item.added" && e.item.type === "function_call")
    cur.tools.textContent += (cur.tools.textContent ? "\n" : "") + "call " + e.item.name + "(";
  else if (e.type === "response.function_call_arguments.delta") cur.tools.textContent += e.delta;
  else if (e.type === "response.function_call_arguments.done") cur.tools.textContent += ")";
  else if (e.type.startsWith("response.") && e.response && e.response.status !== "in_progress") {
    const u = e.response.usage || {};
    cur.meta.textContent = e.response.status + " - " + (u.input_tokens || 0) + " in (" +
      ((u.input_tokens_details || {}).cached_tokens || 0) + " cached), " + (u.output_tokens || 0) + " out";
    if (e.response.status === "completed" || e.response.status === "incomplete") lastId = e.response.id;
    setBusy(false); cur = null; return;
  }
  cur.el.scrollIntoView(false);
}
$("form").onsubmit = ev => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || busy || !ws || ws.readyState !== 1) return;
  bubble("user", text); $("input").value = ""; setBusy(true);
  const msg = {type: "response.create", input: [{role: "user", content: text}],
               max_output_tokens: Number($("maxtok").value) || 128,
               reasoning: {effort: $("thinking").checked ? "high" : "none"}};
  if (lastId) msg.previous_response_id = lastId;
  ws.send(JSON.stringify(msg));
};
$("input").onkeydown = ev => { if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("form").requestSubmit(); } };
$("stop").onclick = () => ws && ws.send(JSON.stringify({type: "response.cancel"}));
$("reset").onclick = () => { lastId = null; $("log").textContent = ""; };
$("key").onchange = () => { if (ws) ws.close(); connect(); };
const shown = [["cedar_requests_running", "running"], ["cedar_requests_waiting", "waiting"],
  ["cedar_kv_pages_used", "KV pages used"], ["cedar_kv_pages_free", "KV pages free"],
  ["cedar_prefix_cache_hit_rate", "prefix hit rate"], ["cedar_prompt_tokens_total", "tokens in"],
  ["cedar_generation_tokens_total", "tokens out"], ["cedar_open_connections", "connections"],
  ["cedar_time_to_first_token_seconds", "TTFT avg (ms)"], ["cedar_inter_token_latency_seconds", "ITL avg (ms)"]];
async function poll() {
  try {
    const text = await (await fetch("/metrics")).text(), v = {};
    for (const line of text.split("\n")) {
      if (line.startsWith("#")) continue;
      const [k, x] = line.split(" "); v[k] = Number(x);
    }
    const rows = shown.map(([k, label]) => {
      let x = v[k];
      if (v[k + "_count"] !== undefined) x = v[k + "_count"] ? 1000 * v[k + "_sum"] / v[k + "_count"] : 0;
      const s = x === undefined ? "-" : Number.isInteger(x) ? String(x) : x.toFixed(k.includes("rate") ? 3 : 2);
      return "<tr><td>" + label + "</td><td>" + s + "</td></tr>";
    });
    $("metrics").innerHTML = rows.join("");
  } catch (e) {}
}
connect(); poll(); setInterval(poll, 2000);
</script></body></html>
)HTML";

}  // namespace

std::string_view chat_page_html() { return page; }

}  // namespace cedar::net
