// Percentiles, the throughput read at an interactivity bound, and the prefix-cache hit rate
// read from Prometheus text.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "tools/bench/prometheus.hpp"
#include "tools/bench/report.hpp"
#include "tools/bench/stats.hpp"
#include "tools/bench/svg.hpp"

using namespace cedar::bench;

TEST_CASE("percentiles interpolate linearly between sorted samples") {
  CHECK_FALSE(percentile({}, 50));
  CHECK(*percentile({7}, 99) == 7);
  std::vector<double> v = {5, 1, 4, 2, 3};
  CHECK(*percentile(v, 0) == 1);
  CHECK(*percentile(v, 50) == 3);
  CHECK(*percentile(v, 90) == doctest::Approx(4.6));  // rank 3.6: 4 + 0.6 * (5 - 4)
  CHECK(*percentile(v, 100) == 5);
  auto s = summarize(v);
  CHECK(*s.mean == 3);
  CHECK(*s.p99 == doctest::Approx(4.96));
}

TEST_CASE("percentiles of random samples: ordered, bounded, and splitting the samples") {
  std::mt19937 rng(5);
  std::exponential_distribution<double> dist(0.1);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> v(1 + rng() % 500);
    for (auto& x : v) x = dist(rng);
    double prev = -1;
    for (double q : {0.0, 10.0, 50.0, 90.0, 99.0, 100.0}) {
      double p = *percentile(v, q);
      CHECK(p >= prev);
      prev = p;
      // At least q% of the samples are <= p and at least (100-q)% are >= p.
      double below = double(std::count_if(v.begin(), v.end(), [&](double x) { return x <= p; }));
      double above = double(std::count_if(v.begin(), v.end(), [&](double x) { return x >= p; }));
      CHECK(below >= q / 100 * double(v.size() - 1));
      CHECK(above >= (100 - q) / 100 * double(v.size() - 1));
    }
    CHECK(*percentile(v, 0) == *std::min_element(v.begin(), v.end()));
    CHECK(*percentile(v, 100) == *std::max_element(v.begin(), v.end()));
  }
}

TEST_CASE("throughput at an interactivity bound follows the curve") {
  std::vector<curve_point> curve = {{40, 300}, {10, 1000}, {20, 800}};  // any order
  CHECK(*throughput_at_bound(curve, 20) == doctest::Approx(800));
  CHECK(*throughput_at_bound(curve, 30) == doctest::Approx(550));
  CHECK(*throughput_at_bound(curve, 15) == doctest::Approx(900));
  CHECK(*throughput_at_bound(curve, 5) == doctest::Approx(1000));  // every point qualifies
  CHECK_FALSE(throughput_at_bound(curve, 50));                    // the curve never gets there
  CHECK_FALSE(throughput_at_bound({}, 1));
}

TEST_CASE("throughput at a bound equals the best value of a dense walk along the curve") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0, 100);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<curve_point> curve(2 + rng() % 6);
    for (auto& p : curve) p = {u(rng), u(rng) * 10};
    double bound = u(rng);
    auto sorted = curve;
    std::sort(sorted.begin(), sorted.end(),
              [](auto& a, auto& b) { return a.interactivity < b.interactivity; });
    std::optional<double> best;
    for (size_t i = 0; i + 1 < sorted.size(); ++i)
      for (int k = 0; k <= 20000; ++k) {
        double t = k / 20000.0;
        double x = sorted[i].interactivity + t * (sorted[i + 1].interactivity - sorted[i].interactivity);
        double y = sorted[i].throughput + t * (sorted[i + 1].throughput - sorted[i].throughput);
        if (x >= bound) best = std::max(best.value_or(y), y);
      }
    auto got = throughput_at_bound(curve, bound);
    REQUIRE(bool(got) == bool(best));
    if (got) CHECK(*got == doctest::Approx(*best).epsilon(1e-3));
  }
}

TEST_CASE("prefix-cache hit rate from Prometheus counters, or a gauge, or nothing") {
  const char* before =
      "# HELP x_prompt_tokens_total prompt tokens\n"
      "x_prompt_tokens_total{model=\"a\"} 1000\n"
      "x_prompt_tokens_total{model=\"b\"} 1000\n"
      "x_prefix_cache_hit_tokens_total 1500\n";
  const char* after =
      "x_prompt_tokens_total{model=\"a\"} 2000\n"
      "x_prompt_tokens_total{model=\"b\"} 2000\n"
      "x_prefix_cache_hit_tokens_total 3300\n"
      "x_prefix_cache_hit_rate 0.5\n";
  auto b = parse_prefix_cache_metrics(before), a = parse_prefix_cache_metrics(after);
  CHECK(*b.prompt_tokens == 2000);
  CHECK(*prefix_hit_rate(b, a) == doctest::Approx(0.9));  // 1800 of 2000 new prompt tokens
  auto gauge_only = parse_prefix_cache_metrics("cedar_prefix_cache_hit_rate 0.97\n");
  CHECK(*prefix_hit_rate({}, gauge_only) == doctest::Approx(0.97));
  auto vllm = parse_prefix_cache_metrics(
      "vllm:prefix_cache_queries_total{engine=\"0\"} 400\nvllm:prefix_cache_hits_total{engine=\"0\"} 300\n"
      "vllm:prompt_tokens_total{engine=\"0\"} 999\n");
  CHECK(*vllm.prompt_tokens == 400);
  CHECK(*vllm.hit_tokens == 300);
  CHECK_FALSE(prefix_hit_rate({}, parse_prefix_cache_metrics("http_requests_total 5\n")));
  // The looked-up tokens are the denominator when exported; "cached prompt" counters never are.
  auto cedar = parse_prefix_cache_metrics(
      "cedar_prefix_cache_hit_rate 0.5\ncedar_prefix_cache_lookup_tokens_total 800\n"
      "cedar_prefix_cache_hit_tokens_total 600\ncedar_prompt_tokens_total 1000\n"
      "cedar_cached_prompt_tokens_total 600\n");
  CHECK(*cedar.prompt_tokens == 800);
  auto no_lookup = parse_prefix_cache_metrics(
      "x_prefix_cache_hit_tokens_total 600\nx_prompt_tokens_total 1000\nx_cached_prompt_tokens_total 600\n");
  CHECK(*no_lookup.prompt_tokens == 1000);
}

TEST_CASE("chart ticks are 1-2-5 steps and the SVG names every curve") {
  CHECK(nice_tick_step(100, 5) == 20);
  CHECK(nice_tick_step(7, 6) == 2);
  CHECK(nice_tick_step(0.9, 6) == doctest::Approx(0.2));
  std::string svg = render_svg({{"chat", {{10, 100}, {5, 180}}}, {"ws <b>", {{12, 120}}}},
                               {"t", "x", "y", 8.0});
  CHECK(svg.find("<svg") == 0);
  CHECK(svg.find(">chat</text>") != std::string::npos);
  CHECK(svg.find("ws &lt;b&gt;") != std::string::npos);
  CHECK(svg.find("<polyline") != std::string::npos);
  CHECK(svg.find("stroke-dasharray") != std::string::npos);
}

TEST_CASE("report curves keep sweep order and concurrency, and read back from results.json") {
  bench_report report;
  config_result cfg{"a", "chat", {}};
  for (int c : {1, 2, 4}) {
    point_result p;
    p.concurrency = c;
    p.output_tokens_per_s = 100.0 * c;
    p.interactivity = 90.0 / c;
    cfg.points.push_back(p);
  }
  cfg.points.push_back(point_result{});  // no interactivity: left out of the curve
  report.configs.push_back(cfg);
  auto curves = report_curves(report);
  REQUIRE(curves.size() == 1);
  REQUIRE(curves[0].points.size() == 3);
  CHECK(curves[0].points[2].concurrency == 4);
  auto path = std::filesystem::temp_directory_path() / "cedar_bench_report_test.json";
  { std::ofstream(path) << report_json(report); }
  std::vector<named_curve> back;
  std::string error;
  REQUIRE(read_report_curves(path.string(), back, error));
  std::filesystem::remove(path);
  REQUIRE(back.size() == 1);
  CHECK(back[0].name == "a");
  REQUIRE(back[0].points.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(back[0].points[i].concurrency == curves[0].points[i].concurrency);
    CHECK(back[0].points[i].throughput == doctest::Approx(curves[0].points[i].throughput));
    CHECK(back[0].points[i].interactivity == doctest::Approx(curves[0].points[i].interactivity));
  }
  CHECK(render_svg(curves, {}).find(">c=4</text>") != std::string::npos);
}
