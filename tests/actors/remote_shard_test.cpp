// A shard in a second process (`cedar shard --connect 127.0.0.1:PORT`, the `cedar` binary
// next to this test) joined through CAF's middleman: the engine's tp1 layout moves onto it and
// serves the tokens the local shard served; when the process is killed the engine rebuilds on
// a local shard and serves them again. A shard whose model (shape, KV format, Engram token map,
// weights) differs from the engine's is refused at join and exits.
#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <mutex>
#include <thread>

#include "actors/engine.hpp"
#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"
#include "net/engram_map.hpp"
#include "net/tokenizer.hpp"

extern char** environ;

using namespace cedar;

namespace {

constexpr uint64_t seed = 77;

/// Runs `n` prompts to completion, one after another; returns their tokens.
std::vector<std::vector<int32_t>> generate(engine& e, int n) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    request_spec spec;
    for (int k = 0; k < 9 + 3 * i; ++k) spec.prompt.push_back(5 + (i * 977 + k * 31) % 7000);
    spec.max_tokens = 6;
    spec.ignore_eos = true;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> tokens;
    std::string reason;
    auto id = e.submit(spec, [&](const token_batch& b) {
      std::lock_guard<std::mutex> lock(mu);
      tokens.insert(tokens.end(), b.ids.begin(), b.ids.end());
      if (b.finished) reason = b.finish_reason;
      cv.notify_all();
    });
    REQUIRE(id.ok());
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return !reason.empty(); }));
    CHECK(reason == "length");
    out.push_back(tokens);
  }
  return out;
}

/// Polls until pred(layout_info) holds; false after timeout_s.
template <class Pred>
bool wait_layout(engine& e, Pred pred, int timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    auto st = e.layout_info();
    if (st.ok() && pred(st.value())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

/// The engine a shard process joins: micro with `seed`, room for a few requests, a shard port.
struct shard_host {
  std::unique_ptr<engine> e;
  engine_options o;
  /// The runtime's events as "name key=value ...", in order.
  struct event_list {
    std::mutex mu;
    std::vector<std::string> lines;
  };
  std::shared_ptr<event_list> events = std::make_shared<event_list>();

  explicit shard_host(model_args args) {
    o.on_event = [events = events](const std::string& name, const std::vector<runtime_event_field>& fields) {
      std::string line = name;
      for (const auto& f : fields) line += " " + f.key + "=" + f.text;
      std::lock_guard lock(events->mu);
      events->lines.push_back(line);
    };
    o.page_tokens = 16;
    o.kv_budget_bytes = int64_t(32) << 20;
    o.shard_port = 0;
    auto weights = std::make_shared<tensor_map>(make_random_weights(args, seed));
    args.weights_digest = weights->digest();  // as `cedar serve` and `cedar shard` set it
    auto started = engine::start(args, std::move(weights), o);
    REQUIRE(started.ok());
    e = std::move(started.value());
    REQUIRE(e->shard_port() > 0);
  }

  /// Starts `cedar shard` against this engine (its weights from `shard_seed`); its pid.
  pid_t spawn_shard(uint64_t shard_seed = seed) const {
    const std::filesystem::path bin = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "cedar";
    REQUIRE_MESSAGE(std::filesystem::exists(bin), "build the cedar target next to this test: " << bin);
    const std::string connect = "127.0.0.1:" + std::to_string(e->shard_port());
    std::vector<std::string> argv_s{bin.string(), "shard", "--connect", connect, "--model", "micro",
                                    "--seed", std::to_string(shard_seed), "--page-tokens", "16",
                                    "--kv-budget-bytes", std::to_string(o.kv_budget_bytes)};
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t child = 0;
    REQUIRE(posix_spawn(&child, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
    return child;
  }
};

model_args micro_args() {
  std::string error;
  auto args = load_model_args("micro", &error);
  REQUIRE_MESSAGE(args, error);
  return *args;
}

/// micro as `cedar serve` and `cedar shard` build it: Engram ids through the tokenizer's map.
model_args served_micro_args() {
  model_args args = micro_args();
  std::string error;
  const auto tok = net::tokenizer::load_dsv41(net::tokenizer::default_path(), &error);
  REQUIRE_MESSAGE(tok, error);
  REQUIRE_MESSAGE(net::attach_engram_token_map(args, *tok, &error), error);
  return args;
}

/// The IPv4 address a listening TCP socket on `port` is bound to, as /proc/net/tcp writes it
/// ("0100007F" is 127.0.0.1); empty when there is none.
std::string listen_address(int port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);  // the header
  char want[8];
  std::snprintf(want, sizeof want, "%04X", port);
  while (std::getline(f, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const auto colon = local.find(':');
    if (state == "0A" && colon != std::string::npos && local.substr(colon + 1) == want) return local.substr(0, colon);
  }
  return {};
}

}  // namespace

TEST_CASE("remote shard: the shard port listens on the loopback address unless told otherwise") {
  shard_host host(micro_args());
  CHECK(listen_address(host.e->shard_port()) == "0100007F");
}

TEST_CASE("remote shard: a second process serves the tp1 layout, and its death is survived") {
  shard_host host(served_micro_args());
  engine& e = *host.e;
  const auto local = generate(e, 4);
  const pid_t child = host.spawn_shard();
  /// The events so far, each cut to its name and first field.
  auto events = [&] {
    std::lock_guard lock(host.events->mu);
    std::vector<std::string> heads;
    for (const auto& line : host.events->lines) heads.push_back(line.substr(0, line.find(' ', line.find(' ') + 1)));
    return heads;
  };

  const bool joined = wait_layout(e, [](const layout_status& s) { return s.shards.size() == 1 && s.shards[0].remote; }, 60);
  CHECK(joined);
  if (joined) {
    CHECK(generate(e, 4) == local);  // the same model, the same bits, in another process
    const layout_status st = e.layout_info().value();
    CHECK(st.shards[0].remote);
    CHECK(st.shards[0].steps > 0);  // the steps ran over there
  }

  kill(child, SIGKILL);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  CHECK(wait_layout(e, [](const layout_status& s) { return s.shards.size() == 1 && !s.shards[0].remote; }, 20));
  CHECK(e.healthy());
  CHECK(generate(e, 4) == local);
  // What the operator's log shows: the join and the move onto it, the loss and the rebuild.
  const std::vector<std::string> want = {"shard_joined pool=1", "layout_rebuilt cause=shard_joined",
                                         "shard_lost rank=0", "layout_rebuilt cause=shard_failed"};
  CHECK(events() == want);
}

TEST_CASE("remote shard: a shard whose Engram hash or weights differ is refused at join, the engine goes on") {
  for (const bool other_weights : {false, true}) {
    CAPTURE(other_weights);
    // other_weights: the same config and Engram map, weights from another seed (another revision
    // of a checkpoint); else the engine hashes token ids and the shard the tokenizer's classes.
    shard_host host(other_weights ? served_micro_args() : micro_args());
    engine& e = *host.e;
    const auto local = generate(e, 2);
    const pid_t child = host.spawn_shard(other_weights ? seed + 1 : seed);
    int wstatus = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    pid_t done = 0;
    while ((done = waitpid(child, &wstatus, WNOHANG)) == 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (done == 0) kill(child, SIGKILL), waitpid(child, &wstatus, 0);
    CHECK(done == child);  // it gave up by itself
    CHECK(WIFEXITED(wstatus));
    CHECK(WEXITSTATUS(wstatus) != 0);
    const layout_status st = e.layout_info().value();
    REQUIRE(st.shards.size() == 1);
    CHECK_FALSE(st.shards[0].remote);
    CHECK(generate(e, 2) == local);
  }
}
