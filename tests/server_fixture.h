// A blockspec server in-process for the server tests (e2e/server_test.cc,
// e2e/server_openai_compat_test.cc): the embedded stories260K (and its DFlash drafter) on the CPU,
// on 127.0.0.1:<free port>, serving until destroyed.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "server/server.h"

namespace bs::server {

inline std::string stories_model_dir() {
  return std::string(BS_SOURCE_DIR) + "/models/stories260K";
}
inline std::string stories_drafter_dir() {
  return std::string(BS_SOURCE_DIR) + "/models/stories260K-dflash";
}

class RunningServer {
 public:
  explicit RunningServer(ServerOptions options = {}, bool drafter = true,
                         const std::string& model_dir = stories_model_dir())
      : RunningServer({.model_dir = model_dir,
                       .drafter_dir = drafter ? stories_drafter_dir() : "",
                       .device = "cpu",
                       .threads = 1},
                      std::move(options)) {}
  RunningServer(const ModelOptions& model_options, ServerOptions options) {
    auto model = load_served_model(model_options);
    EXPECT_TRUE(model.ok()) << model.status().message();
    options.host = "127.0.0.1";
    options.port = 0;
    options.log_requests = false;
    server_ = std::make_unique<Server>(std::move(*model), options);
    auto port = server_->bind();
    EXPECT_TRUE(port.ok()) << port.status().message();
    port_ = port.ok() ? *port : -1;
    thread_ = std::thread([this] { EXPECT_TRUE(server_->run().ok()); });
  }
  ~RunningServer() {
    server_->stop();
    thread_.join();
  }
  RunningServer(const RunningServer&) = delete;
  RunningServer& operator=(const RunningServer&) = delete;
  int port() const { return port_; }

 private:
  std::unique_ptr<Server> server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace bs::server
