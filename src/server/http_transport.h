// The HTTP transport under the OpenAI routes (docs/SERVER.md, "Limits and transport"): the
// listening socket (exclusive port, large backlog), a handler thread pool that grows with the
// connections so cheap routes (/health, /metrics) never queue behind generation, timeouts and
// size limits against slow or oversized clients, and a check whether a request's client has gone.
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "core/status.h"

namespace bs::server {

struct TransportOptions {
  // Handler threads kept alive; more are started while every one is busy, up to max_threads, and
  // end after a few idle seconds. A connection holds one thread while it is open.
  size_t core_threads = 32;
  size_t max_threads = 4096;
  int listen_backlog = 1024;
  int read_timeout_s = 10;   // per read of a request (a client silent longer is dropped)
  int write_timeout_s = 10;  // per write of a response (a client not reading longer is dropped)
  int keep_alive_timeout_s = 5;
  // The longest a connection may take to deliver one request (line, headers and body) or sit
  // between requests; then it is closed. Bounds slow clients that trickle bytes (slowloris),
  // which the per-read timeout does not. 0: no limit.
  int request_deadline_s = 30;
  size_t keep_alive_max_requests = 100;
  size_t max_request_bytes = size_t{16} << 20;  // larger bodies: 413 before they are read
};

// The handler threads kept for `max_num_seqs` admitted requests: every admitted and
// as many waiting requests, plus headroom for cheap routes.
inline size_t core_handler_threads(int64_t max_num_seqs) {
  const int64_t n = 2 * max_num_seqs + 8;
  return static_cast<size_t>(n < 32 ? 32 : n);
}

// An httplib::Server with the transport above.
class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(const TransportOptions& options);
  ~HttpServer() override;
  // Binds host:port (0: any free port) exclusively: a port another socket listens on is an
  // error naming it (httplib's default SO_REUSEPORT would share it silently). The bound port.
  // Starts the deadline watch (request_deadline_s).
  Result<int> bind_exclusive(const std::string& host, int port);
  // Call first thing for every request read (the pre-routing handler): its connection is served
  // until its response is written, whatever the deadline.
  void request_began(const httplib::Request& req);

 private:
  using Peer = std::pair<std::string, int>;  // the client's address and port
  // Every second: closes the connections to `port` that have been reading one request (or
  // idling) longer than the deadline.
  void watch(int port);

  TransportOptions options_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::set<Peer> busy_;                                            // in a handler
  std::map<Peer, std::chrono::steady_clock::time_point> reading_;  // since when, else first seen
  std::thread watcher_;
};

// The socket of the connection `req` came on (matched by its addresses among this process's
// sockets), or -1. Valid while the request's handler (or its content provider) runs.
int connection_socket(const httplib::Request& req);
// True when the peer of `socket` closed or shut down its side (a client that disconnected).
bool peer_closed(int socket);

}  // namespace bs::server
