#!/usr/bin/env bash
# The model commands on the CPU backend: `cedar generate` is deterministic and chunking does not
# change its tokens, and --prompt-ids runs (a..b) are the listed ids; `cedar logits` writes its header and every row, and its last row's argmax
# is the token generate picks first; a checkpoint directory gives the same tokens as the preset
# with the same seed, its Engram hash is the reference's (`cedar info`: the tokenizer's 99,092
# classes, multipliers equal to numpy's draws), and a checkpoint that does not match its config
# or a tokenizer that folds into another class count is refused; kernel-lab
# refuses options it does not take with its usage (exit 2) before it looks for a device and takes
# those it does (--tokens with moe, prefill and gemv, --tile with moe), and the GPU-only
# --gpu-dense-bf16 and --gpu-batch-invariant off are refused on the CPU backend; numeric flags
# are read whole (no silent 0), switches take no value, a bad --host is refused before the
# engine loads, an engine flag's error prints once; generate, logits, kernel-lab, gpu-bench, bench
# and (de)tokenize name a refused argument and why in one line before the usage, and print the usage
# on stdout with exit 0 for --help; replay-quality --help prints its usage, every command reads a checkpoint directory by its own
# layout (stale shards beside model.safetensors are not read); prefix-bench takes --page-tokens.
# usage: tests/integration/model_cli.sh path/to/cedar
set -euo pipefail
cedar="${1:?usage: model_cli.sh path/to/cedar}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
ids="5,17,300,4242,77,9,1000,123,8,64,2048,31,7,99,12345,6"

ids_of() { python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["output_ids"])))'; }

a="$("$cedar" generate --model micro --prompt-ids "$ids" --max-tokens 6 --ignore-eos --json | ids_of)"
b="$("$cedar" generate --model micro --prompt-ids "$ids" --max-tokens 6 --ignore-eos --json | ids_of)"
c="$("$cedar" generate --model micro --prompt-ids "$ids" --max-tokens 6 --ignore-eos --chunk 3 --json | ids_of)"
[[ "$a" == "$b" ]] || { echo "generate is not deterministic: $a vs $b"; exit 1; }
[[ "$a" == "$c" ]] || { echo "chunked prefill changed the tokens: $a vs $c"; exit 1; }
[[ "$(tr ',' '\n' <<< "$a" | wc -l)" == 6 ]] || { echo "expected 6 tokens, got $a"; exit 1; }
r="$("$cedar" generate --model micro --prompt-ids "5,17,300..303,9" --max-tokens 3 --ignore-eos --json | ids_of)"
l="$("$cedar" generate --model micro --prompt-ids "5,17,300,301,302,303,9" --max-tokens 3 --ignore-eos --json | ids_of)"
[[ "$r" == "$l" ]] || { echo "--prompt-ids a..b is not the listed run: $r vs $l"; exit 1; }
for bad in "3..1" "1..x" "-2" "4,,5"; do
  if "$cedar" generate --model micro --prompt-ids "$bad" --max-tokens 1 2> /dev/null > /dev/null; then
    echo "--prompt-ids $bad was accepted"; exit 1
  fi
done

"$cedar" logits --model micro --prompt-ids "$ids" --out "$tmp/logits.bin"
python3 - "$tmp/logits.bin" "${a%%,*}" <<'PY'
import array, json, sys
data = open(sys.argv[1], "rb").read()
nl = data.index(b"\n")
head = json.loads(data[:nl])
assert head["rows"] == 16 and head["dtype"] == "f32", head
vals = array.array("f"); vals.frombytes(data[nl + 1:])
assert len(vals) == head["rows"] * head["vocab"], (len(vals), head)
last = vals[-head["vocab"]:]
top = max(range(len(last)), key=last.__getitem__)
assert top == int(sys.argv[2]), (top, sys.argv[2])
PY

"$cedar" ckpt --preset micro --out "$tmp/ckpt" --seed 1 > /dev/null 2>&1
d="$("$cedar" generate --model "$tmp/ckpt" --prompt-ids "$ids" --max-tokens 6 --ignore-eos --json | ids_of)"
[[ "$a" == "$d" ]] || { echo "checkpoint directory and preset differ: $a vs $d"; exit 1; }
"$cedar" info --model "$tmp/ckpt" --json > "$tmp/info.json"
/usr/bin/python3 - "$tmp/info.json" <<'PY'
import json, sys
import numpy as np
e = json.load(open(sys.argv[1]))["engram"]
assert e["token_map_classes"] == 99092, e
half = max(1, (np.iinfo(np.int64).max // 99092) // 2)
for layer in e["layers"]:
    want = np.random.default_rng(10007 * layer["layer"]).integers(0, half, size=4, dtype=np.int64) * 2 + 1
    assert layer["multipliers"] == [int(v) for v in want], (layer, want)
PY
sed 's/"engram_compressed_vocab_size": 99092/&X/; s/99092X/99091/' "$tmp/ckpt/config.json" > "$tmp/cfg"
cp "$tmp/ckpt/config.json" "$tmp/config.good" && cp "$tmp/cfg" "$tmp/ckpt/config.json"
if "$cedar" generate --model "$tmp/ckpt" --prompt-ids "$ids" --max-tokens 1 2> "$tmp/err" > /dev/null; then
  echo "a tokenizer folding into 99,092 classes served a config of 99,091"; exit 1
fi
grep -q "99092 classes" "$tmp/err" || { cat "$tmp/err"; exit 1; }
cp "$tmp/config.good" "$tmp/ckpt/config.json"
sed -i 's/"moe_intermediate_size": 128/"moe_intermediate_size": 96/' "$tmp/ckpt/config.json"
if "$cedar" generate --model "$tmp/ckpt" --prompt-ids "$ids" --max-tokens 2 2> "$tmp/err"; then
  echo "a checkpoint that does not match its config was accepted"; exit 1
fi
grep -q "does not match" "$tmp/err" || { cat "$tmp/err"; exit 1; }

for bad in "--op moe --tile nope" "--op moe --tokens 0" "--op moe --tokens 64x" "--op prefill --tile narrow" \
           "--op attention --tokens 64" "--op prefill --tokens 0" "--op nope" \
           "--op linear_fp8 --shape nope" "--op linear_fp4 --shape attn.wq_b" "--op moe --shape attn.wq_b" \
           "--op gemv --tile narrow" "--op gemv --tokens 0"; do
  rc=0
  # shellcheck disable=SC2086
  "$cedar" kernel-lab $bad > /dev/null 2> "$tmp/err" || rc=$?
  [[ $rc == 2 ]] && grep -q "usage: cedar kernel-lab" "$tmp/err" || { echo "kernel-lab $bad: exit $rc"; cat "$tmp/err"; exit 1; }
done
for ok in "--op moe --tokens 64 --tile narrow" "--op moe --tokens 64 --tile split4" \
          "--op moe --tokens 64 --tile split8" "--op prefill --tokens 64" "--op gemv --tokens 8"; do
  rc=0
  # shellcheck disable=SC2086
  "$cedar" kernel-lab $ok > /dev/null 2> "$tmp/err" || rc=$?
  if [[ $rc == 2 ]]; then echo "kernel-lab $ok was refused"; cat "$tmp/err"; exit 1; fi
done
# --gpu-dense-bf16 and --gpu-batch-invariant off are GPU options: with the CPU backend (or exact
# kernels) they are refused, not ignored; --gpu-batch-invariant takes on or off only
for cmd in "generate --model micro --prompt-ids 5 --max-tokens 1 --gpu-dense-bf16" \
           "gpu-bench --phases floor --gpu-dense-bf16" \
           "gpu-bench --phases floor --device cuda --gpu-kernels exact --gpu-dense-bf16" \
           "generate --model micro --prompt-ids 5 --max-tokens 1 --gpu-batch-invariant off" \
           "generate --model micro --prompt-ids 5 --max-tokens 1 --gpu-batch-invariant yes" \
           "gpu-bench --phases floor --gpu-batch-invariant off" \
           "gpu-bench --phases floor --device cuda --gpu-kernels exact --gpu-batch-invariant off"; do
  rc=0
  # shellcheck disable=SC2086
  "$cedar" $cmd > /dev/null 2> "$tmp/err" || rc=$?
  [[ $rc == 2 ]] && grep -q "usage: cedar" "$tmp/err" || { echo "$cmd: exit $rc"; cat "$tmp/err"; exit 1; }
done
rc=0
"$cedar" serve --model micro --port 0 --gpu-dense-bf16 > /dev/null 2> "$tmp/err" || rc=$?
[[ $rc == 2 ]] && grep -q -- "--gpu-dense-bf16 needs --device cuda" "$tmp/err" || { echo "serve --gpu-dense-bf16 on the CPU: exit $rc"; cat "$tmp/err"; exit 1; }
# "on" is what the CPU does anyway
"$cedar" generate --model micro --prompt-ids 5 --max-tokens 1 --gpu-batch-invariant on > /dev/null 2> "$tmp/err" ||
  { echo "generate --gpu-batch-invariant on was refused"; cat "$tmp/err"; exit 1; }
for value in off maybe; do
  rc=0
  "$cedar" serve --model micro --port 0 --gpu-batch-invariant $value > /dev/null 2> "$tmp/err" || rc=$?
  [[ $rc == 2 ]] && grep -q -- "--gpu-batch-invariant" "$tmp/err" ||
    { echo "serve --gpu-batch-invariant $value on the CPU: exit $rc"; cat "$tmp/err"; exit 1; }
done
# numbers are read whole: "abc", "5x", a negative seed or a value past the field's range is
# refused with exit 2, never taken as 0 or wrapped
for cmd in "generate --model micro --prompt-ids 5 --max-tokens 1 --seed abc" \
           "generate --model micro --prompt-ids 5 --max-tokens 5x" \
           "generate --model micro --prompt-ids 5 --max-tokens 1 --seed -1" \
           "logits --model micro --prompt-ids 5 --out $tmp/x.bin --chunk 2y" \
           "ckpt --preset micro --out $tmp/never --seed 12z" \
           "gpu-bench --phases floor --steps 3q" \
           "replay-quality --page-tokens 0" "replay-quality --conversations many" \
           "serve --model micro --port 4294975296" "serve --model micro --idle-timeout-s 99999999999" \
           "serve --model micro --default-max-tokens 0" "serve --model micro --max-connections 0" \
           "serve --model micro --max-queued-bytes 0" "serve --model micro --idle-timeout-s 0" \
           "serve --model micro --layout foo" "serve --model micro --layout tp" \
           "serve --model micro --gpu-dense-bf16=off" "serve --model micro --no-request-log=false"; do
  rc=0
  # shellcheck disable=SC2086
  "$cedar" $cmd > /dev/null 2> "$tmp/err" || rc=$?
  [[ $rc == 2 ]] || { echo "$cmd: exit $rc, not 2"; cat "$tmp/err"; exit 1; }
  [[ ! -e "$tmp/never" ]] || { echo "$cmd wrote a checkpoint"; exit 1; }
done
grep -q "takes no value" "$tmp/err" || { echo "a switch given a value does not say so"; cat "$tmp/err"; exit 1; }
# the address is checked before the engine loads: a bad --host is the answer even for a model
# that would not load (a directory with a config and no weights)
mkdir -p "$tmp/noweights" && cp "$tmp/ckpt/config.json" "$tmp/noweights/"
rc=0
"$cedar" serve --model "$tmp/noweights" --host 256.0.0.1 > /dev/null 2> "$tmp/err" || rc=$?
[[ $rc == 2 ]] && grep -q "bad --host" "$tmp/err" || { echo "serve --host 256.0.0.1: exit $rc"; cat "$tmp/err"; exit 1; }
# KV arenas that would not fit in host memory are refused before serving, naming the flag
mem=$(( $(getconf _PHYS_PAGES) * $(getconf PAGE_SIZE) ))
rc=0
"$cedar" serve --model micro --port 0 --layout tp2 --kv-budget-bytes $((mem * 6 / 10)) > /dev/null 2> "$tmp/err" || rc=$?
[[ $rc == 1 ]] && grep -q "2 KV arenas of --kv-budget-bytes" "$tmp/err" ||
  { echo "serve with KV arenas past host memory: exit $rc"; cat "$tmp/err"; exit 1; }
# an engine flag's error is printed once
"$cedar" serve --model micro --max-num-seqs 0 > /dev/null 2> "$tmp/err" || true
[[ "$(grep -c -- "--max-num-seqs must be" "$tmp/err")" == 1 ]] || { echo "the error is not printed once"; cat "$tmp/err"; exit 1; }
# a refused argument is named: one line "cedar CMD: ..." on stderr saying which flag and why,
# then the usage (exit 2); --help prints the usage on stdout and exits 0
refused() {  # refused NEEDLE CMD ARGS...: exit 2, stderr's first line names NEEDLE, the usage follows
  local needle="$1" rc=0
  shift
  "$cedar" "$@" > /dev/null 2> "$tmp/err" || rc=$?
  local line
  line="$(head -1 "$tmp/err")"
  [[ $rc == 2 && "$line" == "cedar $1"* && "$line" == *"$needle"* ]] && grep -q "usage: cedar" "$tmp/err" ||
    { echo "cedar $*: exit $rc, not a refusal naming '$needle'"; cat "$tmp/err"; exit 1; }
}
for cmd in generate logits kernel-lab gpu-bench bench tokenize detokenize; do
  refused "unknown option '--bogus'" $cmd --bogus
  refused "unknown option '--bogus'" $cmd --bogus value
  rc=0
  "$cedar" $cmd --help > "$tmp/out" 2> "$tmp/err" || rc=$?
  [[ $rc == 0 ]] && grep -q "usage: cedar $cmd" "$tmp/out" && [[ ! -s "$tmp/err" ]] ||
    { echo "cedar $cmd --help: exit $rc"; cat "$tmp/out" "$tmp/err"; exit 1; }
done
refused "unknown option '--bogus'" bench compare --bogus
gen=(generate --model micro --prompt-ids 5)
refused "--max-tokens: 'abc' is not an integer" "${gen[@]}" --max-tokens abc
refused "--seed: '-1' is not an integer >= 0" "${gen[@]}" --seed -1
refused "--device: 'tpu' is not cpu or cuda" "${gen[@]}" --device tpu
refused "--model needs a value" generate --prompt-ids 5 --model
refused "--prompt-ids or --prompt, not both" "${gen[@]}" --prompt hello
refused "--prompt-ids or --prompt is required" generate --model micro
refused "--gpu-dense-bf16 needs --device cuda" "${gen[@]}" --gpu-dense-bf16
refused "--max-prefill-s does not go with --truncate on" "${gen[@]}" --max-prefill-s 1 --truncate on
refused "--out is required" logits --model micro --prompt-ids 5
refused "--chunk: '2y' is not an integer" logits --model micro --prompt-ids 5 --out "$tmp/x.bin" --chunk 2y
refused "--tokens needs --op moe, prefill or gemv" kernel-lab --op attention --tokens 64
refused "--op: 'nope' is not" kernel-lab --op nope
refused "--steps: '3q' is not an integer" gpu-bench --phases floor --steps 3q
refused "--layout tp2 needs --device cuda and --gpu-kernels fast" gpu-bench --phases floor --layout tp2
refused "--url is required" bench --out "$tmp/bench"
refused "--concurrency: '1,x' is not" bench --url http://127.0.0.1:1 --out "$tmp/bench" --concurrency 1,x
refused "give --text or --jsonl, not both" tokenize --text hi --jsonl "$tmp/none.jsonl"
# a value that looks like --help is still a value
"$cedar" tokenize --text -h > "$tmp/out" && grep -q '^\[' "$tmp/out" || { echo "tokenize --text -h"; exit 1; }
# --help answers at once with the usage (replay-quality once ran its whole benchmark instead)
timeout 10 "$cedar" replay-quality --help > "$tmp/out" || { echo "replay-quality --help failed"; exit 1; }
grep -q "usage: cedar replay-quality" "$tmp/out" || { echo "replay-quality --help printed no usage"; exit 1; }
# a directory rewritten unsharded keeps its old shards beside model.safetensors: every command
# (serve and shard too) reads what the directory's own layout says, not every *.safetensors
"$cedar" ckpt --preset micro --out "$tmp/resharded" --seed 1 --shard-gib 0.002 > /dev/null 2>&1
"$cedar" ckpt --preset micro --out "$tmp/resharded" --seed 1 > /dev/null 2>&1
(( $(ls "$tmp/resharded"/*.safetensors | wc -l) > 1 )) || { echo "the first write was not sharded"; exit 1; }
"$cedar" serve --model "$tmp/resharded" --host 127.0.0.1 --port 0 > "$tmp/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 300); do
  grep -q "listening on" "$tmp/serve.log" && break
  kill -0 "$serve_pid" 2> /dev/null || break
  sleep 0.1
done
listening=0
grep -q "listening on" "$tmp/serve.log" && listening=1
kill -TERM "$serve_pid" 2> /dev/null || true
wait "$serve_pid" 2> /dev/null || true
((listening)) || { echo "serve could not load a rewritten checkpoint directory"; cat "$tmp/serve.log"; exit 1; }
# prefix-bench builds its model with the pages it is given: a turn's hit is the whole pages of
# what the turn before left (320 tokens: 320 with pages of 16, 256 with pages of 256)
for pages in 16:320 256:256; do
  out="$("$cedar" prefix-bench --model micro --turns 2 --prefix 300 --turn-tokens 20 --gen 2 \
         --page-tokens "${pages%%:*}" 2> "$tmp/err")" || { echo "prefix-bench --page-tokens ${pages%%:*}"; cat "$tmp/err"; exit 1; }
  cached="$(awk '$1 == 2 { print $3 }' <<< "$out")"
  [[ "$cached" == "${pages##*:}" ]] ||
    { echo "prefix-bench --page-tokens ${pages%%:*}: turn 2 cached '$cached', not ${pages##*:}"; echo "$out"; exit 1; }
done
echo "model_cli: ok"
