// The CPU shard actor (see shard_actor.hpp).
#include "actors/shard_actor.hpp"

namespace cedar {
namespace {

shard_actor::behavior_type shard_behavior(shard_actor::pointer self, std::shared_ptr<shard> s) {
  return {
      [=](const run_step& step) {
        step_output out = s->run(step);
        self->send(caf::actor_cast<scheduler_actor>(self->current_sender()), std::move(out));
      },
  };
}

}  // namespace

shard_actor spawn_shard(caf::actor_system& sys, std::shared_ptr<shard> s) {
  return sys.spawn<caf::detached>(shard_behavior, std::move(s));
}

}  // namespace cedar
