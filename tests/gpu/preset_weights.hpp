// A preset's config with random weights for the GPU tests that run a whole model, made once per
// preset and seed in the test process.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"

namespace cedar::gpu_test {

struct preset_weights {
  model_args args;
  std::shared_ptr<const tensor_map> weights;
};

inline const preset_weights& random_preset(const std::string& name, uint64_t seed) {
  static std::mutex mu;
  static std::map<std::pair<std::string, uint64_t>, preset_weights> made;
  std::lock_guard<std::mutex> lock(mu);
  auto it = made.find({name, seed});
  if (it == made.end()) {
    std::string error;
    auto args = load_model_args(name, &error);
    REQUIRE_MESSAGE(args.has_value(), error);
    it = made.emplace(std::make_pair(name, seed),
                      preset_weights{*args, std::make_shared<tensor_map>(make_random_weights(*args, seed))}).first;
  }
  return it->second;
}

}  // namespace cedar::gpu_test
