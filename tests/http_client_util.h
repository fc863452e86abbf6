// HTTP client helpers shared by the server tests: the in-process ones (e2e/server_test.cc) and the
// load driver against an external server (e2e/server_load_test.cc). Everything talks to
// 127.0.0.1:<port>.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace bs::test_util {

// A client that leaves mid-stream: POSTs the JSON `body` (a streaming request) to `path` and
// hangs up once `chunks` chunks of the reply have arrived.
inline void post_and_leave(int port, const std::string& path, const std::string& body, int chunks,
                           int read_timeout_s = 60) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(read_timeout_s);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  int received = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return ++received < chunks;
  };
  httplib::Response res;
  httplib::Error err;
  cli.send(req, res, err);
}

// The events of an SSE body: each "data: X" payload in order.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) == 0) events.push_back(line.substr(6));
  }
  return events;
}

// The value of the first series of a /metrics text whose line starts with `prefix` (e.g.
// "vllm:num_requests_running{"); nullopt when there is none.
inline std::optional<double> metric_value(const std::string& metrics, const std::string& prefix) {
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nullopt;
}

}  // namespace bs::test_util
