#include "server/http_transport.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace bs::server {

namespace {

// httplib's task queue: runs each accepted connection on a thread. `core` threads wait for work;
// when a connection arrives and none is idle, another thread starts (up to `max`), which ends
// after kIdle without work. So a cheap request gets a thread at once while long generations hold
// others, and an idle server keeps only `core`.
class HandlerPool : public httplib::TaskQueue {
 public:
  HandlerPool(size_t core, size_t max) : core_(core), max_(max < core ? core : max) {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < core_; ++i) spawn(/*core=*/true);
  }
  ~HandlerPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::vector<std::thread> ended;
    {
      std::lock_guard lock(mutex_);
      ended.swap(ended_);
      tasks_.push_back(std::move(fn));
      if (idle_ < tasks_.size() && threads_.size() < max_) spawn(/*core=*/false);
    }
    cv_.notify_one();
    for (auto& t : ended) t.join();  // threads that ended after idling (already returned)
  }

  void shutdown() override {
    std::vector<std::thread> all;
    {
      std::lock_guard lock(mutex_);
      if (stopping_ && threads_.empty() && ended_.empty()) return;
      stopping_ = true;
      for (auto& [id, t] : threads_) all.push_back(std::move(t));
      threads_.clear();
      for (auto& t : ended_) all.push_back(std::move(t));
      ended_.clear();
    }
    cv_.notify_all();
    for (auto& t : all) t.join();
  }

 private:
  static constexpr auto kIdle = std::chrono::seconds(10);

  void spawn(bool core) {  // under mutex_
    std::thread t([this, core] { work(core); });
    const auto id = t.get_id();
    threads_.emplace(id, std::move(t));
  }

  void work(bool core) {
    std::unique_lock lock(mutex_);
    for (;;) {
      ++idle_;
      const auto ready = [&] { return !tasks_.empty() || stopping_; };
      const bool woke = core ? (cv_.wait(lock, ready), true) : cv_.wait_for(lock, kIdle, ready);
      --idle_;
      if (tasks_.empty()) {
        if (stopping_) return;
        if (!woke) break;  // an extra thread idle for kIdle
        continue;
      }
      std::function<void()> fn = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
    // Ending while the pool runs: hand this thread's handle to be joined by the next enqueue.
    auto self = threads_.find(std::this_thread::get_id());
    if (self != threads_.end()) {
      ended_.push_back(std::move(self->second));
      threads_.erase(self);
    }
  }

  const size_t core_, max_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::map<std::thread::id, std::thread> threads_;
  std::vector<std::thread> ended_;  // returned (or returning) extra threads, to join
  size_t idle_ = 0;
  bool stopping_ = false;
};

// The numeric host and the port of a socket address.
bool host_and_port(const sockaddr_storage& a, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  *host = h;
  *port = std::atoi(s);
  return true;
}

// One connected socket of this process: its descriptor, its own port, its peer's address/port.
struct Connection {
  int fd;
  int local_port;
  std::string peer_host;
  int peer_port;
};

// This process's connected sockets whose own port is `local_port` (from /proc/self/fd).
std::vector<Connection> connections(int local_port) {
  std::vector<Connection> out;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return out;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    Connection c{.fd = static_cast<int>(fd), .local_port = 0, .peer_host = {}, .peer_port = 0};
    std::string local_host;
    if (getsockname(c.fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0 &&
        getpeername(c.fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
        host_and_port(local, local_len, &local_host, &c.local_port) && c.local_port == local_port &&
        host_and_port(peer, peer_len, &c.peer_host, &c.peer_port)) {
      out.push_back(std::move(c));
    }
  }
  closedir(dir);
  return out;
}

}  // namespace

HttpServer::HttpServer(const TransportOptions& options) : options_(options) {
  const size_t core = options.core_threads, max = options.max_threads;
  new_task_queue = [core, max] { return new HandlerPool(core, max); };
  // SO_REUSEADDR only (a restart can bind while old connections linger in TIME_WAIT); no
  // SO_REUSEPORT, which lets a second server share the port. TCP_NODELAY (inherited by the
  // accepted sockets): without it Nagle's algorithm holds a streamed response's first event
  // behind its unacknowledged headers until the client's delayed ACK (~40 ms of TTFT).
  set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  });
  set_read_timeout(options.read_timeout_s);
  set_write_timeout(options.write_timeout_s);
  set_keep_alive_timeout(options.keep_alive_timeout_s);
  set_keep_alive_max_count(options.keep_alive_max_requests);
  set_payload_max_length(options.max_request_bytes);
  // Called once a response is written: the connection reads its next request from now.
  set_logger([this](const httplib::Request& req, const httplib::Response&) {
    std::lock_guard lock(mutex_);
    const Peer peer{req.remote_addr, req.remote_port};
    busy_.erase(peer);
    reading_[peer] = std::chrono::steady_clock::now();
  });
}

HttpServer::~HttpServer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void HttpServer::request_began(const httplib::Request& req) {
  std::lock_guard lock(mutex_);
  busy_.insert({req.remote_addr, req.remote_port});
}

void HttpServer::watch(int port) {
  const auto deadline = std::chrono::seconds(options_.request_deadline_s);
  std::unique_lock lock(mutex_);
  while (!cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stopping_; })) {
    lock.unlock();
    std::map<Peer, int> open;  // this process's connections to `port`, by client
    for (const Connection& c : connections(port)) open[{c.peer_host, c.peer_port}] = c.fd;
    const auto now = std::chrono::steady_clock::now();
    lock.lock();
    std::map<Peer, std::chrono::steady_clock::time_point> still;
    for (const auto& [peer, fd] : open) {
      const auto seen = reading_.find(peer);
      const auto since = seen != reading_.end() ? seen->second : now;
      still[peer] = since;
      if (busy_.count(peer) == 0 && now - since > deadline) {
        ::shutdown(fd, SHUT_RDWR);  // its thread's read fails and it closes the connection
      }
    }
    reading_.swap(still);  // forget closed connections
  }
}

Result<int> HttpServer::bind_exclusive(const std::string& host, int port) {
  errno = 0;
  const int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    const int err = errno;
    return FailedPrecondition("cannot listen on {}:{}: {}", host, port,
                              err == EADDRINUSE
                                  ? "the port is in use (another server is listening on it)"
                              : err != 0 ? std::strerror(err)
                                         : "address not available");
  }
  // httplib listens with a backlog of 5; listen() again on the bound socket raises it, so bursts
  // of connections wait in the kernel instead of being refused.
  ::listen(svr_sock_, options_.listen_backlog);
  if (options_.request_deadline_s > 0 && !watcher_.joinable()) {
    watcher_ = std::thread([this, bound] { watch(bound); });
  }
  return bound;
}

int connection_socket(const httplib::Request& req) {
  for (const Connection& c : connections(req.local_port)) {
    if (c.peer_port == req.remote_port && c.peer_host == req.remote_addr) return c.fd;
  }
  return -1;
}

bool peer_closed(int socket) {
  if (socket < 0) return false;
  pollfd p{.fd = socket, .events = POLLRDHUP, .revents = 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace bs::server
