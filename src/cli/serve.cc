// `blockspec serve`: the OpenAI-compatible HTTP server (src/server, docs/SERVER.md). Loads the
// model (defaults like `generate`), prints one line when listening, serves until SIGINT/SIGTERM.
#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/validators.h"
#include "engine/kv_budget.h"
#include "server/server.h"

namespace bs::cli {

namespace {

struct ServeArgs {
  std::string model;
  std::string drafter;
  bool no_drafter = false;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  std::string api_key;
  int64_t max_model_len = 0;
  std::string device = "auto";
  int threads = 0;
  int64_t draft_tokens = 0;
  double draft_confidence_min = 0;
  VerifyBudget verify_budget = VerifyBudget::kOff;
  bool drafter_fp8 = false;
  int64_t max_num_seqs = 8;
  int64_t kv_cache_tokens = 0;
  double memory_utilization = 0.9;
  int64_t max_num_batched_tokens = kDefaultPrefillChunk;
  bool preemption = false;
  bool prefix_caching = true;
  std::string tool_call_parser = "auto";
  int64_t max_request_bytes = int64_t{16} << 20;
};

CLI::App* g_cmd = nullptr;
ServeArgs g_args;

int fail(const Status& status) {
  fmt::print(stderr, "blockspec serve: error: {}\n", status.message());
  return 1;
}

// The write end of the pipe on_stop_signal writes a stopping signal's number to.
int g_stop_pipe[2] = {-1, -1};
void on_stop_signal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t written = write(g_stop_pipe[1], &byte, 1);  // async-signal-safe
}

int run_serve(const ServeArgs& a) {
  const ModelDirs dirs = resolve_model_dirs(a.model, a.drafter, a.no_drafter);
  auto model = server::load_served_model({.model_dir = dirs.model,
                                          .drafter_dir = dirs.drafter,
                                          .served_name = a.served_model_name,
                                          .device = a.device,
                                          .threads = a.threads,
                                          .max_model_len = a.max_model_len,
                                          .draft_tokens = a.draft_tokens,
                                          .draft_confidence_min = a.draft_confidence_min,
                                          .verify_budget = a.verify_budget,
                                          .drafter_fp8 = a.drafter_fp8,
                                          .tool_call_parser = a.tool_call_parser});
  if (!model.ok()) return fail(model.status());
  auto kv = plan_kv_cache(*model->target, model->drafter.get(),
                          {.tokens = a.kv_cache_tokens,
                           .max_num_seqs = a.max_num_seqs,
                           .max_context = model->max_model_len,
                           .memory_utilization = a.memory_utilization,
                           .max_prefill_tokens = a.max_num_batched_tokens});
  if (!kv.ok()) return fail(kv.status());
  const std::string summary = fmt::format(
      "model {} ({}), drafter {}, context {} tokens, max {} sequences, KV cache {} tokens "
      "({}{}{}), prefill chunk {} tokens",
      model->name, dirs.model, dirs.drafter.empty() ? "none" : dirs.drafter, model->max_model_len,
      a.max_num_seqs, kv->tokens(),
      kv->bytes >= (1 << 30)
          ? fmt::format("{:.2f} GiB", static_cast<double>(kv->bytes) / (1 << 30))
          : fmt::format("{:.1f} MiB", static_cast<double>(kv->bytes) / (1 << 20)),
      kv->shrunk ? fmt::format(", shrunk to fit memory: {:.1f} full context windows",
                               static_cast<double>(kv->blocks) / kv->window_blocks)
                 : "",
      kv->scratch_bytes > 0 ? fmt::format(", {:.1f} MiB reserved for a step's scratch",
                                          static_cast<double>(kv->scratch_bytes) / (1 << 20))
                            : "",
      a.max_num_batched_tokens);

  // SIGINT / SIGTERM stop the server. A handler, not a blocked mask and sigwait: threads that
  // exist before this point (OpenBLAS starts its pool when the library loads, the backend's pool
  // at model load) would not block the signal, and one landing on them would kill the process.
  if (pipe(g_stop_pipe) != 0) return fail(FailedPrecondition("cannot create the signal pipe"));
  struct sigaction stop_action = {};
  stop_action.sa_handler = on_stop_signal;
  sigemptyset(&stop_action.sa_mask);
  stop_action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &stop_action, nullptr);
  sigaction(SIGTERM, &stop_action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  server::Server srv(std::move(*model),
                     {.host = a.host,
                      .port = a.port,
                      .api_key = a.api_key,
                      .max_num_seqs = a.max_num_seqs,
                      .kv_cache_tokens = kv->tokens(),
                      .max_prefill_tokens = a.max_num_batched_tokens,
                      .max_request_bytes = static_cast<size_t>(a.max_request_bytes),
                      .preemption = a.preemption,
                      .prefix_caching = a.prefix_caching});
  auto port = srv.bind();
  if (!port.ok()) return fail(port.status());
  std::thread([&srv] {
    unsigned char sig = 0;
    while (read(g_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    srv.stop();
  }).detach();
  if (const int64_t nth = arm_allocation_failure_from_env(); nth > 0) {
    fmt::print(stderr,
               "blockspec serve: BLOCKSPEC_FAIL_ALLOC_AT={}: allocation {} from now fails\n", nth,
               nth);
  }
  fmt::print(stderr, "blockspec serve: listening on http://{}:{} ({})\n", a.host, *port, summary);
  std::fflush(stderr);
  if (Status s = srv.run(); !s.ok()) return fail(s);
  fmt::print(stderr, "blockspec serve: stopped\n");
  return 0;
}

}  // namespace

void register_serve(CLI::App& app) {
  g_cmd = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API (docs/SERVER.md)");
  g_cmd->add_option("--model", g_args.model,
                    "Target model folder (Hugging Face format); default: the embedded stories260K");
  g_cmd->add_option("--drafter", g_args.drafter,
                    "Drafter folder (DFlash, DSpark, DFlash2 or FlashMap)");
  g_cmd->add_flag("--no-drafter", g_args.no_drafter, "Plain autoregressive decoding");
  g_cmd->add_option("--host", g_args.host, "Address to listen on");
  g_cmd->add_option("--port", g_args.port, "Port to listen on (0: any free port)")
      ->check(number_in(0, 65535));
  g_cmd->add_option("--served-model-name", g_args.served_model_name,
                    "Model name in the API (default: the model folder's name)");
  g_cmd->add_option("--api-key", g_args.api_key,
                    "Require 'Authorization: Bearer KEY' on /v1, /tokenize, /detokenize");
  g_cmd
      ->add_option("--max-model-len", g_args.max_model_len,
                   "Context window in tokens, prompt + output (default: the model's)")
      ->check(at_least(1));
  g_cmd->add_option("--device", g_args.device, "cpu, cuda or auto (CUDA when a GPU is present)");
  g_cmd->add_option("--threads", g_args.threads, "CPU threads (default: all cores)")
      ->check(at_least(0));
  g_cmd
      ->add_option("--draft-tokens", g_args.draft_tokens,
                   "Drafts verified per step (default: block-1)")
      ->check(at_least(1));
  g_cmd
      ->add_option("--draft-confidence-min", g_args.draft_confidence_min,
                   "DSpark: verify only drafts whose predicted prefix survival is >= P (0 = off)")
      ->check(number_in(0, 1));
  add_verify_budget_option(g_cmd, &g_args.verify_budget);
  g_cmd->add_flag("--drafter-fp8", g_args.drafter_fp8,
                  "DFlash drafter weights in FP8 (one scale per row): faster drafting, output "
                  "unchanged");
  g_cmd
      ->add_option("--max-num-seqs", g_args.max_num_seqs,
                   "Requests decoded together (continuous batching); more wait")
      ->check(at_least(1));
  g_cmd
      ->add_option("--kv-cache-tokens", g_args.kv_cache_tokens,
                   "KV cache size in positions (default: max-num-seqs full context windows, "
                   "fewer if they do not fit in memory); a request waits until its prompt + "
                   "max_tokens fit")
      ->check(at_least(1));
  g_cmd
      ->add_option("--memory-utilization,--gpu-memory-utilization", g_args.memory_utilization,
                   "Fraction of the device's memory (host RAM on the CPU) that weights and KV "
                   "cache may take together; sizes the default KV cache")
      ->check(number_in(0, 1));
  g_cmd
      ->add_option("--max-num-batched-tokens", g_args.max_num_batched_tokens,
                   "Chunked prefill: prompt tokens prefilled per step, so a long prompt does not "
                   "stall the running requests and a step's memory does not grow with the prompt "
                   "(decode rows not counted; default 2048; 0: whole prompts)")
      ->check(at_least(0));
  g_cmd->add_flag("--preemption", g_args.preemption,
                  "Admit a request once its prompt fits the KV cache and, when the cache runs "
                  "full, preempt the newest request (it re-prefills later; nothing is lost) "
                  "instead of reserving every request's prompt + max_tokens at admission");
  g_cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", g_args.prefix_caching,
                  "Keep prefilled prompts' K/V blocks cached until the pool needs them, and start "
                  "a prompt that begins like an earlier one from them (vLLM's automatic prefix "
                  "caching; outputs unchanged). On by default, as in vLLM");
  g_cmd
      ->add_option("--tool-call-parser", g_args.tool_call_parser,
                   "How chat replies to requests with tools become tool_calls: hermes "
                   "(<tool_call> blocks), llama3_json (the reply is one JSON call), none; auto: "
                   "hermes when the chat template mentions <tool_call>, else none")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "none"}));
  g_cmd
      ->add_option("--max-request-bytes", g_args.max_request_bytes,
                   "Largest request body in bytes; larger ones are refused with 413 before they "
                   "are read (default 16 MiB)")
      ->check(CLI::PositiveNumber);
}

bool run_serve_if_parsed(int* rc) {
  if (!g_cmd || !g_cmd->parsed()) return false;
  *rc = run_serve(g_args);
  return true;
}

}  // namespace bs::cli
