#!/usr/bin/env bash
# Encode throughput of cedar's tokenizer and of the JavaScript reference (@huggingface/tokenizers)
# on the same generated corpus, in one run. Each side times only its encode loop (best of 3,
# after one warm-up pass); loading the file is not counted.
# usage: tools/bench_tokenizer.sh [path/to/cedar]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cedar="${1:-$root/build/cedar}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
node "$root/tools/gen_tokenizer_corpus.mjs" > "$tmp/corpus.jsonl" 2>/dev/null
echo "corpus: $(wc -l < "$tmp/corpus.jsonl") strings, $(wc -c < "$tmp/corpus.jsonl") bytes of JSON"
echo "cedar:      $("$cedar" tokenize --jsonl "$tmp/corpus.jsonl" --bench)"
echo "reference:  $(node "$root/tools/tokenizer_reference.mjs" "$tmp/corpus.jsonl" --bench)"
