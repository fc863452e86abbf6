// `blockspec serve`: an OpenAI-compatible HTTP server (docs/SERVER.md) over one served model.
//
//   Server server(std::move(model), {.host = "127.0.0.1", .port = 8000});
//   BS_ASSIGN_OR_RETURN(int port, server.bind());
//   BS_RETURN_IF_ERROR(server.run());  // until stop() from another thread
//
// Routes: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions,
// POST /tokenize, POST /detokenize, GET /metrics. HTTP handler threads parse and tokenize; one
// engine worker thread generates (engine_worker.h). The transport (exclusive port, a handler pool
// that grows with the connections, timeouts, size limits) is http_transport.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/generate.h"
#include "server/served_model.h"

namespace bs::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;           // 0: any free port (bind() returns it)
  std::string api_key;       // non-empty: /v1, /tokenize and /detokenize need "Bearer KEY"
  bool log_requests = true;  // one line per request on stderr
  int64_t max_num_seqs = 8;  // requests decoded together (continuous batching); more wait
  // KV cache positions per pool (target and drafter alike); 0: max_num_seqs full context windows.
  int64_t kv_cache_tokens = 0;
  // Chunked prefill: prompt tokens prefilled per scheduler step (SchedulerOptions::
  // max_prefill_tokens); 0: each admitted prompt whole.
  int64_t max_prefill_tokens = kDefaultPrefillChunk;
  // Request limits (docs/SERVER.md, "Limits and transport"): a larger body is a 413; a JSON body
  // nested deeper is a 400.
  size_t max_request_bytes = size_t{16} << 20;
  int max_json_depth = 64;
  // Seconds a connection may take to deliver a request (or idle between two) before it is
  // closed: bounds slow clients (slowloris). 0: no limit.
  int request_deadline_s = 30;
  // Admit requests when their prompt fits and preempt the newest when the KV cache runs full
  // (SchedulerOptions::preemption); false: reserve each request's worst case at admission.
  bool preemption = false;
  // Prefix caching (SchedulerOptions::prefix_caching): prompts that start like an earlier one
  // reuse its cached K/V (usage.prompt_tokens_details.cached_tokens). On by default, as `serve`
  // (vLLM's default).
  bool prefix_caching = true;
};

class Server {
 public:
  Server(ServedModel model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Opens the listening socket; the bound port, or an error naming host:port.
  Result<int> bind();
  // Serves until stop(); call after bind().
  Status run();
  // Thread-safe; run() returns soon after.
  void stop();

  const ServedModel& model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs::server
