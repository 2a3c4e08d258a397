// Accepts TCP connections and starts an http_session for each, on its own strand. Refuses
// (closes at once) connections beyond --max-connections. Stops when close() is called (drain).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/error.hpp>

#include <memory>

#include "net/server_state.hpp"

namespace cedar::net {

class listener : public std::enable_shared_from_this<listener> {
 public:
  listener(boost::asio::io_context& ioc, std::shared_ptr<server_state> state);
  /// Binds and listens; returns an error message, or empty on success.
  std::string open(const boost::asio::ip::tcp::endpoint& endpoint);
  void run();
  /// Stops accepting (posted onto the acceptor's strand).
  void close();
  uint16_t port() const;

 private:
  void do_accept();
  void on_accept(boost::beast::error_code ec, boost::asio::ip::tcp::socket socket);

  boost::asio::io_context& ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_;  ///< out of descriptors: wait before accepting again
  std::shared_ptr<server_state> state_;
};

}  // namespace cedar::net
