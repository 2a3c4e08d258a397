// Serialization of api_error.
#include "net/api_error.hpp"

#include "net/json_writer.hpp"

namespace cedar::net {

std::string api_error::to_json() const {
  json_writer w;
  w.obj().key("error").obj().kv("message", message).kv("type", type);
  w.key("param");
  if (param.empty()) w.null(); else w.str(param);
  w.key("code");
  if (code.empty()) w.null(); else w.str(code);
  w.end_obj().end_obj();
  return w.take();
}

}  // namespace cedar::net
