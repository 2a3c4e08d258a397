// `cedar kernel-lab --op NAME [--out FILE.json] [--quick] [--tokens N] [--tile NAME]`: validates every variant of a CUDA
// op against the CPU op and times it next to the H200's own ceilings measured in the same run
// (device-to-device copy bandwidth, a cuBLASLt matrix product), then estimates the decode-step
// HBM floor of bench-40L-E64 and how close the lab's kernels come to it.
// Ops: linear_fp8, linear_fp4, moe, prefill (the fast kernel set's large-m path, the bf16 GEMV),
// gemv (the bf16 GEMV at 1..16 rows),
// attention (fused decode attention and indexer), mhc (the mHC boundary), ceilings, floor, all. A
// build without CUDA says so.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "config/model_config.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/kernel_lab.hpp"
#include "tools/cli/registry.hpp"
#include "tools/cli/roofline.hpp"

namespace {

using namespace cedar;
using lab::lab_case;

struct options {
  std::string op, out;
  bool quick = false;
  lab::moe_filter moe;  ///< --tokens, --tile: one case of --op moe (a single kernel to profile)
  std::string shape;    ///< --shape: one weight of --op linear_fp8 / linear_fp4
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: cedar kernel-lab --op OP [--out FILE.json] [--quick]\n"
               "       OP: linear_fp8|linear_fp4|moe|prefill|gemv|attention|mhc|ceilings|floor|all\n"
               "       --op moe: [--tokens N] (1..65536: that token count only)\n"
               "                      [--tile gemv|narrow|narrow16|narrow32|split4|split8|skinny|wide|stream]\n"
               "                      (--op moe only: that tile only; a narrow tile with its form on x's pairs,\n"
               "                      narrow.pairs, narrow16.pairs or narrow32.pairs for that form only);\n"
               "       with both, one grouped kernel per matrix, e.g. for\n"
               "       ncu --kernel-name regex:tiled_kernel --launch-count 1 cedar kernel-lab --op moe ...\n"
               "       --op prefill --tokens N: only the routed + shared experts (moe_ffn) at N tokens\n"
               "       --op gemv [--tokens N]: the bf16 GEMV (head, wo_a, router, compressor) at N rows\n"
               "                      (default 1, 2, 4, 8, 16), staged and plain column modes\n"
               "       --op linear_fp8|linear_fp4 only: [--shape NAME] (that weight only: attn.wq_a, attn.wq_b,\n"
               "                      attn.wkv, attn.wo_b, shared.w1, shared.w2, shared.w13 (w1 and w3\n"
               "                      as one product), square; expert.w13, expert.w2)\n"
               "       weights stream from HBM (copies cycled past the 50 MB L2); CEDAR_LAB_L2_WARM=1 keeps\n"
               "       one copy, left in L2 between calls, for the dense linears and the GEMV\n");
}

/// "a, b or c" of a list of names.
template <class Names>
std::string one_of(const Names& names) {
  std::string out;
  for (std::size_t i = 0; i < std::size(names); ++i)
    out += (i == 0 ? "" : i + 1 == std::size(names) ? " or " : ", ") + std::string(names[i]);
  return out;
}

/// Empty when the arguments are taken; otherwise why not, naming the flag.
std::string parse(cli::arg_reader& r, options& o) {
  static const char* const ops[] = {"linear_fp8", "linear_fp4", "moe",      "prefill", "gemv",
                                    "attention",  "mhc",        "ceilings", "floor",   "all"};
  static const char* const tiles[] = {"gemv",   "narrow",       "narrow16",       "narrow32",
                                      "split4", "split8",       "skinny",         "wide",
                                      "stream", "narrow.pairs", "narrow16.pairs", "narrow32.pairs"};
  const auto listed = [](const auto& names, const std::string& v) {
    return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return v == n; });
  };
  while (r.next()) {
    const std::string& a = r.flag();
    if (a == "--quick") o.quick = true;
    else if (a == "--op") {
      if (r.value(o.op) && !listed(ops, o.op)) r.bad_value(o.op, one_of(ops));
    } else if (a == "--out") r.value(o.out);
    else if (a == "--tokens") r.integer(o.moe.tokens, 1, 65536);
    else if (a == "--tile") {
      if (r.value(o.moe.tile) && !listed(tiles, o.moe.tile)) r.bad_value(o.moe.tile, one_of(tiles));
    } else if (a == "--shape") r.value(o.shape);
    else r.unknown();
  }
  if (r.help() || !r.error().empty()) return r.error();
  if (o.op.empty()) return "--op is required";
  if (!o.moe.tile.empty() && o.op != "moe") return "--tile needs --op moe";
  if (o.moe.tokens > 0 && o.op != "moe" && o.op != "prefill" && o.op != "gemv")
    return "--tokens needs --op moe, prefill or gemv";
  if (!o.shape.empty()) {
    const auto named = [&](const auto& shapes) {
      return std::any_of(std::begin(shapes), std::end(shapes), [&](const lab::linear_shape& s) { return o.shape == s.name; });
    };
    const auto names = [](const auto& shapes) {
      std::vector<const char*> v;
      for (const lab::linear_shape& s : shapes) v.push_back(s.name);
      return one_of(v);
    };
    if (o.op != "linear_fp8" && o.op != "linear_fp4") return "--shape needs --op linear_fp8 or linear_fp4";
    if (o.op == "linear_fp8" && !named(lab::fp8_shapes))
      return "--shape: '" + o.shape + "' is not a weight of --op linear_fp8 (" + names(lab::fp8_shapes) + ")";
    if (o.op == "linear_fp4" && !named(lab::fp4_shapes))
      return "--shape: '" + o.shape + "' is not a weight of --op linear_fp4 (" + names(lab::fp4_shapes) + ")";
  }
  return "";
}

#ifdef CEDAR_HAVE_CUDA

struct lab_ceilings {
  std::string device;
  double copy_gbps = 0;    ///< device-to-device copy, read + write bytes per second
  double blas_tflops = 0;  ///< cuBLASLt 8192^3
  std::string blas_dtype;
};

/// One part of a decode step's HBM traffic.
struct floor_part {
  std::string what;
  double bytes = 0;
  double gbps = 0;  ///< rate the lab measured for the kernel that reads it (copy rate if none)
  std::string rate_from;
};

/// The decode step's HBM traffic at batch 1 (tools/cli/roofline.hpp), each part to be given a rate.
std::vector<floor_part> decode_bytes(const model_args& a, int64_t context) {
  std::vector<floor_part> parts;
  for (const cli::step_bytes_part& p : cli::decode_step_bytes(a, kv_layout::make(a, kv_dtype::fp4), context, 1))
    parts.push_back({p.what, p.bytes, 0, ""});
  return parts;
}

double gbps(const lab_case& c) { return c.time_us > 0 ? c.bytes / (c.time_us * 1e3) : 0; }
double tflops(const lab_case& c) { return c.time_us > 0 ? c.flops / (c.time_us * 1e6) : 0; }

/// Bytes-weighted rate of the cases that match (time-weighted mean: total bytes / total time).
double rate_of(const std::vector<lab_case>& cases, const char* op, int m, const char* variant) {
  double bytes = 0, us = 0;
  for (const lab_case& c : cases)
    if (c.op == op && c.m == m && c.variant == variant) bytes += c.bytes, us += c.time_us;
  return us > 0 ? bytes / (us * 1e3) : 0;
}

void write_json(const std::string& path, const lab_ceilings& ceil, const std::vector<lab_case>& cases,
                const std::vector<floor_part>& parts, int64_t context) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "kernel-lab: cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"copy_gbps\": %.1f,\n  \"blas_tflops\": %.1f,\n  \"blas_dtype\": \"%s\",\n",
               ceil.device.c_str(), ceil.copy_gbps, ceil.blas_tflops, ceil.blas_dtype.c_str());
  std::fprintf(f, "  \"error_bound\": %.9g,\n  \"cases\": [\n", lab::err_bound);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const lab_case& c = cases[i];
    std::fprintf(f,
                 "    {\"op\": \"%s\", \"variant\": \"%s\", \"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
                 "\"groups\": %d, \"time_us\": %.3f, \"eager_us\": %.3f, \"bytes\": %.0f, \"flops\": %.0f, \"gbps\": %.1f, "
                 "\"tflops\": %.2f, \"checked\": %s, \"pass\": %s, \"max_err_ratio\": %.3g, \"same_bits\": %s}%s\n",
                 c.op.c_str(), c.variant.c_str(), c.shape.c_str(), c.m, c.n, c.k, c.groups, c.time_us, c.eager_us, c.bytes,
                 c.flops, gbps(c), tflops(c), c.checked ? "true" : "false", c.pass ? "true" : "false",
                 c.max_err_ratio, c.same_bits ? "true" : "false", i + 1 < cases.size() ? "," : "");
  }
  std::fprintf(f, "  ],\n  \"decode_floor\": {\"preset\": \"bench-40L-E64\", \"batch\": 1, \"context\": %lld, \"parts\": [\n",
               (long long)context);
  for (std::size_t i = 0; i < parts.size(); ++i)
    std::fprintf(f, "    {\"what\": \"%s\", \"bytes\": %.0f, \"gbps\": %.1f, \"rate_from\": \"%s\"}%s\n",
                 parts[i].what.c_str(), parts[i].bytes, parts[i].gbps, parts[i].rate_from.c_str(),
                 i + 1 < parts.size() ? "," : "");
  std::fprintf(f, "  ]}\n}\n");
  std::fclose(f);
}

void print_cases(const lab_ceilings& ceil, const std::vector<lab_case>& cases) {
  std::printf("%-10s %-16s %-13s %5s %6s %6s %9s %9s %8s %6s %8s %6s %9s %s\n", "op", "shape", "variant", "m", "n",
              "k", "graph_us", "eager_us", "GB/s", "%copy", "TFLOP/s", "%blas", "err/sum", "check");
  for (const lab_case& c : cases) {
    const char* verdict = !c.checked ? "-" : !c.pass ? "FAIL" : c.same_bits ? "ok" : "ok (bits differ)";
    std::printf("%-10s %-16s %-13s %5d %6d %6d %9.2f %9.2f %8.0f %5.0f%% %8.1f %5.0f%% %9.2e %s\n", c.op.c_str(),
                c.shape.c_str(), c.variant.c_str(), c.m, c.n, c.k, c.time_us, c.eager_us, gbps(c),
                100 * gbps(c) / ceil.copy_gbps, tflops(c), 100 * tflops(c) / ceil.blas_tflops, c.max_err_ratio, verdict);
  }
}

#endif  // CEDAR_HAVE_CUDA

int kernel_lab_main(int argc, char** argv) {
  options o;
  cli::arg_reader reader(argc, argv);
  const std::string refused = parse(reader, o);
  if (reader.help()) return usage(stdout), 0;
  if (!refused.empty()) return cli::refuse("kernel-lab", refused, usage);
#ifndef CEDAR_HAVE_CUDA
  std::fprintf(stderr, "kernel-lab: built without CUDA\n");
  return 1;
#else
  if (!cuda::available()) {
    std::fprintf(stderr, "kernel-lab: %s\n", cuda::status().c_str());
    return 1;
  }
  void* lab_stream = cuda::fast::create_stream();  // graphs cannot capture the legacy stream
  cuda::set_stream(lab_stream);
  cuda::keep_scratch_mapped();  // as the model does: scratch is not re-mapped on every call
  lab_ceilings ceil;
  ceil.device = cuda::status();
  ceil.copy_gbps = cuda::fast::copy_bandwidth_gbps(std::size_t(1) << 30);
  {
    cuda::fast::blaslt_gemm blas(8192, 8192, 8192);
    if (blas.ok()) {
      const double ms = cuda::fast::time_ms([&](int) { blas.run(); }, 3, 20);
      ceil.blas_tflops = 2.0 * 8192.0 * 8192.0 * 8192.0 / (ms * 1e9);
      ceil.blas_dtype = blas.dtype();
    }
  }
  std::printf("device    %s\nceilings  copy %.0f GB/s (1 GiB device-to-device), cuBLASLt %s 8192^3 %.0f TFLOP/s\n",
              ceil.device.c_str(), ceil.copy_gbps, ceil.blas_dtype.c_str(), ceil.blas_tflops);
  std::vector<lab_case> cases;
  auto add = [&](std::vector<lab_case> v) { cases.insert(cases.end(), v.begin(), v.end()); };
  if (o.op == "linear_fp8" || o.op == "all") add(lab::run_linear_cases(false, o.quick, o.shape));
  if (o.op == "linear_fp4" || o.op == "all") add(lab::run_linear_cases(true, o.quick, o.shape));
  if (o.op == "moe" || o.op == "all") add(lab::run_moe_cases(o.quick, o.moe));
  if (o.op == "prefill" || o.op == "all") add(lab::run_prefill_cases(o.quick, o.moe.tokens));
  if (o.op == "gemv" || o.op == "all") add(lab::run_gemv_cases(o.moe.tokens));
  if (o.op == "attention" || o.op == "all") add(lab::run_attention_cases(o.quick));
  if (o.op == "mhc" || o.op == "all") add(lab::run_mhc_cases(o.quick));

  constexpr int64_t context = 8192;
  std::vector<floor_part> parts;
  std::string error;
  if (auto args = load_model_args("bench-40L-E64", &error)) parts = decode_bytes(*args, context);
  else std::fprintf(stderr, "kernel-lab: bench-40L-E64: %s\n", error.c_str());
  const double fp8_rate = rate_of(cases, "linear_fp8", 1, "gemv");
  const double moe_rate = rate_of(cases, "moe_up", 1, "gemv") > 0
                              ? 0.5 * (rate_of(cases, "moe_up", 1, "gemv") + rate_of(cases, "moe_down", 1, "gemv"))
                              : 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    parts[i].gbps = ceil.copy_gbps, parts[i].rate_from = "copy (no lab kernel)";
    if (i == 0 && fp8_rate > 0) parts[i].gbps = fp8_rate, parts[i].rate_from = "linear_fp8 gemv m=1";
    if (i == 2 && moe_rate > 0) parts[i].gbps = moe_rate, parts[i].rate_from = "moe gemv 1 token";
  }
  if (!cases.empty()) print_cases(ceil, cases);
  double bytes = 0, lab_ms = 0;
  for (const floor_part& p : parts) bytes += p.bytes, lab_ms += p.bytes / (p.gbps * 1e6);
  std::printf("\ndecode step, bench-40L-E64, batch 1, %lld context:\n", (long long)context);
  for (const floor_part& p : parts)
    std::printf("  %-62s %9.1f MB  at %6.0f GB/s (%s)\n", p.what.c_str(), p.bytes / 1e6, p.gbps, p.rate_from.c_str());
  const double floor_ms = bytes / (ceil.copy_gbps * 1e6);
  std::printf("  total %.1f MB: HBM floor %.3f ms at the copy rate; at the lab's rates %.3f ms (%.0f%% of the floor)\n",
              bytes / 1e6, floor_ms, lab_ms, lab_ms > 0 ? 100 * floor_ms / lab_ms : 0.0);
  if (!o.out.empty()) write_json(o.out, ceil, cases, parts, context);
  cuda::synchronize();
  cuda::set_stream(nullptr);
  cuda::fast::destroy_stream(lab_stream);
  const bool all_pass = std::all_of(cases.begin(), cases.end(), [](const lab_case& c) { return c.pass; });
  std::printf("%s\n", all_pass ? "all checked variants within the bound" : "SOME VARIANTS FAILED THE CHECK");
  return all_pass ? 0 : 1;
#endif
}

}  // namespace

CEDAR_COMMAND("kernel-lab", "validate and time the CUDA kernels against the GPU's measured ceilings",
              kernel_lab_main);
