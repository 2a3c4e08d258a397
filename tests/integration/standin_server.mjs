// A stand-in OpenAI-compatible server for testing `cedar bench` without cedar: it streams fake
// tokens at a set rate over Chat Completions SSE, Responses SSE and the Responses WebSocket mode,
// simulates a prefix cache over 64-word blocks (so a replay's prefix reuse shows), and serves
// /metrics in Prometheus text. Prints "listening <port>" once ready.
//
//   node standin_server.mjs [--port 0] [--tps 400] [--ttft-ms 10] [--prefill-us 20]
//                           [--short-prob 0] [--no-usage] [--fail-prob 0] [--no-stream]
import http from 'node:http';
import crypto from 'node:crypto';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const require = createRequire(path.join(root, 'tools/node/package.json'));
const { WebSocketServer } = require(path.join(root, 'tools/node/node_modules/ws'));

const opts = { port: 0, tps: 400, ttftMs: 10, prefillUs: 20, shortProb: 0, usage: true, failProb: 0, stream: true };
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i], v = process.argv[i + 1];
  if (a === '--no-usage') { opts.usage = false; continue; }
  if (a === '--no-stream') { opts.stream = false; continue; }
  const key = { '--port': 'port', '--tps': 'tps', '--ttft-ms': 'ttftMs', '--prefill-us': 'prefillUs',
                '--short-prob': 'shortProb', '--fail-prob': 'failProb' }[a];
  if (!key) { console.error(`unknown option ${a}`); process.exit(2); }
  opts[key] = Number(v); i++;
}

// ---- prefix cache: chained hashes of 64-word blocks of the rendered prompt ----
const BLOCK = 64;
const cache = new Set();
const stats = { promptTokens: 0, hitTokens: 0, requests: 0, outputTokens: 0 };

function render(messages) {
  return messages.map((m) => `${m.role}: ${typeof m.content === 'string' ? m.content : JSON.stringify(m.content)}`).join('\n');
}

/** Counts prompt tokens (words) and the leading full blocks already cached; caches all blocks. */
function prefill(text) {
  const words = text.split(/\s+/).filter(Boolean);
  let h = '', hits = 0, missed = false;
  for (let b = 0; b + BLOCK <= words.length; b += BLOCK) {
    h = crypto.createHash('sha1').update(h).update(words.slice(b, b + BLOCK).join(' ')).digest('hex');
    if (!missed && cache.has(h)) hits += BLOCK; else missed = true;
    cache.add(h);
  }
  if (cache.size > 2_000_000) cache.clear();
  stats.requests++;
  stats.promptTokens += words.length;
  stats.hitTokens += hits;
  return { promptTokens: words.length, cachedTokens: hits };
}

/** Streams up to `maxTokens` fake tokens, one every 1/tps s, after a TTFT that grows with the
 *  uncached prompt tokens; calls onDone(n, finish). Returns a cancel function. */
function generate(maxTokens, uncached, onToken, onDone) {
  let n = Math.max(1, maxTokens | 0);
  if (Math.random() < opts.shortProb) n = Math.max(1, Math.floor(n * (0.3 + 0.6 * Math.random())));
  let sent = 0, timer = null;
  const tick = () => {
    onToken(sent === 0 ? 'tok' : ' tok');
    if (++sent < n) { timer = setTimeout(tick, 1000 / opts.tps); return; }
    timer = null;
    stats.outputTokens += n;
    onDone(n, n < maxTokens ? 'stop' : 'length');
  };
  timer = setTimeout(tick, opts.ttftMs + (uncached * opts.prefillUs) / 1000);
  return () => { if (timer) clearTimeout(timer); timer = null; };
}

// ---- Chat Completions ----
function chat(req, res, body) {
  const prompt = prefill(render(body.messages || []));
  const id = `chatcmpl-${crypto.randomUUID()}`;
  const created = Math.floor(Date.now() / 1000);
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const send = (obj) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
  const chunk = (delta, finish = null) => ({ id, object: 'chat.completion.chunk', created, model: body.model,
                                             choices: [{ index: 0, delta, finish_reason: finish }] });
  send(chunk({ role: 'assistant', content: '' }));
  const cancel = generate(body.max_tokens ?? body.max_completion_tokens ?? 16,
                          prompt.promptTokens - prompt.cachedTokens,
    (t) => send(chunk({ content: t })),
    (n, finish) => {
      send(chunk({}, finish));
      if (opts.usage && body.stream_options?.include_usage)
        send({ id, object: 'chat.completion.chunk', created, model: body.model, choices: [],
               usage: { prompt_tokens: prompt.promptTokens, completion_tokens: n, total_tokens: prompt.promptTokens + n,
                        prompt_tokens_details: { cached_tokens: prompt.cachedTokens } } });
      res.end('data: [DONE]\n\n');
    });
  res.on('close', cancel);
}

// ---- Responses (shared by SSE and WebSocket) ----
const stored = new Map();  // response id -> full message history, output included

/** Runs one response; emit(type, obj) sends an event; returns a cancel function, or emits an error. */
function respond(body, emit) {
  let history = [];
  if (body.previous_response_id) {
    if (!stored.has(body.previous_response_id)) {
      emit('error', { type: 'error', error: { type: 'invalid_request_error', code: 'previous_response_not_found',
                                              message: `previous response ${body.previous_response_id} not found` } });
      return () => {};
    }
    history = stored.get(body.previous_response_id).slice();
  }
  const input = typeof body.input === 'string' ? [{ role: 'user', content: body.input }] : (body.input || []);
  history.push(...input);
  const prompt = prefill(render(history));
  const id = `resp_${crypto.randomUUID().replace(/-/g, '')}`;
  const itemId = `msg_${crypto.randomUUID().replace(/-/g, '')}`;
  const base = { id, object: 'response', model: body.model, status: 'in_progress', output: [] };
  let seq = 0;
  const ev = (type, obj) => emit(type, { type, sequence_number: seq++, ...obj });
  ev('response.created', { response: base });
  let text = '';
  return generate(body.max_output_tokens ?? 16, prompt.promptTokens - prompt.cachedTokens,
    (t) => { text += t; ev('response.output_text.delta', { item_id: itemId, output_index: 0, content_index: 0, delta: t }); },
    (n, finish) => {
      stored.set(id, [...history, { role: 'assistant', content: text }]);
      const response = { ...base, status: finish === 'length' ? 'incomplete' : 'completed',
        output: [{ type: 'message', id: itemId, role: 'assistant', content: [{ type: 'output_text', text }] }] };
      if (opts.usage)
        response.usage = { input_tokens: prompt.promptTokens, output_tokens: n, total_tokens: prompt.promptTokens + n,
                           input_tokens_details: { cached_tokens: prompt.cachedTokens } };
      ev(finish === 'length' ? 'response.incomplete' : 'response.completed', { response });
    });
}

function responsesSse(req, res, body) {
  let open = true;
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const cancel = respond(body, (type, obj) => {
    if (!open) return;
    res.write(`event: ${type}\ndata: ${JSON.stringify(obj)}\n\n`);
    if (type === 'response.completed' || type === 'response.incomplete' || type === 'error') { open = false; res.end(); }
  });
  res.on('close', () => { open = false; cancel(); });
}

// ---- HTTP server ----
function metrics(res) {
  const rate = stats.promptTokens ? stats.hitTokens / stats.promptTokens : 0;
  res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
  res.end(['# TYPE standin_prompt_tokens_total counter', `standin_prompt_tokens_total ${stats.promptTokens}`,
           '# TYPE standin_prefix_cache_hit_tokens_total counter', `standin_prefix_cache_hit_tokens_total ${stats.hitTokens}`,
           '# TYPE standin_prefix_cache_hit_rate gauge', `standin_prefix_cache_hit_rate ${rate}`,
           '# TYPE standin_requests_total counter', `standin_requests_total ${stats.requests}`,
           '# TYPE standin_output_tokens_total counter', `standin_output_tokens_total ${stats.outputTokens}`, ''].join('\n'));
}

function fail(res, status, message) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: { message, type: 'invalid_request_error' } }));
}

const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/metrics') return metrics(res);
  if (req.method === 'GET' && req.url === '/health') return res.end('ok');
  if (req.method === 'GET' && req.url === '/v1/models') {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ object: 'list', data: [{ id: 'standin-1', object: 'model', owned_by: 'tests' }] }));
  }
  if (req.method !== 'POST') return fail(res, 404, 'not found');
  let data = '';
  req.on('data', (c) => { data += c; });
  req.on('end', () => {
    let body;
    try { body = JSON.parse(data); } catch { return fail(res, 400, 'bad JSON'); }
    if (Math.random() < opts.failProb) return fail(res, 503, 'injected failure');
    if (req.url === '/v1/chat/completions' && !opts.stream) {  // a server that does not stream
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'tok' } }] }));
    }
    if (req.url === '/v1/chat/completions') return chat(req, res, body);
    if (req.url === '/v1/responses') return responsesSse(req, res, body);
    fail(res, 404, `no route ${req.url}`);
  });
});

const wss = new WebSocketServer({ server, path: '/v1/responses' });
wss.on('connection', (ws) => {
  let cancel = () => {};
  ws.on('message', (raw) => {
    let event;
    try { event = JSON.parse(raw.toString()); } catch { return ws.send(JSON.stringify({ type: 'error', error: { message: 'bad JSON' } })); }
    if (event.type !== 'response.create') return ws.send(JSON.stringify({ type: 'error', error: { message: `unknown event ${event.type}` } }));
    if ('stream' in event) return ws.send(JSON.stringify({ type: 'error', error: { message: 'stream is implicit over WebSocket' } }));
    cancel = respond(event, (type, obj) => { if (ws.readyState === 1) ws.send(JSON.stringify(obj)); });
  });
  ws.on('close', () => cancel());
});

server.listen(opts.port, '127.0.0.1', () => {
  console.log(`listening ${server.address().port}`);
});
