#!/usr/bin/env bash
# Tokenizer corpus test: cedar's ids must equal the JavaScript reference (@huggingface/tokenizers,
# same tokenizer.json) on every string of the generated corpus, and decode(encode(x)) == x.
# usage: tests/integration/tokenizer_corpus.sh path/to/cedar
set -euo pipefail
cedar="${1:?usage: tokenizer_corpus.sh path/to/cedar}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

node "$root/tools/gen_tokenizer_corpus.mjs" > "$tmp/corpus.jsonl"
node "$root/tools/tokenizer_reference.mjs" "$tmp/corpus.jsonl" > "$tmp/reference.txt"
"$cedar" tokenize --jsonl "$tmp/corpus.jsonl" > "$tmp/cedar.txt"
"$cedar" detokenize --ids-jsonl "$tmp/cedar.txt" > "$tmp/decoded.jsonl"

node --input-type=module - "$tmp" <<'JS'
import fs from "node:fs";
const dir = process.argv[2];
const lines = (f) => fs.readFileSync(`${dir}/${f}`, "utf8").split("\n").filter((l) => l.length);
const corpus = lines("corpus.jsonl"), ref = lines("reference.txt"), got = lines("cedar.txt"), dec = lines("decoded.jsonl");
let passed = 0, failed = 0;
corpus.forEach((line, i) => {
  const text = JSON.parse(line);
  const idsOk = ref[i] !== undefined && got[i] !== undefined && JSON.stringify(JSON.parse(ref[i])) === JSON.stringify(JSON.parse(got[i]));
  const roundTrip = dec[i] !== undefined && JSON.parse(dec[i]) === text;
  if (idsOk && roundTrip) { ++passed; return; }
  ++failed;
  if (failed <= 10) {
    console.log(`FAIL line ${i + 1}: ${JSON.stringify(text).slice(0, 160)}`);
    if (!idsOk) console.log(`  reference ${(ref[i] ?? "").slice(0, 160)}\n  cedar     ${(got[i] ?? "").slice(0, 160)}`);
    if (!roundTrip) console.log(`  decoded   ${(dec[i] ?? "").slice(0, 160)}`);
  }
});
console.log(`tokenizer corpus: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed >= 2000 ? 0 : 1);
JS
