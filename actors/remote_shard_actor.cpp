// The shard-process side of a remote shard (see remote_shard_actor.hpp).
#include "actors/remote_shard_actor.hpp"

#include <caf/io/all.hpp>
#include <cstdio>
#include <cstdlib>

#include "actors/layout.hpp"
#include "actors/protocol.hpp"
#include "actors/shard_actor.hpp"

namespace cedar {

int serve_remote_shard(std::shared_ptr<const model> m, const engine_options& options, const std::string& host,
                       uint16_t port) {
  caf::actor_system_config cfg;
  register_messages(cfg);
  cfg.load<caf::io::middleman>();
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  auto runtime = sys.middleman().remote_actor<runtime_actor>(host, port);
  if (!runtime) {
    std::fprintf(stderr, "cedar shard: cannot reach a runtime at %s:%u: %s\n", host.c_str(), unsigned(port),
                 sys.render(runtime.error()).c_str());
    return 1;
  }
  const kv_capacity cap = plan_kv_capacity(m->layout(), options.kv_budget_bytes, options.max_num_seqs);
  const std::string fingerprint = model_fingerprint(m->args(), m->layout());
  shard_actor sh = spawn_shard(sys, std::make_shared<shard>(wrap_model(m), cap));
  caf::scoped_actor self{sys};
  int rc = 0;
  self->request(*runtime, std::chrono::seconds(30), shard_join{sh, fingerprint})
      .receive(
          [&](const status_reply& r) {
            if (r.error_code < 0) return;
            std::fprintf(stderr, "cedar shard: refused: %s\n", r.error_message.c_str());
            rc = 1;
          },
          [&](caf::error& e) {
            std::fprintf(stderr, "cedar shard: join failed: %s\n", sys.render(e).c_str());
            rc = 1;
          });
  if (rc == 0) {
    std::fprintf(stderr, "cedar shard: serving the runtime at %s:%u (%s)\n", host.c_str(), unsigned(port),
                 fingerprint.c_str());
    self->monitor(*runtime);
    self->receive([](const caf::down_msg&) {});
  }
  caf::anon_send_exit(sh, caf::exit_reason::user_shutdown);
  // The process ends here, without the actor system's teardown: CAF 0.17's ~actor_system waits
  // for every detached actor to be destroyed, and the reference the runtime's process took to
  // the shard actor (its handle went out with the join) can keep it alive for good. A refused
  // shard hung there at exit in about one run in twelve on a loaded machine (gdb: the main
  // thread in await_detached_threads, the shard's thread in await_self_destroyed). Nothing of a
  // shard process needs tearing down.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}

}  // namespace cedar
