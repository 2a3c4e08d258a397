// OpenAI-style error objects: {"error":{"message","type","param","code"}} with their HTTP status.
// Every failure a client can see goes through this type; handlers return it as a value.
#pragma once

#include <string>

namespace cedar::net {

struct api_error {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  ///< the offending field, or empty
  std::string code;   ///< a stable machine-readable code, or empty

  /// The JSON body {"error":{...}}.
  std::string to_json() const;
};

inline api_error bad_request(std::string message, std::string param = {},
                             std::string code = "invalid_value") {
  return {400, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}
inline api_error not_found(std::string message, std::string param, std::string code) {
  return {404, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}
inline api_error unauthorized() {
  return {401, "authentication_error", "Incorrect or missing API key.", {}, "invalid_api_key"};
}
inline api_error overloaded(std::string message) {
  return {429, "rate_limit_error", std::move(message), {}, "overloaded"};
}
/// The engine failed a request it had accepted (a shard lost, an output it could not continue).
inline api_error engine_failed(std::string message) {
  if (message.empty()) message = "the engine failed while generating";
  return {500, "server_error", std::move(message), {}, "engine_error"};
}
inline api_error not_ready(std::string message) {
  return {503, "server_error", std::move(message), {}, "not_ready"};
}

}  // namespace cedar::net
