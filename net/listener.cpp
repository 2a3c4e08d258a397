// listener: the accept loop.
#include "net/listener.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include "net/http_session.hpp"

namespace cedar::net {

namespace asio = boost::asio;

listener::listener(asio::io_context& ioc, std::shared_ptr<server_state> state)
    : ioc_(ioc), acceptor_(asio::make_strand(ioc)), retry_(acceptor_.get_executor()), state_(std::move(state)) {}

std::string listener::open(const asio::ip::tcp::endpoint& endpoint) {
  boost::beast::error_code ec;
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  return ec ? ec.message() : std::string();
}

uint16_t listener::port() const {
  boost::beast::error_code ec;
  return acceptor_.local_endpoint(ec).port();
}

void listener::run() { do_accept(); }

void listener::close() {
  asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
    boost::beast::error_code ec;
    self->acceptor_.close(ec);
  });
}

void listener::do_accept() {
  acceptor_.async_accept(asio::make_strand(ioc_),
                         [self = shared_from_this()](boost::beast::error_code ec, asio::ip::tcp::socket s) {
                           self->on_accept(ec, std::move(s));
                         });
}

void listener::on_accept(boost::beast::error_code ec, asio::ip::tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
  if (!ec) {
    if (state_->metrics.num_open_connections.load() >= state_->options.max_connections) {
      boost::beast::error_code ignored;
      socket.close(ignored);  // over the limit: refuse rather than queue
      state_->metrics.num_connections_refused.fetch_add(1);
    } else {
      socket.set_option(asio::ip::tcp::no_delay(true), ec);
      std::make_shared<http_session>(std::move(socket), state_)->run();
    }
  } else {
    // Out of descriptors (or a transient error): retrying at once would spin; wait a little.
    state_->log({{"event", "accept_failed"}, {"error", ec.message()}});
    retry_.expires_after(std::chrono::milliseconds(50));
    retry_.async_wait([self = shared_from_this()](boost::beast::error_code e) {
      if (!e) self->do_accept();
    });
    return;
  }
  do_accept();
}

}  // namespace cedar::net
