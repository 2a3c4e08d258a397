// `cedar gpu-bench` output (see gpu_bench.hpp): a table on stdout and every figure as JSON.
#include <cstdio>
#include <cstring>

#include "net/json_writer.hpp"
#include "tools/cli/gpu_bench.hpp"

namespace cedar::cli::gpu_bench {
namespace {

/// The kernel set of a CUDA run; the CPU backend has one ("cpu").
const char* kernels_name(const options& o) {
  if (o.device != device_kind::cuda) return "cpu";
  if (o.kernels == gpu_kernels::exact) return "exact";
  return o.dense_bf16 ? "fast, dense bf16 kept" : "fast";
}
const char* kv_name(kv_dtype d) { return d == kv_dtype::fp8 ? "fp8" : "fp4"; }

void write_prefill(net::json_writer& w, const prefill_result& p) {
  w.obj().kv("tokens", p.tokens).kv("truncated", p.truncated).kv("chunk", p.chunk).kv("seconds", p.seconds)
      .kv("tok_s", p.tok_s).kv("rows_total", p.rows_total).key("rows_per_layer").arr();
  for (int64_t r : p.rows_per_layer) w.num(r);
  w.end_arr().kv("linear_flops", p.linear_flops).kv("linear_tflops", p.tflops).kv("blas_fraction", p.blas_fraction)
      .end_obj();
}

void write_decode(net::json_writer& w, const decode_result& d) {
  w.obj().kv("batch", d.batch).kv("context", d.context).kv("steps", d.steps).kv("fill_s", d.fill_s)
      .kv("step_ms", d.step_ms).kv("min_step_ms", d.min_step_ms).kv("tok_s", d.tok_s)
      .kv("experts_touched_per_layer", d.experts_touched).kv("experts_touched_from", "expected: E*(1-(1-k/E)^batch)")
      .kv("floor_bytes", d.floor_bytes).kv("floor_ms", d.floor_ms).kv("floor_fraction", d.floor_fraction)
      .key("floor_parts").arr();
  for (const step_bytes_part& p : d.parts) w.obj().kv("what", p.what).kv("bytes", p.bytes).end_obj();
  w.end_arr().end_obj();
}

std::string layout_name(const options& o) {
  return (o.layout_mode == parallel_mode::tp ? "tp" : "dep") + std::to_string(o.layout_size);
}

}  // namespace

bool write_json(const report& r, const std::string& path) {
  const options& o = r.opts;
  net::json_writer w;
  w.obj().kv("model", o.model).kv("seed", int64_t(o.seed)).kv("device", r.device)
      .kv("gpu_kernels", kernels_name(o)).kv("kv_dtype", kv_name(o.kv)).kv("page_tokens", o.page_tokens)
      .kv("layout", layout_name(o)).kv("load_s", r.load_s);
  w.key("ceilings").obj().kv("device", r.ceil.device).kv("copy_gbps", r.ceil.copy_gbps)
      .kv("blas_tflops", r.ceil.blas_tflops).kv("blas_dtype", r.ceil.blas_dtype).kv("blas_shape", "8192x8192x8192")
      .end_obj();
  w.kv("linear_flops_per_token", r.linear_flops_per_token).key("floor").arr();
  for (const decode_result& d : r.floor) write_decode(w, d);
  w.end_arr().key("decode").arr();
  for (const decode_result& d : r.decode) write_decode(w, d);
  w.end_arr().key("prefill").arr();
  for (const prefill_result& p : r.prefill) write_prefill(w, p);
  w.end_arr().key("truncation").arr();
  for (const truncation_result& t : r.truncation) {
    w.obj().kv("tokens", t.full.tokens).kv("speedup", t.speedup).key("full");
    write_prefill(w, t.full);
    w.key("truncated");
    write_prefill(w, t.truncated);
    w.end_obj();
  }
  w.end_arr().key("prefix").arr();
  for (const prefix_result& p : r.prefix)
    w.obj().kv("prefix_tokens", p.prefix_tokens).kv("new_tokens", p.new_tokens).kv("replay_tokens", p.replay_tokens)
        .kv("truncated", p.truncated).kv("cold_ttft_s", p.cold_ttft_s).kv("replay_s", p.replay_s).kv("new_s", p.new_s)
        .kv("hit_ttft_s", p.hit_ttft_s).kv("speedup", p.speedup)
        .kv("first_token_equal", p.first_token_equal).end_obj();
  w.end_arr().key("generate").arr();
  for (const generate_result& g : r.generate)
    w.obj().kv("prompt_tokens", g.prompt_tokens).kv("gen_tokens", g.gen_tokens).kv("truncated", g.truncated)
        .kv("load_s", g.load_s).kv("prefill_s", g.prefill_s).kv("prefill_tok_s", g.prefill_tok_s)
        .kv("decode_s", g.decode_s).kv("decode_tok_s", g.decode_tok_s).end_obj();
  w.end_arr().end_obj();
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "gpu-bench: cannot write %s\n", path.c_str());
    return false;
  }
  std::fprintf(f, "%s\n", w.str().c_str());
  return std::fclose(f) == 0;
}

void print_table(const report& r) {
  const options& o = r.opts;
  if (r.decode.empty() && r.prefill.empty() && r.truncation.empty() && r.prefix.empty() && r.generate.empty()) return;
  std::printf("model %s (seed %llu) on %s, layout %s, kernels %s, KV %s in pages of %d tokens, load %.1f s\n",
              o.model.c_str(), (unsigned long long)o.seed, r.device.c_str(), layout_name(o).c_str(), kernels_name(o),
              kv_name(o.kv), o.page_tokens, r.load_s);
  if (r.ceil.copy_gbps > 0)
    std::printf("ceilings: copy %.0f GB/s (1 GiB device to device), cuBLASLt %s 8192^3 %.0f TFLOP/s\n",
                r.ceil.copy_gbps, r.ceil.blas_dtype.c_str(), r.ceil.blas_tflops);
  if (!r.decode.empty()) {
    std::printf("\ndecode (synthetic KV)  %7s %6s %10s %9s %10s %9s %8s %8s\n", "context", "batch", "step ms",
                "tok/s", "floor MB", "floor ms", "% floor", "experts");
    for (const decode_result& d : r.decode)
      std::printf("%22s %7lld %6d %10.2f %9.1f %10.1f %9.3f %7.1f%% %8.1f\n", "", (long long)d.context, d.batch,
                  d.step_ms, d.tok_s, d.floor_bytes / 1e6, d.floor_ms, 100 * d.floor_fraction, d.experts_touched);
    char how[96] = "greedy";
    if (o.temperature > 0)
      std::snprintf(how, sizeof how, "sampled at temperature %g, top-p %g", double(o.temperature), double(o.top_p));
    if (o.logprobs > 0)
      std::snprintf(how + std::strlen(how), sizeof how - std::strlen(how), ", one request with %d top logprobs",
                    o.logprobs);
    std::printf("%22s a step is the serving shard's (%s, where the model samples); experts:\n"
                "%22s expected distinct routed experts per layer, E(1-(1-k/E)^batch)\n",
                "", how, "");
  }
  const auto prefill_row = [](const char* what, const prefill_result& p) {
    std::printf("%-22s %7lld %6s %10.3f %9.1f %10lld %9.2f %7.2f%%\n", what, (long long)p.tokens,
                p.truncated ? "yes" : "no", p.seconds, p.tok_s, (long long)p.rows_total, p.tflops, 100 * p.blas_fraction);
  };
  if (!r.prefill.empty() || !r.truncation.empty()) {
    std::printf("\n%-22s %7s %6s %10s %9s %10s %9s %8s\n", "prefill", "tokens", "trunc", "seconds", "tok/s",
                "rows", "TFLOP/s", "% blas");
    for (const prefill_result& p : r.prefill) prefill_row("", p);
    for (const truncation_result& t : r.truncation) {
      prefill_row("truncation: without", t.full);
      prefill_row("            with", t.truncated);
      std::printf("%-22s speedup %.2fx, rows %lld -> %lld\n", "", t.speedup, (long long)t.full.rows_total,
                  (long long)t.truncated.rows_total);
    }
  }
  for (const prefix_result& p : r.prefix)
    std::printf("\nprefix hit: %lld cached + %lld new tokens (truncation %s): cold TTFT %.3f s; hit TTFT %.3f s "
                "(replay %lld tokens %.3f s + new tokens %.3f s): %.1fx; first token %s the cold one\n",
                (long long)p.prefix_tokens, (long long)p.new_tokens, p.truncated ? "on" : "off", p.cold_ttft_s,
                p.hit_ttft_s, (long long)p.replay_tokens, p.replay_s, p.new_s, p.speedup,
                p.first_token_equal ? "equals" : "differs from");
  for (const generate_result& g : r.generate)
    std::printf("\ngenerate: %lld-token prompt (truncation %s), %d tokens: load %.1f s, prefill %.2f s (%.1f tok/s), "
                "decode %.1f tok/s\n",
                (long long)g.prompt_tokens, g.truncated ? "on" : "off", g.gen_tokens, g.load_s, g.prefill_s,
                g.prefill_tok_s, g.decode_tok_s);
}

}  // namespace cedar::cli::gpu_bench
