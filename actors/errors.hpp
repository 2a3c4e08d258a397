// Errors as values at the runtime's interfaces: the expected failures a client can cause or
// meet (bad input, unknown ids, out of KV, cancelled, shard down). Broken invariants are not
// errors: they fail fast through CEDAR_CHECK. Plain C++; used by policies, actors and net/.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace cedar {

enum class engine_errc : uint8_t {
  prompt_too_long,  ///< prompt does not fit the context (or the whole KV budget)
  bad_params,       ///< max tokens, sampling or stop ids out of range, empty prompt
  unknown_session,  ///< no open session with that id
  unknown_request,  ///< no such request, or it already finished
  session_busy,     ///< a turn of this session is still running
  cancelled,        ///< the request was cancelled before it finished
  kv_exhausted,     ///< the KV budget cannot hold even one request of this size
  draining,         ///< the engine is shutting down and takes no new requests
  shard_failed,     ///< the model shard failed or timed out; the step's requests are failed
  busy,             ///< the engine is already doing this (a layout switch); try again later
};

/// A short stable name ("prompt_too_long", ...) for logs and OpenAI error codes.
const char* errc_name(engine_errc c);

struct engine_error {
  engine_errc code = engine_errc::bad_params;
  std::string message;  ///< one sentence a client can act on
};

/// A value or an engine_error.
template <class T>
class outcome {
 public:
  outcome(T value) : v_(std::move(value)) {}
  outcome(engine_error error) : v_(std::move(error)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  const T& value() const& { return std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const engine_error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, engine_error> v_;
};

/// An outcome with no value.
struct ok_t {};
using status = outcome<ok_t>;

}  // namespace cedar

/// Fails fast on a broken invariant, naming file:line and the condition.
#ifndef CEDAR_CHECK
#define CEDAR_CHECK(cond)                                                                   \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);        \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
#endif
