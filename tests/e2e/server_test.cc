// `blockspec serve` as a client sees it: the server runs in-process on an ephemeral port with the
// embedded stories260K model and its shipped DFlash drafter; httplib::Client talks to it.
// Expected texts come from the engine API (greedy generate_plain), so the tests also check that
// speculative decoding through the server is lossless.
#include "server/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "engine/generate.h"
#include "http_client_util.h"
#include "io/safetensors.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "server_fixture.h"
#include "tokenizer/tokenizer.h"

namespace bs::server {
namespace {

using test_util::sse_events;

using json = nlohmann::json;

const std::string kModel = std::string(BS_SOURCE_DIR) + "/models/stories260K";
const std::string kDrafter = std::string(BS_SOURCE_DIR) + "/models/stories260K-dflash";

// The engine's greedy output for a prompt, computed without the server.
class Engine {
 public:
  Engine() : backend_(make_cpu_backend(1)) {
    tokenizer_ = std::move(*Tokenizer::load(kModel));
    target_ = std::move(*load_target(kModel, *backend_));
  }
  struct Output {
    std::string text;
    int64_t prompt_tokens, completion_tokens;
    std::string finish_reason;
  };
  Output greedy(const std::string& prompt, int64_t max_tokens, bool add_special_tokens = true) {
    const auto ids = tokenizer_->encode(prompt, add_special_tokens);
    GenerateOptions opt;
    opt.max_tokens = max_tokens;
    opt.stop_ids = tokenizer_->eos_ids();
    GenerateStats st;
    auto out = generate_plain(*target_, ids, opt, nullptr, &st);
    EXPECT_TRUE(out.ok());
    return {continuation(ids, *out), st.prompt_tokens, st.generated_tokens,
            st.finish == FinishReason::kStop ? "stop" : "length"};
  }
  // The text `out` adds after `prompt`, as a full decode of both reads (skipping special tokens):
  // e.g. " ball." after "Tom had a red" (the leading space kept).
  std::string continuation(const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& out) const {
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), out.begin(), out.end());
    const std::string before = tokenizer_->decode(prompt, /*skip_special_tokens=*/true);
    const std::string text = tokenizer_->decode(all, /*skip_special_tokens=*/true);
    EXPECT_EQ(text.substr(0, before.size()), before);
    return text.substr(before.size());
  }
  // The single-request output the server must give for `opt` (stop ids: the tokenizer's EOS):
  // generate_speculative with the shipped drafter, or generate_plain.
  std::string text(const std::string& prompt, GenerateOptions opt, bool drafter) {
    if (drafter && !drafter_) drafter_ = std::move(*load_drafter(kDrafter, *target_, {}));
    opt.stop_ids = tokenizer_->eos_ids();
    const auto ids = tokenizer_->encode(prompt, true);
    auto out = drafter ? generate_speculative(*target_, *drafter_, ids, opt, nullptr, nullptr)
                       : generate_plain(*target_, ids, opt, nullptr, nullptr);
    EXPECT_TRUE(out.ok());
    return continuation(ids, *out);
  }
  // The logprobs of each token the server generates for token ids `ids` with `opt` (stop ids:
  // the tokenizer's EOS): generate_speculative with the shipped drafter, or generate_plain.
  std::vector<TokenLogprobs> logprobs(const std::vector<int32_t>& ids, GenerateOptions opt,
                                      bool drafter) {
    if (drafter && !drafter_) drafter_ = std::move(*load_drafter(kDrafter, *target_, {}));
    opt.stop_ids = tokenizer_->eos_ids();
    std::vector<TokenLogprobs> out;
    const LogprobsCallback add = [&out](const TokenLogprobs& lp) { out.push_back(lp); };
    auto tokens = drafter
                      ? generate_speculative(*target_, *drafter_, ids, opt, nullptr, nullptr, add)
                      : generate_plain(*target_, ids, opt, nullptr, nullptr, add);
    EXPECT_TRUE(tokens.ok());
    return out;
  }
  // The text token `id` adds after `before` (as a full decode of both shows it).
  std::string token_text(std::vector<int32_t> before, int32_t id) const {
    const std::string prefix = tokenizer_->decode(before);
    before.push_back(id);
    const std::string all = tokenizer_->decode(before);
    EXPECT_EQ(all.substr(0, prefix.size()), prefix);
    return all.substr(prefix.size());
  }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
};

struct Reply {
  int status = 0;
  json body;
  std::string raw;
};

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// read_timeout_s bounds the wait for the reply (a non-streaming reply comes only at the end).
Reply post(int port, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {}, int read_timeout_s = 60) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(read_timeout_s);
  auto r = cli.Post(path.c_str(), headers, body, "application/json");
  if (!r) return {};
  Reply out{r->status, json(), r->body};
  out.body = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  return out;
}

Reply get(int port, const std::string& path) {
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Get(path.c_str());
  if (!r) return {};
  return {r->status, json::parse(r->body, nullptr, false), r->body};
}

// The completion text of `body` (streamed when body["stream"] is true: the chunks' text joined).
std::string completion_text(int port, const json& body) {
  const Reply r = post(port, "/v1/completions", body.dump());
  if (!body.value("stream", false)) return r.body["choices"][0]["text"];
  std::string text;
  for (const auto& e : sse_events(r.raw)) {
    if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
  }
  return text;
}

// The value of the first /metrics series starting with `prefix` (name{labels...).
double metric(int port, const std::string& prefix) {
  const Reply r = get(port, "/metrics");
  const std::optional<double> v = test_util::metric_value(r.raw, prefix);
  if (!v) ADD_FAILURE() << "no metric " << prefix << " in\n" << r.raw;
  return v.value_or(-1);
}

TEST(Server, CompletionEqualsEngineGreedyWithAndWithoutDrafter) {
  Engine engine;
  for (bool drafter : {true, false}) {
    RunningServer server({}, drafter);
    for (const std::string prompt : {"Once upon a time", "The little dog"}) {
      const auto want = engine.greedy(prompt, 60);
      const Reply r = post(
          server.port(), "/v1/completions",
          json{{"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", 60}, {"temperature", 0}}
              .dump());
      ASSERT_EQ(r.status, 200) << r.raw;
      EXPECT_EQ(r.body["object"], "text_completion");
      EXPECT_EQ(r.body["model"], "stories260K");
      EXPECT_EQ(r.body["choices"][0]["text"], want.text) << "drafter " << drafter;
      EXPECT_EQ(r.body["choices"][0]["finish_reason"], want.finish_reason);
      EXPECT_EQ(r.body["usage"]["prompt_tokens"], want.prompt_tokens);
      EXPECT_EQ(r.body["usage"]["completion_tokens"], want.completion_tokens);
      EXPECT_EQ(r.body["usage"]["total_tokens"], want.prompt_tokens + want.completion_tokens);
      EXPECT_EQ(r.body.contains("blockspec"), drafter) << r.raw;
      if (drafter) {
        EXPECT_GT(r.body["blockspec"]["acceptance_length"].get<double>(), 1.0);
      }
    }
  }
}

// serve --verify-budget auto with the shipped DSpark drafter (confidence head): concurrent greedy
// requests share steps whose verify lengths the budget chooses, and each still gets exactly the
// target's greedy text.
TEST(Server, VerifyBudgetKeepsGreedyOutputs) {
  Engine engine;
  RunningServer server({.model_dir = stories_model_dir(),
                        .drafter_dir = std::string(BS_SOURCE_DIR) + "/models/stories260K-dspark",
                        .device = "cpu",
                        .threads = 1,
                        .verify_budget = VerifyBudget::kAuto},
                       {});
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily saw a",
                                            "Tom had a red"};
  std::vector<std::thread> clients;
  std::vector<Reply> replies(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      replies[i] =
          post(server.port(), "/v1/completions",
               json{{"prompt", prompts[i]}, {"max_tokens", 48}, {"temperature", 0}}.dump());
    });
  }
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(replies[i].status, 200) << replies[i].raw;
    EXPECT_EQ(replies[i].body["choices"][0]["text"], engine.greedy(prompts[i], 48).text)
        << prompts[i];
  }
}

TEST(Server, TokenIdPromptEqualsTextPrompt) {
  RunningServer server;
  Engine engine;
  const auto ids = engine.tokenizer().encode("Tom had a red", true);
  const Reply by_ids = post(server.port(), "/v1/completions",
                            json{{"prompt", ids}, {"max_tokens", 20}, {"temperature", 0}}.dump());
  const Reply by_text =
      post(server.port(), "/v1/completions",
           json{{"prompt", {"Tom had a red"}}, {"max_tokens", 20}, {"temperature", 0}}.dump());
  ASSERT_EQ(by_ids.status, 200) << by_ids.raw;
  EXPECT_EQ(by_ids.body["choices"][0]["text"], by_text.body["choices"][0]["text"]);
  EXPECT_EQ(by_ids.body["choices"][0]["text"], engine.greedy("Tom had a red", 20).text);
}

TEST(Server, StreamedChunksConcatenateToTheCompletion) {
  RunningServer server;
  Engine engine;
  const auto want = engine.greedy("Once upon a time", 40);
  const Reply r = post(server.port(), "/v1/completions",
                       json{{"prompt", "Once upon a time"},
                            {"max_tokens", 40},
                            {"temperature", 0},
                            {"stream", true},
                            {"stream_options", {{"include_usage", true}}}}
                           .dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  const auto events = sse_events(r.raw);
  ASSERT_GE(events.size(), 4u) << r.raw;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    if (!e["usage"].is_null()) usage = e["usage"];
    if (e["choices"].empty()) continue;
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, want.text);
  EXPECT_EQ(finish, want.finish_reason);
  ASSERT_TRUE(usage.is_object()) << r.raw;
  EXPECT_EQ(usage["completion_tokens"], want.completion_tokens);
  EXPECT_EQ(usage["prompt_tokens"], want.prompt_tokens);
  // The usage chunk is the last before [DONE] and has no choices.
  EXPECT_TRUE(json::parse(events[events.size() - 2])["choices"].empty());
}

// The server's side of a connection has TCP_NODELAY: without it Nagle's algorithm held a streamed
// reply's first event behind its unacknowledged headers until the client's delayed ACK (~40 ms
// of every TTFT). Checked on this process's sockets whose own port is the server's.
TEST(Server, AcceptedConnectionsHaveNoDelay) {
  RunningServer server;
  httplib::Client cli("127.0.0.1", server.port());
  cli.set_keep_alive(true);  // the connection stays open after the reply
  const auto r = cli.Get("/health");
  ASSERT_TRUE(r && r->status == 200);
  int accepted = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_in local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        local.sin_family != AF_INET || ntohs(local.sin_port) != server.port() ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
      continue;  // not a connection accepted by the server
    }
    int on = 0;
    socklen_t len = sizeof on;
    ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &len), 0);
    EXPECT_NE(on, 0) << "fd " << fd;
    ++accepted;
  }
  EXPECT_GE(accepted, 1);
}

// The engine thread hands a job its output once per step (docs/SERVER.md, "Host work per step"),
// so a streamed speculative reply has at most one text chunk per step: the prefill's first token,
// then one per draft-and-verify step (before, a handler woken at a step's first token sent it
// alone, and the rest of the step's tokens in more chunks).
TEST(Server, AStepsTokensStreamInOneChunk) {
  RunningServer server;
  for (int k = 0; k < 3; ++k) {
    const Reply r = post(server.port(), "/v1/completions",
                         json{{"prompt", "Once upon a time"},
                              {"max_tokens", 200},
                              {"temperature", 0},
                              {"stream", true}}
                             .dump());
    ASSERT_EQ(r.status, 200) << r.raw;
    int64_t chunks = 0, drafts = -1;
    for (const std::string& e : sse_events(r.raw)) {
      if (e == "[DONE]") continue;
      const json j = json::parse(e);
      if (!j["choices"].empty() && !j["choices"][0]["text"].get<std::string>().empty()) ++chunks;
      if (j.contains("blockspec")) drafts = j["blockspec"]["drafts"];
    }
    ASSERT_GT(drafts, 0) << r.raw;
    EXPECT_LE(chunks, drafts + 1) << "run " << k;
  }
}

TEST(Server, StopStringsCutTheText) {
  RunningServer server;
  Engine engine;
  const std::string full = engine.greedy("Once upon a time", 60).text;
  const std::string cut = full.substr(0, full.find("Lily"));
  ASSERT_LT(cut.size(), full.size());
  for (const json& stop : {json("Lily"), json({"zzz", "Lily", "park"})}) {
    const Reply r = post(
        server.port(), "/v1/completions",
        json{{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0}, {"stop", stop}}
            .dump());
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["text"], cut);
    EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  }
  // Streaming holds back a possible stop-string prefix and never sends the stop string.
  const Reply s = post(server.port(), "/v1/completions",
                       json{{"prompt", "Once upon a time"},
                            {"max_tokens", 60},
                            {"temperature", 0},
                            {"stop", "Lily"},
                            {"stream", true}}
                           .dump());
  std::string text;
  for (const auto& e : sse_events(s.raw)) {
    if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, cut);
  // vLLM's include_stop_str_in_output: the text ends with the stop string (the earliest match).
  const Reply with = post(server.port(), "/v1/completions",
                          json{{"prompt", "Once upon a time"},
                               {"max_tokens", 60},
                               {"temperature", 0},
                               {"stop", {"park", "Lily"}},
                               {"include_stop_str_in_output", true}}
                              .dump());
  ASSERT_EQ(with.status, 200) << with.raw;
  EXPECT_EQ(with.body["choices"][0]["text"], cut + "Lily");
  EXPECT_EQ(with.body["choices"][0]["finish_reason"], "stop");
}

// vLLM's skip_special_tokens: false keeps special tokens' text (here "</s>", forced by a bias
// past ignore_eos); truncate_prompt_tokens feeds only the prompt's last N tokens.
TEST(Server, SkipSpecialTokensAndTruncatePromptTokens) {
  RunningServer server;
  json forced = {{"prompt", "Once upon a time"},
                 {"max_tokens", 3},
                 {"temperature", 0},
                 {"ignore_eos", true},
                 {"logit_bias", {{"2", 100}}}};
  Reply r = post(server.port(), "/v1/completions", forced.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["text"], "");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 3);
  forced["skip_special_tokens"] = false;
  r = post(server.port(), "/v1/completions", forced.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["text"], "</s></s></s>");

  const json tail = {{"prompt", json::array({261, 378})}, {"max_tokens", 12}, {"temperature", 0}};
  json truncated = tail;
  truncated["prompt"] = json::array({1, 403, 407, 261, 378});
  truncated["truncate_prompt_tokens"] = 2;
  const Reply want = post(server.port(), "/v1/completions", tail.dump());
  const Reply got = post(server.port(), "/v1/completions", truncated.dump());
  ASSERT_EQ(got.status, 200) << got.raw;
  EXPECT_EQ(got.body["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(got.body["choices"][0]["text"], want.body["choices"][0]["text"]);
  truncated["truncate_prompt_tokens"] = -1;  // a short prompt fits: nothing is cut
  EXPECT_EQ(post(server.port(), "/v1/completions", truncated.dump()).body["usage"]["prompt_tokens"],
            5);
  truncated["truncate_prompt_tokens"] = 0;
  const Reply bad = post(server.port(), "/v1/completions", truncated.dump());
  EXPECT_EQ(bad.status, 400) << bad.raw;
  EXPECT_EQ(bad.body["error"]["param"], "truncate_prompt_tokens");
}

// Overlapped steps (BLOCKSPEC_OVERLAP, SchedulerOptions::overlap): the plain server gives the
// same texts, finish reasons and token counts with them on and off for concurrent requests
// (greedy, seeded sampling, stop strings, logprobs, different max_tokens).
TEST(Server, OverlappedStepsKeepOutputs) {
  std::vector<json> bodies;
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily saw",
                                            "One day"};
  for (size_t i = 0; i < 12; ++i) {
    json b{{"prompt", prompts[i % prompts.size()]}, {"max_tokens", 10 + 9 * (i % 5)}};
    if (i % 3 == 0) {
      b["temperature"] = 0;
    } else {
      b["temperature"] = 0.9;
      b["top_p"] = 0.95;
      b["seed"] = static_cast<int>(i);
    }
    if (i % 4 == 1) b["stop"] = json({"park", "Lily"});
    if (i == 7) b["logprobs"] = 2;
    bodies.push_back(b);
  }
  std::map<std::string, std::vector<json>> got;
  for (const char* overlap : {"1", "0"}) {
    ASSERT_EQ(setenv("BLOCKSPEC_OVERLAP", overlap, 1), 0);
    RunningServer server({.max_num_seqs = 6}, /*drafter=*/false);
    std::vector<Reply> replies(bodies.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < bodies.size(); ++i) {
      clients.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(3 * (i % 4)));
        replies[i] = post(server.port(), "/v1/completions", bodies[i].dump());
      });
    }
    for (auto& c : clients) c.join();
    for (size_t i = 0; i < bodies.size(); ++i) {
      ASSERT_EQ(replies[i].status, 200) << replies[i].raw;
      const json& choice = replies[i].body["choices"][0];
      got[overlap].push_back({{"text", choice["text"]},
                              {"finish_reason", choice["finish_reason"]},
                              {"logprobs", choice["logprobs"]},
                              {"tokens", replies[i].body["usage"]["completion_tokens"]}});
    }
  }
  unsetenv("BLOCKSPEC_OVERLAP");
  std::set<std::string> reasons;
  for (size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(got["1"][i], got["0"][i]) << "request " << i << ": " << bodies[i].dump();
    reasons.insert(got["0"][i]["finish_reason"].get<std::string>());
  }
  EXPECT_TRUE(reasons.count("stop") && reasons.count("length"));
}

TEST(Server, MaxTokensEndsWithLength) {
  RunningServer server;
  const Reply r =
      post(server.port(), "/v1/completions",
           json{{"prompt", "Once upon a time"}, {"max_tokens", 7}, {"temperature", 0}}.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 7);
  // Sampling with a seed is reproducible.
  const std::string sampled = json{
      {"prompt", "The dog"},
      {"max_tokens", 30},
      {"temperature", 1},
      {"top_p", 0.9},
      {"seed", 5}}.dump();
  EXPECT_EQ(post(server.port(), "/v1/completions", sampled).body["choices"][0]["text"],
            post(server.port(), "/v1/completions", sampled).body["choices"][0]["text"]);
  // min_p 1 keeps only the most likely token: sampling at temperature 1 is greedy decoding.
  const json greedy = json{{"prompt", "The dog"}, {"max_tokens", 30}, {"temperature", 0}};
  json min_p_1 = greedy;
  min_p_1["temperature"] = 1;
  min_p_1["min_p"] = 1;
  min_p_1["seed"] = 9;
  const Reply g = post(server.port(), "/v1/completions", greedy.dump());
  const Reply m = post(server.port(), "/v1/completions", min_p_1.dump());
  ASSERT_EQ(m.status, 200) << m.raw;
  EXPECT_EQ(m.body["choices"][0]["text"], g.body["choices"][0]["text"]);
  // logit_bias +100 on one token: every token is that one (tests/e2e/logit_processing_test.cc
  // checks the penalties' rule); a frequency penalty changes the greedy text.
  const int32_t forced = 300;
  json biased = greedy;
  biased["max_tokens"] = 5;
  biased["logit_bias"] = {{std::to_string(forced), 100}};
  biased["logprobs"] = 0;
  const Reply b = post(server.port(), "/v1/completions", biased.dump());
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(b.body["usage"]["completion_tokens"], 5);
  const std::string piece = b.body["choices"][0]["logprobs"]["tokens"][0].get<std::string>();
  for (const auto& t : b.body["choices"][0]["logprobs"]["tokens"]) EXPECT_EQ(t, piece);
  json penalized = greedy;
  penalized["frequency_penalty"] = 2;
  penalized["presence_penalty"] = 1;
  const Reply f = post(server.port(), "/v1/completions", penalized.dump());
  ASSERT_EQ(f.status, 200) << f.raw;
  EXPECT_NE(f.body["choices"][0]["text"], g.body["choices"][0]["text"]);
}

// ignore_eos: generation runs to max_tokens through EOS; stop_token_ids end it at the first of
// them (kept in the output, as an EOS is), finish_reason "stop". stories260K's greedy stories
// never emit </s>, so the test serves a copy whose EOS (generation_config.json's eos_token_id,
// which a tokenizer_config.json without eos_token leaves in charge) is a token its greedy
// continuation of the prompt contains.
TEST(Server, IgnoreEosAndStopTokenIds) {
  namespace fs = std::filesystem;
  const std::string prompt = "Once upon a time";
  std::vector<int32_t> reference;  // 200 greedy tokens, no stop
  {
    Engine engine;
    auto backend = make_cpu_backend(1);
    auto target = load_target(kModel, *backend);
    ASSERT_TRUE(target.ok());
    GenerateOptions none;
    none.max_tokens = 200;
    auto out =
        generate_plain(**target, engine.tokenizer().encode(prompt, true), none, nullptr, nullptr);
    ASSERT_TRUE(out.ok());
    reference = *out;
  }
  const auto first_of = [&](int32_t id) {
    return static_cast<size_t>(std::find(reference.begin(), reference.end(), id) -
                               reference.begin());
  };
  const int32_t eos = reference[5], stop_id = reference[9];
  ASSERT_LT(first_of(eos), 100u);
  ASSERT_NE(first_of(stop_id), first_of(eos));
  const fs::path dir = fs::temp_directory_path() / ("bs_server_eos_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    fs::copy_file(fs::path(kModel) / f, dir / f, fs::copy_options::overwrite_existing);
  }
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "add_bos_token": true,
             "add_eos_token": false, "legacy": true})";
  std::ofstream(dir / "generation_config.json")
      << fmt::format(R"({{"bos_token_id": 1, "eos_token_id": {}}})", eos);
  {
    RunningServer server({}, /*drafter=*/true, dir.string());
    const json body = {{"prompt", prompt}, {"max_tokens", 200}, {"temperature", 0}};
    const Reply plain = post(server.port(), "/v1/completions", body.dump());
    ASSERT_EQ(plain.status, 200) << plain.raw;
    EXPECT_EQ(plain.body["usage"]["completion_tokens"], first_of(eos) + 1);  // ends at the EOS
    EXPECT_EQ(plain.body["choices"][0]["finish_reason"], "stop");
    json ignoring = body;
    ignoring["ignore_eos"] = true;
    const Reply ignored = post(server.port(), "/v1/completions", ignoring.dump());
    ASSERT_EQ(ignored.status, 200) << ignored.raw;
    EXPECT_EQ(ignored.body["usage"]["completion_tokens"], 200);
    EXPECT_EQ(ignored.body["choices"][0]["finish_reason"], "length");
    ignoring["stop_token_ids"] = {stop_id};
    const Reply stopped = post(server.port(), "/v1/completions", ignoring.dump());
    ASSERT_EQ(stopped.status, 200) << stopped.raw;
    EXPECT_EQ(stopped.body["usage"]["completion_tokens"], first_of(stop_id) + 1);
    EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
  }
  fs::remove_all(dir);
}

// Several prompts and n choices per prompt: choices listed prompt by prompt, each what a request
// of its own gives (a seeded choice j draws with seed + j), streamed or not; usage counts each
// prompt once.
TEST(Server, SeveralPromptsAndNChoices) {
  RunningServer server;
  Engine engine;
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  GenerateOptions greedy;
  greedy.max_tokens = 20;
  const json body = {{"prompt", prompts}, {"n", 2}, {"max_tokens", 20}, {"temperature", 0}};
  const Reply r = post(server.port(), "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choices = r.body["choices"];
  ASSERT_EQ(choices.size(), 4u) << r.raw;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(choices[i]["index"], i);
    EXPECT_EQ(choices[i]["text"], engine.text(prompts[i / 2], greedy, /*drafter=*/true)) << i;
    const Reply alone =
        post(server.port(), "/v1/completions",
             json{{"prompt", prompts[i / 2]}, {"max_tokens", 20}, {"temperature", 0}}.dump());
    EXPECT_EQ(choices[i]["finish_reason"], alone.body["choices"][0]["finish_reason"]);
    if (i % 2 == 0) prompt_tokens += alone.body["usage"]["prompt_tokens"].get<int64_t>();
    completion_tokens += alone.body["usage"]["completion_tokens"].get<int64_t>();
  }
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], completion_tokens);

  // Streamed: each index's text joins to its choice; one finish chunk per index; usage as above.
  json streamed = body;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  const Reply sr = post(server.port(), "/v1/completions", streamed.dump());
  ASSERT_EQ(sr.status, 200);
  std::vector<std::string> texts(4);
  std::vector<int> finishes(4);
  json usage;
  const auto events = sse_events(sr.raw);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    const json event = json::parse(e);
    EXPECT_EQ(event["id"], json::parse(events.front())["id"]);
    if (event["choices"].empty()) {
      usage = event["usage"];
      continue;
    }
    const json& c = event["choices"][0];
    const int index = c["index"].get<int>();
    ASSERT_TRUE(index >= 0 && index < 4);
    texts[index] += c["text"].get<std::string>();
    finishes[index] += !c["finish_reason"].is_null();
  }
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(texts[i], choices[i]["text"]) << i;
    EXPECT_EQ(finishes[i], 1) << i;
  }
  EXPECT_EQ(usage, r.body["usage"]);

  // Seeded sampling: choice j is the single request with seed 5 + j.
  const json sampled = {
      {"prompt", prompts[0]}, {"n", 3}, {"max_tokens", 24}, {"temperature", 0.9}, {"seed", 5}};
  const Reply sp = post(server.port(), "/v1/completions", sampled.dump());
  ASSERT_EQ(sp.status, 200) << sp.raw;
  std::set<std::string> distinct;
  for (int j = 0; j < 3; ++j) {
    json one = sampled;
    one["n"] = 1;
    one["seed"] = 5 + j;
    EXPECT_EQ(sp.body["choices"][j]["text"], completion_text(server.port(), one)) << j;
    distinct.insert(sp.body["choices"][j]["text"].get<std::string>());
  }
  EXPECT_GT(distinct.size(), 1u);
}

TEST(Server, BadRequestsAreClearErrorsAndTheServerSurvives) {
  RunningServer server;
  const std::vector<int32_t> long_prompt(600, 300);
  struct Case {
    std::string path, body;
    int status;
    std::string message;  // part of error.message
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, "not valid JSON"},
      {"/v1/completions", "[1, 2]", 400, "JSON object"},
      {"/v1/completions", R"({"max_tokens": 5})", 400, "prompt is required"},
      {"/v1/completions", R"({"prompt": ""})", 400, "prompt is empty"},
      {"/v1/completions", R"({"prompt": []})", 400, "prompt is empty"},
      {"/v1/completions", R"({"prompt": 42})", 400, "prompt must be a string"},
      {"/v1/completions", R"({"prompt": ["a", 3]})", 400, "prompt must be a string or a list"},
      {"/v1/completions", R"({"prompt": [[1, 2], []]})", 400, "prompt is empty"},
      {"/v1/completions", R"({"prompt": [1, -3]})", 400, "non-negative token ids"},
      {"/v1/completions", R"({"prompt": [1, 99999]})", 400, "token id 99999 out of range"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 0})", 400,
       "max_tokens must be at least 1"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": -4})", 400,
       "max_tokens must be at least 1"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": "10"})", 400,
       "max_tokens must be an integer"},
      {"/v1/completions", R"({"prompt": "hi", "temperature": "hot"})", 400,
       "temperature must be a number"},
      {"/v1/completions", R"({"prompt": "hi", "temperature": -1})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "hi", "top_p": 1.5})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "hi", "min_p": 1.5})", 400, "min_p must be in [0, 1]"},
      {"/v1/completions", R"({"prompt": "hi", "min_p": "low"})", 400, "min_p must be a number"},
      {"/v1/completions", R"({"prompt": "hi", "stop": 3})", 400, "stop must be a string"},
      {"/v1/completions", R"({"prompt": "hi", "stream": "yes"})", 400, "stream must be a boolean"},
      {"/v1/completions", R"({"prompt": "hi", "n": 0})", 400, "n must be at least 1"},
      {"/v1/completions", R"({"prompt": "hi", "presence_penalty": 2.5})", 400,
       "presence_penalty must be in [-2, 2]"},
      {"/v1/completions", R"({"prompt": "hi", "frequency_penalty": "x"})", 400,
       "frequency_penalty must be a number"},
      {"/v1/completions", R"({"prompt": "hi", "frequency_penalty": -3})", 400,
       "frequency_penalty must be in [-2, 2]"},
      {"/v1/completions", R"({"prompt": "hi", "repetition_penalty": 0})", 400,
       "repetition_penalty must be a finite number > 0"},
      {"/v1/completions", R"({"prompt": "hi", "min_tokens": -1})", 400, "min_tokens must be >= 0"},
      {"/v1/completions", R"({"prompt": "hi", "min_tokens": 1.5})", 400,
       "min_tokens must be an integer"},
      {"/v1/completions", R"({"prompt": "hi", "logit_bias": [5]})", 400,
       "logit_bias must be an object"},
      {"/v1/completions", R"({"prompt": "hi", "logit_bias": {"five": 10}})", 400,
       "logit_bias keys must be token ids"},
      {"/v1/completions", R"({"prompt": "hi", "logit_bias": {"5": "up"}})", 400,
       "logit_bias value of token 5 must be a number"},
      {"/v1/completions", R"({"prompt": "hi", "logit_bias": {"5": 101}})", 400,
       "logit_bias value of token 5 must be in [-100, 100]"},
      {"/v1/completions", R"({"prompt": "hi", "logit_bias": {"99999": 1}})", 400,
       "logit_bias: token id 99999 out of range"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})",
       400, "response_format is not supported"},
      {"/v1/completions", R"({"prompt": ["a", "b"], "n": 65})", 400, "at most 128"},
      {"/v1/completions", R"({"prompt": "hi", "n": 2, "best_of": 3})", 400, "only best_of = n"},
      {"/v1/completions", R"({"prompt": "hi", "echo": "yes"})", 400, "echo must be a boolean"},
      {"/v1/completions", R"({"prompt": "hi", "ignore_eos": 1})", 400,
       "ignore_eos must be a boolean"},
      {"/v1/completions", R"({"prompt": "hi", "stop_token_ids": 2})", 400,
       "stop_token_ids must be a list"},
      {"/v1/completions", R"({"prompt": "hi", "stop_token_ids": [2, -1]})", 400,
       "non-negative token ids"},
      {"/v1/completions", R"({"prompt": "hi", "stop_token_ids": [99999]})", 400,
       "token id 99999 out of range"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "echo": true})",
       400, "echo is only supported by /v1/completions"},
      {"/v1/completions", R"({"prompt": "hi", "logprobs": 21})", 400,
       "logprobs must be in [0, 20], got 21"},
      {"/v1/completions", R"({"prompt": "hi", "logprobs": -1})", 400,
       "logprobs must be in [0, 20], got -1"},
      {"/v1/completions", R"({"prompt": "hi", "logprobs": true})", 400,
       "logprobs must be an integer in [0, 20], got boolean"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 3})", 400,
       "logprobs must be a boolean"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21})",
       400, "top_logprobs must be in [0, 20], got 21"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", 400,
       "top_logprobs requires logprobs: true"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": false, "top_logprobs": 0})",
       400, "top_logprobs requires logprobs: true"},
      {"/v1/completions", json{{"prompt", long_prompt}}.dump(), 400,
       "prompt too long: 600 tokens, the context window is 512 tokens"},
      {"/v1/completions", R"({"prompt": "hi", "model": "gpt-4"})", 404,
       "model 'gpt-4' does not exist"},
      {"/v1/nothing", "{}", 404, "no route POST /v1/nothing"},
      {"/tokenize", R"({"text": "hi"})", 400, "prompt (a string) is required"},
      {"/detokenize", R"({"tokens": "hi"})", 400, "tokens (a list of token ids) is required"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "messages must be a non-empty list"},
  };
  for (const Case& c : cases) {
    const Reply r = post(server.port(), c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.raw;
    ASSERT_TRUE(r.body.contains("error")) << c.body << " -> " << r.raw;
    const std::string message = r.body["error"]["message"];
    EXPECT_NE(message.find(c.message), std::string::npos) << c.body << " -> " << message;
    EXPECT_TRUE(r.body["error"].contains("type") && r.body["error"].contains("param") &&
                r.body["error"].contains("code"));
  }
  EXPECT_EQ(get(server.port(), "/nowhere").status, 404);
  // Still serving.
  EXPECT_EQ(get(server.port(), "/health").status, 200);
  EXPECT_EQ(post(server.port(), "/v1/completions", R"({"prompt": "hi", "max_tokens": 3})").status,
            200);
  // Neutral values, as clients often send them, are fine.
  EXPECT_EQ(post(server.port(), "/v1/completions",
                 R"({"prompt": "hi", "max_tokens": 3, "presence_penalty": 0, "frequency_penalty": 0,
                     "repetition_penalty": 1, "min_p": 0, "min_tokens": 0, "logit_bias": {},
                     "response_format": {"type": "text"}, "n": null, "best_of": null})")
                .status,
            200);
}

TEST(Server, ChatWithoutATemplateIsAClearError) {
  RunningServer server;
  const Reply r = post(server.port(), "/v1/chat/completions",
                       R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("/v1/completions"),
            std::string::npos)
      << r.raw;
}

// A copy of the embedded model with a chat template (chat_template.jinja) that shows the
// messages and a template variable passed through chat_template_kwargs.
std::string model_with_chat_template() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("bs_server_chat_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* f :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(kModel) / f, dir / f, fs::copy_options::overwrite_existing);
  }
  std::ofstream(dir / "chat_template.jinja")
      << "{% if tools %}tools: {{ tools | tojson }}\n{% endif %}"
         "{% if cfg is defined %}{{ cfg | tojson }}\n{% endif %}"
         "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}";
  return dir.string();
}

TEST(Server, ChatRendersTheModelsTemplate) {
  const std::string dir = model_with_chat_template();
  RunningServer server({}, /*drafter=*/true, dir);
  Engine engine;
  // The rendered prompt (no BOS: the template adds none, and rendered text is encoded without
  // special tokens). Key order of template variables is the request's (as in Python).
  const std::string prompt =
      "{\"z\": 1, \"a\": [2, 3]}\nsystem: Tell a story.\nuser: Once upon a "
      "time\nassistant:";
  const auto want = engine.greedy(prompt, 20, /*add_special_tokens=*/false);
  const Reply r = post(server.port(), "/v1/chat/completions",
                       R"({"messages": [{"role": "system", "content": "Tell a story."},
                                        {"role": "user", "content": [{"type": "text", "text": "Once upon a time"}]}],
                           "chat_template_kwargs": {"cfg": {"z": 1, "a": [2, 3]}},
                           "max_tokens": 20, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["object"], "chat.completion");
  EXPECT_EQ(r.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], want.text);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], want.prompt_tokens);
  // Streamed: the deltas add up to the same text.
  httplib::Client cli("127.0.0.1", server.port());
  auto sr = cli.Post("/v1/chat/completions",
                     R"({"messages": [{"role": "system", "content": "Tell a story."},
                                      {"role": "user", "content": "Once upon a time"}],
                         "chat_template_kwargs": {"cfg": {"z": 1, "a": [2, 3]}},
                         "max_tokens": 20, "temperature": 0, "stream": true})",
                     "application/json");
  ASSERT_TRUE(sr);
  std::string streamed;
  for (const std::string& e : sse_events(sr->body)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      streamed += delta["content"].get<std::string>();
    }
  }
  EXPECT_EQ(streamed, want.text);
  // n = 2, streamed: each choice gets its role chunk and the same greedy text.
  auto nr = cli.Post("/v1/chat/completions",
                     R"({"messages": [{"role": "system", "content": "Tell a story."},
                                      {"role": "user", "content": "Once upon a time"}],
                         "chat_template_kwargs": {"cfg": {"z": 1, "a": [2, 3]}},
                         "max_tokens": 20, "temperature": 0, "stream": true, "n": 2})",
                     "application/json");
  ASSERT_TRUE(nr);
  std::vector<std::string> texts(2);
  std::vector<int> roles(2);
  for (const std::string& e : sse_events(nr->body)) {
    if (e == "[DONE]") continue;
    const json event = json::parse(e);
    const json& choice = event["choices"][0];
    const int index = choice["index"].get<int>();
    ASSERT_TRUE(index == 0 || index == 1) << e;
    const json& delta = choice["delta"];
    roles[index] += delta.contains("role");
    if (delta.contains("content") && delta["content"].is_string()) {
      texts[index] += delta["content"].get<std::string>();
    }
  }
  EXPECT_EQ(roles, (std::vector<int>{1, 1}));
  EXPECT_EQ(texts, (std::vector<std::string>{want.text, want.text}));
  std::filesystem::remove_all(dir);
}

// The completions logprobs of `body` (streamed when body["stream"]: the chunks' lists joined).
json completion_logprobs(int port, json body) {
  const Reply r = post(port, "/v1/completions", body.dump());
  EXPECT_EQ(r.status, 200) << r.raw;
  if (!body.value("stream", false)) return r.body["choices"][0]["logprobs"];
  json joined = {{"tokens", json::array()},
                 {"token_logprobs", json::array()},
                 {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  for (const auto& e : sse_events(r.raw)) {
    if (e == "[DONE]") continue;
    const json event = json::parse(e);
    const json& lp = event["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (auto& [key, list] : joined.items()) {
      for (const json& v : lp[key]) list.push_back(v);
    }
  }
  return joined;
}

TEST(Server, CompletionLogprobsEqualTheEngines) {
  Engine engine;
  for (bool drafter : {true, false}) {
    RunningServer server({}, drafter);
    const std::string prompt = "Once upon a time";
    const auto ids = engine.tokenizer().encode(prompt, true);
    GenerateOptions greedy;
    greedy.max_tokens = 30;
    greedy.logprobs = 3;
    GenerateOptions sampled = greedy;
    sampled.sampling = {.temperature = 0.8f, .seed = 7};
    for (const GenerateOptions& o : {greedy, sampled}) {
      const std::string where =
          fmt::format("drafter {} temperature {}", drafter, o.sampling.temperature);
      const std::vector<TokenLogprobs> want = engine.logprobs(ids, o, drafter);
      ASSERT_FALSE(want.empty());
      json body = {{"prompt", prompt},
                   {"max_tokens", o.max_tokens},
                   {"temperature", o.sampling.temperature},
                   {"seed", 7},
                   {"logprobs", 3}};
      const json lp = completion_logprobs(server.port(), body);
      ASSERT_EQ(lp["tokens"].size(), want.size()) << where << lp.dump();
      std::vector<int32_t> context = ids;  // token texts continue the prompt's
      std::string joined;
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string text = engine.token_text(context, want[i].token);
        EXPECT_EQ(lp["tokens"][i], text) << where;
        EXPECT_EQ(lp["token_logprobs"][i].get<double>(), want[i].logprob) << where;  // exactly
        EXPECT_EQ(lp["text_offset"][i], joined.size()) << where;  // ASCII stories
        joined += text;
        const json& top = lp["top_logprobs"][i];
        ASSERT_TRUE(top.is_object() && top.contains(text)) << where << top.dump();
        EXPECT_LE(top.size(), 4u) << where;  // the top 3 and the chosen token
        EXPECT_EQ(top.at(text).get<double>(), want[i].logprob) << where;
        for (const TopLogprob& t : want[i].top) {
          const std::string alt = engine.token_text(context, t.token);
          ASSERT_TRUE(top.contains(alt)) << where << top.dump();
          // Equal unless two ids share a text (the likelier is kept).
          EXPECT_GE(top.at(alt).get<double>(), t.logprob) << where;
        }
        context.push_back(want[i].token);
      }
      if (o.sampling.greedy()) {
        EXPECT_EQ(joined, completion_text(server.port(), body)) << where;
      }
      body["stream"] = true;
      EXPECT_EQ(completion_logprobs(server.port(), body), lp) << where;
    }
    // Off: null, and the text does not change with logprobs on.
    const Reply off = post(server.port(), "/v1/completions",
                           json{{"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0}}.dump());
    const Reply on = post(
        server.port(), "/v1/completions",
        json{{"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0}, {"logprobs", 0}}.dump());
    EXPECT_TRUE(off.body["choices"][0]["logprobs"].is_null()) << off.raw;
    EXPECT_EQ(on.body["choices"][0]["text"], off.body["choices"][0]["text"]);
    EXPECT_EQ(on.body["choices"][0]["logprobs"]["top_logprobs"][0].size(), 1u) << on.raw;
  }
}

// The reply continues the prompt's text: its first word keeps its leading space (" ball.", as
// vLLM and llama.cpp return; SentencePiece's decoder strips one leading space of the whole text
// only), streamed or not, in the logprob token texts too; echo reads as prompt + reply.
TEST(Server, TheReplyKeepsTheLeadingSpaceOfItsFirstWord) {
  RunningServer server;
  for (const bool stream : {false, true}) {
    const std::string where = fmt::format("stream {}", stream);
    json body = {
        {"prompt", "Tom had a red"}, {"max_tokens", 3}, {"temperature", 0}, {"stream", stream}};
    EXPECT_EQ(completion_text(server.port(), body), " ball.") << where;
    body["logprobs"] = 1;
    const json lp = completion_logprobs(server.port(), body);
    ASSERT_EQ(lp["tokens"].size(), 3u) << where << lp.dump();
    EXPECT_EQ(lp["tokens"][0], " b") << where;
    EXPECT_EQ(lp["text_offset"][1], 2) << where;
    body["echo"] = true;
    EXPECT_EQ(completion_text(server.port(), body), "Tom had a red ball.") << where;
    const json echoed = completion_logprobs(server.port(), body);
    ASSERT_EQ(echoed["tokens"].size(), 10u) << where << echoed.dump();
    EXPECT_EQ(echoed["tokens"][7], " b") << where;
  }
}

// Echo with logprobs scores the prompt (what evaluation harnesses send for log-likelihoods:
// token ids, echo, logprobs, max_tokens 0 or 1). The reference is transformers: the stories260K
// golden's fp32 logits at positions 0..39 of [BOS] + ids[:39] (row i predicts token i + 1).
TEST(Server, EchoScoresThePromptAsTransformers) {
  auto golden = io::Checkpoint::open_file(std::string(BS_TEST_DATA) +
                                          "/stories260K-golden/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  const auto read = [&](const std::string& name) {
    auto info = golden->get(name);
    EXPECT_TRUE(info.ok()) << name;
    std::vector<float> out((*info)->numel());
    convert_to_f32((*info)->dtype, (*info)->data, out.data(), out.size());
    return out;
  };
  const std::vector<float> logits = read("logits");  // [40, vocab]
  const std::vector<float> ids = read("ids");
  const int64_t V = static_cast<int64_t>(logits.size()) / 40;
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 39; ++i) prompt.push_back(static_cast<int32_t>(ids[i]));
  Engine engine;
  RunningServer server;
  for (const int64_t max_tokens : {0, 1}) {
    for (const bool stream : {false, true}) {
      const std::string where = fmt::format("max_tokens {} stream {}", max_tokens, stream);
      const json body = {{"prompt", prompt}, {"echo", true},     {"logprobs", 3},
                         {"temperature", 0}, {"stream", stream}, {"max_tokens", max_tokens}};
      const json lp = completion_logprobs(server.port(), body);
      const size_t P = prompt.size();
      ASSERT_EQ(lp["tokens"].size(), P + max_tokens) << where << lp.dump();
      EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << where;
      EXPECT_TRUE(lp["top_logprobs"][0].is_null()) << where;
      std::string text;
      for (size_t i = 0; i < P; ++i) {
        const std::string token =
            engine.token_text({prompt.begin(), prompt.begin() + i}, prompt[i]);
        EXPECT_EQ(lp["tokens"][i], token) << where << " token " << i;
        EXPECT_EQ(lp["text_offset"][i], text.size()) << where;
        text += token;
        if (i == 0) continue;
        // log_softmax of the golden row i - 1 at prompt[i], in double.
        const float* row = logits.data() + (i - 1) * V;
        const double mx = *std::max_element(row, row + V);
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
        const double want = row[prompt[i]] - mx - std::log(sum);
        EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), want, 1e-4) << where << " token " << i;
        // Its top 3 hold the golden row's most likely token.
        const int32_t best = static_cast<int32_t>(std::max_element(row, row + V) - row);
        const std::string best_text = engine.token_text({prompt.begin(), prompt.begin() + i}, best);
        EXPECT_TRUE(lp["top_logprobs"][i].contains(best_text)) << where << " token " << i;
      }
      const Reply r = post(server.port(), "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.raw;
      if (!stream) {
        const json& choice = r.body["choices"][0];
        // The text starts with the prompt (as the ids decode); max_tokens 0 ends with length.
        EXPECT_EQ(choice["text"].get<std::string>().substr(0, text.size()), text) << where;
        EXPECT_EQ(r.body["usage"]["prompt_tokens"], P) << where;
        EXPECT_EQ(r.body["usage"]["completion_tokens"], max_tokens) << where;
        EXPECT_EQ(choice["finish_reason"], "length") << where;
        // The generated token is the golden greedy continuation.
        if (max_tokens == 1) {
          EXPECT_EQ(lp["tokens"][P], engine.token_text(prompt, static_cast<int32_t>(ids[39])));
        }
      }
    }
  }
  // Echo without logprobs: the prompt text, then the completion of the same request without echo.
  const json plain = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
  json echoed = plain;
  echoed["echo"] = true;
  EXPECT_EQ(completion_text(server.port(), echoed),
            "Once upon a time" + completion_text(server.port(), plain));
}

TEST(Server, ChatLogprobsEqualTheEngines) {
  const std::string dir = model_with_chat_template();
  RunningServer server({}, /*drafter=*/true, dir);
  Engine engine;
  const auto ids = engine.tokenizer().encode("user: Once upon a time\nassistant:", false);
  GenerateOptions o;
  o.max_tokens = 20;
  o.logprobs = 2;
  const std::vector<TokenLogprobs> want = engine.logprobs(ids, o, /*drafter=*/true);
  json body = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
               {"max_tokens", 20},
               {"temperature", 0},
               {"logprobs", true},
               {"top_logprobs", 2}};
  const auto bytes = [](const std::string& s) {
    json b = json::array();
    for (char c : s) b.push_back(static_cast<unsigned char>(c));
    return b;
  };
  const Reply r = post(server.port(), "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& content = r.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), want.size()) << r.raw;
  std::vector<int32_t> context = ids;  // token texts continue the prompt's
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string text = engine.token_text(context, want[i].token);
    EXPECT_EQ(content[i]["token"], text);
    EXPECT_EQ(content[i]["logprob"].get<double>(), want[i].logprob);
    EXPECT_EQ(content[i]["bytes"], bytes(text));
    ASSERT_EQ(content[i]["top_logprobs"].size(), 2u);
    for (size_t j = 0; j < 2; ++j) {
      const std::string alt = engine.token_text(context, want[i].top[j].token);
      EXPECT_EQ(content[i]["top_logprobs"][j]["token"], alt);
      EXPECT_EQ(content[i]["top_logprobs"][j]["logprob"].get<double>(), want[i].top[j].logprob);
      EXPECT_EQ(content[i]["top_logprobs"][j]["bytes"], bytes(alt));
    }
    context.push_back(want[i].token);
  }
  // Streamed: the chunks' content lists join to the same list.
  body["stream"] = true;
  const Reply sr = post(server.port(), "/v1/chat/completions", body.dump());
  json streamed = json::array();
  for (const std::string& e : sse_events(sr.raw)) {
    if (e == "[DONE]") continue;
    const json event = json::parse(e);
    const json& lp = event["choices"][0]["logprobs"];
    if (!lp.is_null()) {
      for (const json& entry : lp["content"]) streamed.push_back(entry);
    }
  }
  EXPECT_EQ(streamed, content);
  // logprobs without top_logprobs: no alternatives.
  body.erase("top_logprobs");
  body["stream"] = false;
  const Reply plain = post(server.port(), "/v1/chat/completions", body.dump());
  ASSERT_EQ(plain.status, 200) << plain.raw;
  EXPECT_EQ(plain.body["choices"][0]["logprobs"]["content"][0]["top_logprobs"], json::array());
  std::filesystem::remove_all(dir);
}

TEST(Server, ToolCallParserDefaultsToHermesWhenTheTemplateMentionsToolCall) {
  const std::string dir = model_with_chat_template();
  const auto parser = [&](const std::string& name) {
    auto m = load_served_model(
        {.model_dir = dir, .device = "cpu", .threads = 1, .tool_call_parser = name});
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? m->tool_call_parser : ToolCallParser::kNone;
  };
  EXPECT_EQ(parser("auto"), ToolCallParser::kNone);
  EXPECT_EQ(parser("llama3_json"), ToolCallParser::kLlama3Json);
  std::ofstream(dir + "/chat_template.jinja", std::ios::app) << "{# reply in <tool_call> #}";
  EXPECT_EQ(parser("auto"), ToolCallParser::kHermes);
  EXPECT_EQ(parser("none"), ToolCallParser::kNone);
  auto bad = load_served_model({.model_dir = dir, .device = "cpu", .tool_call_parser = "xml"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--tool-call-parser xml"), std::string::npos);
  EXPECT_EQ(load_served_model({.model_dir = kModel, .device = "cpu"})->tool_call_parser,
            ToolCallParser::kNone);  // no template at all
  std::filesystem::remove_all(dir);
}

TEST(Server, ChatPassesToolsToTheTemplate) {
  const std::string dir = model_with_chat_template();
  // The template (a Jinja comment, so the prompt is unchanged) asks for <tool_call> replies:
  // the server parses hermes tool calls; the tiny model's text holds none, so it stays content.
  std::ofstream(dir + "/chat_template.jinja", std::ios::app) << "{# reply in <tool_call> #}";
  RunningServer server({}, /*drafter=*/false, dir);
  Engine engine;
  const std::string prompt =
      "tools: [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
      "{}}}]\nuser: Hi\nassistant:";
  const auto want = engine.greedy(prompt, 12, /*add_special_tokens=*/false);
  const Reply r = post(server.port(), "/v1/chat/completions",
                       R"({"messages": [{"role": "user", "content": "Hi"}],
                           "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                           "max_tokens": 12, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], want.text);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], want.prompt_tokens);
  EXPECT_FALSE(r.body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], want.finish_reason);
  // Streamed through the tool-call stream: the deltas add up to the same text.
  const Reply sr = post(server.port(), "/v1/chat/completions",
                        R"({"messages": [{"role": "user", "content": "Hi"}],
                            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                            "tool_choice": "auto", "max_tokens": 12, "temperature": 0,
                            "stream": true})");
  ASSERT_EQ(sr.status, 200) << sr.raw;
  std::string streamed;
  std::string finish;
  for (const std::string& e : sse_events(sr.raw)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    const json& delta = chunk["choices"][0]["delta"];
    EXPECT_FALSE(delta.contains("tool_calls"));
    if (delta.contains("content") && delta["content"].is_string()) {
      streamed += delta["content"].get<std::string>();
    }
    if (chunk["choices"][0]["finish_reason"].is_string()) {
      finish = chunk["choices"][0]["finish_reason"];
    }
  }
  EXPECT_EQ(streamed, want.text);
  EXPECT_EQ(finish, want.finish_reason);
  // tool_choice "none" keeps the reply text; "required" and a named function are refused.
  const Reply none = post(server.port(), "/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "Hi"}],
                              "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                              "tool_choice": "none", "max_tokens": 12, "temperature": 0})");
  ASSERT_EQ(none.status, 200) << none.raw;
  EXPECT_EQ(none.body["choices"][0]["message"]["content"], want.text);
  for (const char* choice :
       {R"("required")", R"({"type": "function", "function": {"name": "f"}})", R"("sometimes")"}) {
    const Reply refused = post(server.port(), "/v1/chat/completions",
                               std::string(R"({"messages": [{"role": "user", "content": "Hi"}],
                            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                            "tool_choice": )") +
                                   choice + "}");
    EXPECT_EQ(refused.status, 400) << refused.raw;
    EXPECT_EQ(refused.body["error"]["param"], "tool_choice");
  }
  const Reply required = post(server.port(), "/v1/chat/completions",
                              R"({"messages": [{"role": "user", "content": "Hi"}],
                                  "tools": [], "tool_choice": "required"})");
  EXPECT_NE(required.body["error"]["message"].get<std::string>().find("not supported"),
            std::string::npos)
      << required.raw;
  const Reply bad = post(server.port(), "/v1/chat/completions",
                         R"({"messages": [{"role": "user", "content": "Hi"}], "tools": 3})");
  EXPECT_EQ(bad.status, 400) << bad.raw;
  std::filesystem::remove_all(dir);
}

TEST(Server, ConcurrentClientsAllGetTheirOwnOutput) {
  RunningServer server;
  Engine engine;
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Tom had a red",
                                            "Lily and Ben"};
  std::vector<std::string> want, got(prompts.size());
  for (const auto& p : prompts) want.push_back(engine.greedy(p, 50).text);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      got[i] = completion_text(
          server.port(),
          {{"prompt", prompts[i]}, {"max_tokens", 50}, {"temperature", 0}, {"stream", i % 2 == 1}});
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(got, want);
}

// Continuous batching: more concurrent requests than --max-num-seqs, greedy and seeded sampling,
// different lengths, streamed or not; each gets exactly the engine's single-request output.
TEST(Server, BatchedConcurrentRequestsEqualSingleRequestOutput) {
  Engine engine;
  struct Case {
    std::string prompt;
    int64_t max_tokens;
    bool sampled;
  };
  const std::vector<Case> cases = {{"Once upon a time", 60, false},
                                   {"The little dog", 25, true},
                                   {"Tom had a red", 40, false},
                                   {"Lily and Ben", 50, true},
                                   {"The sun was", 5, false},
                                   {"One day", 70, true},
                                   {"A cat", 33, false}};
  for (bool drafter : {true, false}) {
    RunningServer server({.max_num_seqs = 3}, drafter);
    std::vector<std::string> want, got(cases.size());
    for (const Case& c : cases) {
      GenerateOptions o;
      o.max_tokens = c.max_tokens;
      if (c.sampled) o.sampling = {.temperature = 1.0f, .top_p = 0.9f, .seed = 11};
      want.push_back(engine.text(c.prompt, o, drafter));
    }
    std::vector<std::thread> clients;
    for (size_t i = 0; i < cases.size(); ++i) {
      clients.emplace_back([&, i] {
        const Case& c = cases[i];
        json body = {{"prompt", c.prompt},
                     {"max_tokens", c.max_tokens},
                     {"temperature", c.sampled ? 1.0 : 0.0},
                     {"stream", i % 2 == 0}};
        if (c.sampled) {
          body["top_p"] = 0.9;
          body["seed"] = 11;
        }
        got[i] = completion_text(server.port(), body);
      });
    }
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << "drafter " << drafter << ", request " << i;
    }
    EXPECT_EQ(metric(server.port(), "vllm:num_requests_running{"), 0);
    EXPECT_EQ(metric(server.port(), "vllm:num_requests_waiting{"), 0);
  }
}

// A KV cache smaller than a request's worst case: that request is a 400 naming the sizes, the
// others are served.
TEST(Server, RequestTooLargeForTheKvCacheIsAClearError) {
  RunningServer server({.max_num_seqs = 2, .kv_cache_tokens = 128});
  const Reply big = post(server.port(), "/v1/completions",
                         R"({"prompt": "Once upon a time", "max_tokens": 300})");
  EXPECT_EQ(big.status, 400) << big.raw;
  EXPECT_NE(big.raw.find("too large for the KV cache"), std::string::npos) << big.raw;
  EXPECT_NE(big.raw.find("the pool has 8 blocks"), std::string::npos) << big.raw;
  Engine engine;
  const Reply ok = post(server.port(), "/v1/completions",
                        R"({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0})");
  ASSERT_EQ(ok.status, 200) << ok.raw;
  EXPECT_EQ(ok.body["choices"][0]["text"], engine.greedy("Once upon a time", 40).text);
}

// Out of memory for one request (an injected allocation failure, docs/RELIABILITY.md): that
// request gets a 503 naming the allocation, the server goes on serving the next ones exactly.
TEST(Server, AllocationFailureIsA503AndTheServerGoesOn) {
  Engine engine;
  const std::string want = engine.greedy("Once upon a time", 40).text;
  for (bool drafter : {true, false}) {
    RunningServer server({}, drafter);
    const std::string body =
        R"({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0})";
    ASSERT_EQ(post(server.port(), "/v1/completions", body).status, 200);  // scratch grown
    inject_allocation_failure(1);
    // A longer prompt than before: its prefill needs larger scratch.
    std::string longer;
    for (int i = 0; i < 10; ++i) longer += "The little dog ran to the park. ";
    const Reply failed =
        post(server.port(), "/v1/completions", json{{"prompt", longer}, {"max_tokens", 5}}.dump());
    const bool fired = !allocation_failure_pending();
    inject_allocation_failure(0);
    ASSERT_TRUE(fired);
    EXPECT_EQ(failed.status, 503) << failed.raw;
    EXPECT_NE(failed.raw.find("out of host memory"), std::string::npos) << failed.raw;
    EXPECT_NE(failed.raw.find("injected"), std::string::npos) << failed.raw;
    for (int i = 0; i < 2; ++i) {
      const Reply ok = post(server.port(), "/v1/completions", body);
      ASSERT_EQ(ok.status, 200) << ok.raw;
      EXPECT_EQ(ok.body["choices"][0]["text"], want) << "drafter " << drafter;
    }
  }
}

// --preemption with a KV cache that holds one request's worst case: concurrent requests are
// admitted optimistically, preempted and re-prefilled as the cache runs full, and every reply is
// 200 with the engine's greedy text.
TEST(Server, PreemptionServesEveryRequestWithItsOwnOutput) {
  Engine engine;
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Tom had a red",
                                            "Lily and Ben", "One day"};
  std::vector<std::string> want;
  for (const std::string& p : prompts) want.push_back(engine.greedy(p, 100).text);
  for (bool drafter : {true, false}) {
    RunningServer server({.max_num_seqs = 4, .kv_cache_tokens = 160, .preemption = true}, drafter);
    std::vector<Reply> replies(prompts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < prompts.size(); ++i) {
      clients.emplace_back([&, i] {
        replies[i] =
            post(server.port(), "/v1/completions",
                 json{{"prompt", prompts[i]}, {"max_tokens", 100}, {"temperature", 0}}.dump());
      });
    }
    for (std::thread& t : clients) t.join();
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(replies[i].status, 200) << replies[i].raw;
      EXPECT_EQ(replies[i].body["choices"][0]["text"], want[i]) << "drafter " << drafter;
    }
  }
}

// Prefix caching (on by default): a chat's second turn starts with its first turn's prompt, whose
// whole blocks it takes from the cache (usage.prompt_tokens_details.cached_tokens, the
// vllm:prefix_cache_* counters); replies equal the engine's greedy text with and without a
// drafter, and a server with it off (--no-enable-prefix-caching) reports no such field.
TEST(Server, PrefixCachingReportsCachedTokensAndKeepsReplies) {
  Engine engine;
  const std::string first =
      "Once upon a time, there was a little girl named Lily. She loved to play";
  const std::string second = first + " with her dog in the park. One day";
  const std::string want1 = engine.greedy(first, 20).text, want2 = engine.greedy(second, 20).text;
  for (bool drafter : {true, false}) {
    RunningServer server({.prefix_caching = true}, drafter);
    const auto ask = [&](const std::string& prompt) {
      return post(server.port(), "/v1/completions",
                  json{{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}}.dump());
    };
    const Reply r1 = ask(first), r2 = ask(second);
    ASSERT_EQ(r1.status, 200) << r1.raw;
    ASSERT_EQ(r2.status, 200) << r2.raw;
    EXPECT_EQ(r1.body["choices"][0]["text"], want1) << "drafter " << drafter;
    EXPECT_EQ(r2.body["choices"][0]["text"], want2) << "drafter " << drafter;
    EXPECT_EQ(r1.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    const int64_t first_tokens = r1.body["usage"]["prompt_tokens"].get<int64_t>();
    const int64_t cached = r2.body["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_EQ(cached, first_tokens / kKvBlockSize * kKvBlockSize) << "drafter " << drafter;
    EXPECT_GT(cached, 0);
    const std::string metrics = get(server.port(), "/metrics").raw;
    EXPECT_NE(
        metrics.find(fmt::format(
            "vllm:prefix_cache_hits_total{{model_name=\"stories260K\",engine=\"0\"}} {}", cached)),
        std::string::npos)
        << metrics;
  }
  EXPECT_TRUE(ServerOptions{}.prefix_caching);
  RunningServer plain({.prefix_caching = false});
  const Reply r =
      post(plain.port(), "/v1/completions", json{{"prompt", first}, {"max_tokens", 2}}.dump());
  EXPECT_FALSE(r.body["usage"].contains("prompt_tokens_details")) << r.raw;
}

TEST(Server, MetricsCountRequestsAndTokens) {
  RunningServer server;
  const Reply first = get(server.port(), "/metrics");
  ASSERT_EQ(first.status, 200);
  for (const char* name :
       {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:request_success_total",
        "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total", "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_sum"}) {
    EXPECT_NE(first.raw.find(name), std::string::npos) << name;
  }
  const double prompt0 = metric(server.port(), "vllm:prompt_tokens_total{");
  const double gen0 = metric(server.port(), "vllm:generation_tokens_total{");
  ASSERT_EQ(post(server.port(), "/v1/completions",
                 R"({"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0})")
                .status,
            200);
  EXPECT_EQ(metric(server.port(), "vllm:prompt_tokens_total{"), prompt0 + 5);
  EXPECT_EQ(metric(server.port(), "vllm:generation_tokens_total{"), gen0 + 30);
  EXPECT_EQ(metric(server.port(),
                   "vllm:request_success_total{model_name=\"stories260K\",engine=\"0\","
                   "finished_reason=\"length\"}"),
            1);
  EXPECT_GT(metric(server.port(), "vllm:spec_decode_num_drafts_total{"), 0);
  EXPECT_GT(metric(server.port(), "vllm:spec_decode_num_accepted_tokens_total{"), 0);
  EXPECT_GT(metric(server.port(),
                   "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="
                   "\"stories260K\",engine=\"0\",position=\"0\"}"),
            0);
  EXPECT_EQ(metric(server.port(), "vllm:e2e_request_latency_seconds_count{"), 1);
  EXPECT_EQ(metric(server.port(), "vllm:time_to_first_token_seconds_count{"), 1);
  EXPECT_EQ(metric(server.port(), "vllm:num_requests_running{"), 0);
}

TEST(Server, ApiKeyIsEnforced) {
  RunningServer server({.api_key = "s3cret"});
  const std::string body = R"({"prompt": "hi", "max_tokens": 3})";
  Reply r = post(server.port(), "/v1/completions", body);
  EXPECT_EQ(r.status, 401) << r.raw;
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("API key"), std::string::npos);
  EXPECT_EQ(
      post(server.port(), "/v1/completions", body, {{"Authorization", "Bearer wrong"}}).status,
      401);
  EXPECT_EQ(post(server.port(), "/tokenize", R"({"prompt": "hi"})").status, 401);
  EXPECT_EQ(
      post(server.port(), "/v1/completions", body, {{"Authorization", "Bearer s3cret"}}).status,
      200);
  EXPECT_EQ(get(server.port(), "/health").status, 200);
  EXPECT_EQ(get(server.port(), "/v1/models").status, 401);
}

TEST(Server, ModelsAndTokenizeRoundTrip) {
  RunningServer server;
  const Reply models = get(server.port(), "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["data"][0]["id"], "stories260K");
  EXPECT_EQ(models.body["data"][0]["max_model_len"], 512);
  const Reply tok = post(server.port(), "/tokenize", R"({"prompt": "Tom had a red"})");
  ASSERT_EQ(tok.status, 200) << tok.raw;
  EXPECT_EQ(tok.body["tokens"], json({1, 274, 287, 381, 261, 352, 266}));
  EXPECT_EQ(tok.body["count"], 7);
  const Reply plain = post(server.port(), "/tokenize",
                           R"({"prompt": "Tom had a red", "add_special_tokens": false})");
  const Reply detok =
      post(server.port(), "/detokenize", json{{"tokens", plain.body["tokens"]}}.dump());
  ASSERT_EQ(detok.status, 200) << detok.raw;
  EXPECT_EQ(detok.body["prompt"], "Tom had a red");
}

TEST(Server, ClientThatLeavesMidStreamDoesNotHurtOthers) {
  RunningServer server;
  test_util::post_and_leave(server.port(), "/v1/completions",
                            R"({"prompt": "Once upon a time", "max_tokens": 400, "stream": true})",
                            2);
  Engine engine;
  const Reply r = post(server.port(), "/v1/completions",
                       R"({"prompt": "The little dog", "max_tokens": 20, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["text"], engine.greedy("The little dog", 20).text);
}

// A series of /metrics by its name after the prefix (blockspec: or vllm:), e.g.
// "num_requests_running": the first one's value, or -1.
double series(int port, const std::string& name) {
  const Reply r = get(port, "/metrics");
  std::istringstream in(r.raw);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (line.empty() || line[0] == '#' || colon == std::string::npos) continue;
    if (line.compare(colon + 1, name.size() + 1, name + "{") == 0) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

// Waits (up to `limit`) until no request is running or waiting.
bool drained(int port, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (series(port, "num_requests_running") == 0 && series(port, "num_requests_waiting") == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Issue 16: a second server on a port in use used to start and share the traffic
// (SO_REUSEPORT); now it is refused, naming the port, and the binary exits with 1.
TEST(Server, SecondServerOnAPortInUseIsRefused) {
  RunningServer first;
  auto model = load_served_model({.model_dir = kModel, .device = "cpu", .threads = 1});
  ASSERT_TRUE(model.ok());
  Server second(std::move(*model),
                {.host = "127.0.0.1", .port = first.port(), .log_requests = false});
  auto port = second.bind();
  ASSERT_FALSE(port.ok()) << "bound port " << *port << " that another server listens on";
  EXPECT_NE(port.status().message().find("127.0.0.1:" + std::to_string(first.port())),
            std::string::npos)
      << port.status().message();
  EXPECT_NE(port.status().message().find("in use"), std::string::npos) << port.status().message();

  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  const std::string bin = std::string(BS_BINARY_DIR) + "/blockspec";
  const std::string port_arg = std::to_string(first.port());
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[0]);
    execl(bin.c_str(), bin.c_str(), "serve", "--port", port_arg.c_str(), "--threads", "1",
          "--no-drafter", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err_pipe[1]);
  std::string log;
  char buf[1024];
  ssize_t got = 0;
  while ((got = read(err_pipe[0], buf, sizeof buf)) > 0) log.append(buf, static_cast<size_t>(got));
  close(err_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << log;
  EXPECT_NE(log.find(":" + port_arg + ": the port is in use"), std::string::npos) << log;
  EXPECT_EQ(get(first.port(), "/health").status, 200);
}

// Issue 16/18: with more concurrent generations than cpp-httplib's 8 default handler threads,
// /health, /metrics and /v1/models still answer at once (a liveness guarantee, not a timing
// goal: the bound is generous). The small KV cache keeps the generations waiting meanwhile.
TEST(Server, CheapRoutesAnswerWhileManyGenerationsHoldConnections) {
  RunningServer server({.max_num_seqs = 2, .kv_cache_tokens = 1024}, /*drafter=*/false);
  constexpr int kClients = 64;  // 8 threads: /health waited for 56 of 64 (2-3 s on 2 cores)
  std::vector<int> statuses(kClients, 0);
  std::vector<std::thread> clients;
  // The last clients wait for 62 generations before theirs: 54 s in all under ASan on an idle
  // 2-core machine, over 60 with the CI's second test process beside it, so the clients wait
  // up to 300 s (the test is about the cheap routes, not the generation rate).
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      statuses[i] = post(server.port(), "/v1/completions",
                         json{{"prompt", "Once upon a time"},
                              {"max_tokens", 480},
                              {"ignore_eos", true},
                              {"seed", i}}
                             .dump(),
                         {}, /*read_timeout_s=*/300)
                        .status;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (const char* path : {"/health", "/metrics", "/v1/models", "/health"}) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(get(server.port(), path).status, 200) << path;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(s, 1.0) << path << " took " << s << " s under load";
    std::printf("%s under load: %.3f s\n", path, s);
  }
  // The generations were still under way (else this test checks nothing).
  EXPECT_GT(series(server.port(), "num_requests_waiting"), 0);
  for (auto& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(statuses[i], 200) << "client " << i;
}

// Issue 18: requests that crashed the server (null job after n x prompts overflowed; 100,000
// nested levels; 1e400) are 400s naming the field, and a body over --max-request-bytes is a 413.
TEST(Server, HostileRequestsAre400sAndTheServerSurvives) {
  RunningServer server({.max_request_bytes = 1 << 20});
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += '[';
  for (int i = 0; i < 100000; ++i) deep += ']';
  std::string deep_object;
  for (int i = 0; i < 100000; ++i) deep_object += R"({"a":)";
  deep_object += "1";
  for (int i = 0; i < 100000; ++i) deep_object += '}';
  struct Case {
    std::string path, body;
    int status;
    std::string param, message;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": ["a", "b", "c"], "n": 4611686018427387904})", 400, "n",
       "n must be at least 1 and n x prompts at most 128"},
      {"/v1/completions", R"({"prompt": ["a", "b"], "n": 18446744073709551615})", 400, "n",
       "out of range"},
      {"/v1/completions", R"({"prompt": )" + deep + "}", 400, "prompt",
       "deeper than the limit of 64 levels"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "hi", "extra": )" + deep + "}]}", 400,
       "messages", "deeper than the limit of 64 levels"},
      {"/v1/completions", R"({"prompt": "hi", "x": )" + deep_object + "}", 400, "x",
       "deeper than the limit of 64 levels"},
      {"/tokenize", R"({"prompt": )" + deep + "}", 400, "prompt", "deeper than the limit"},
      {"/v1/completions", R"({"prompt": "hi", "temperature": 1e400})", 400, "temperature",
       "out of range"},
      {"/v1/completions", R"({"prompt": "hi", "temperature": 1e300})", 400, "temperature",
       "out of range"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 9223372036854775807})", 400,
       "max_tokens", "out of range"},
      {"/v1/completions", R"({"prompt": "hi", "seed": 18446744073709551615})", 400, "seed",
       "out of range"},
      {"/v1/completions", R"({"prompt": "hi", "top_k": -7})", 400, "top_k", "top_k must be"},
      {"/v1/completions", R"({"prompt": "hi", "best_of": 99999999999999999999})", 400, "best_of",
       "best_of must be an integer"},
      {"/v1/completions", R"({"prompt": ")" + std::string(2 << 20, 'a') + R"("})", 413, "",
       "request body too large: the limit is 1048576 bytes"},
  };
  for (const Case& c : cases) {
    const Reply r = post(server.port(), c.path, c.body);
    const std::string shown = c.body.substr(0, 100);
    EXPECT_EQ(r.status, c.status) << shown << " -> " << r.raw;
    ASSERT_TRUE(r.body.contains("error")) << shown << " -> " << r.raw;
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find(c.message), std::string::npos)
        << shown << " -> " << r.raw;
    if (!c.param.empty()) {
      EXPECT_EQ(r.body["error"]["param"], c.param) << shown << " -> " << r.raw;
    }
  }
  EXPECT_EQ(get(server.port(), "/health").status, 200);
  EXPECT_EQ(post(server.port(), "/v1/completions", R"({"prompt": "hi", "max_tokens": 3})").status,
            200);
}

// Issue 18: a non-streaming request whose client disconnects stops generating (its jobs are
// cancelled and their KV blocks freed) instead of running to max_tokens.
TEST(Server, NonStreamingClientThatDisconnectsCancelsItsJobs) {
  RunningServer server({.max_num_seqs = 2}, /*drafter=*/false);
  const double before = series(server.port(), "generation_tokens_total");
  constexpr int64_t kChoices = 64, kMaxTokens = 500;
  {
    httplib::Client cli("127.0.0.1", server.port());
    cli.set_read_timeout(std::chrono::milliseconds(300));  // gives up and closes the socket
    auto r = cli.Post("/v1/completions",
                      json{{"prompt", "Once upon a time"},
                           {"max_tokens", kMaxTokens},
                           {"n", kChoices},
                           {"ignore_eos", true}}
                          .dump(),
                      "application/json");
    ASSERT_FALSE(r) << "the request ended before the client left; make it longer";
  }
  ASSERT_TRUE(drained(server.port(), std::chrono::seconds(30)));
  const double generated = series(server.port(), "generation_tokens_total") - before;
  EXPECT_LT(generated, kChoices * kMaxTokens / 2)
      << "the jobs of a client that left ran on: " << generated << " tokens generated";
  std::printf("tokens generated for a client that left after 0.3 s: %.0f of %lld\n", generated,
              static_cast<long long>(kChoices * kMaxTokens));
  EXPECT_EQ(post(server.port(), "/v1/completions", R"({"prompt": "hi", "max_tokens": 3})").status,
            200);
}

// This process's resident memory in KiB (VmRSS).
int64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Issue 18's load and fault test (loopback, bounded): 256 concurrent clients mixing streaming and
// non-streaming requests, prompt lengths, output lengths, greedy and seeded sampling, 20 %
// cancelling mid-stream, against a KV cache that holds only a few requests at a time (the rest
// wait). Nothing is lost, every completed output equals its single-request output, the server
// ends idle, and a second wave leaves the resident memory where the first left it.
TEST(Server, LoadAndFaultTwoWavesOf256Clients) {
  Engine engine;
  struct Case {
    std::string prompt;
    int64_t max_tokens;
    int seed;  // -1: greedy
  };
  std::vector<Case> cases;
  const std::vector<std::string> starts = {"Once upon a time", "The little dog", "Tom had a red",
                                           "Lily and Ben"};
  for (int i = 0; i < 16; ++i) {
    std::string prompt = starts[i % 4];
    for (int k = 0; k < i / 4; ++k) prompt += " and then they played in the park with a ball";
    cases.push_back({prompt, std::vector<int64_t>{8, 24, 48, 96}[i % 4], i % 3 == 0 ? i : -1});
  }
  std::vector<std::string> want;
  for (const Case& c : cases) {
    GenerateOptions o;
    o.max_tokens = c.max_tokens;
    if (c.seed >= 0) o.sampling = {.temperature = 0.8f, .seed = static_cast<uint64_t>(c.seed)};
    want.push_back(engine.text(c.prompt, o, /*drafter=*/true));
  }
  RunningServer server({.max_num_seqs = 8, .kv_cache_tokens = 512});
  constexpr int kClients = 256;
  int64_t rss_after_first = 0;
  for (int wave = 0; wave < 2; ++wave) {
    std::vector<int> status(kClients, 0);
    std::vector<std::string> got(kClients);
    std::vector<std::thread> clients;
    for (int i = 0; i < kClients; ++i) {
      clients.emplace_back([&, i] {
        const Case& c = cases[(i * 7 + wave) % cases.size()];
        const bool streaming = i % 2 == 1, cancels = i % 5 == 0;
        json body = {{"prompt", c.prompt},
                     {"max_tokens", c.max_tokens},
                     {"temperature", c.seed >= 0 ? 0.8 : 0.0},
                     {"stream", streaming || cancels}};
        if (c.seed >= 0) body["seed"] = c.seed;
        if (!cancels) {
          // 256 clients share 8 sequences: a request can wait minutes for its reply under the
          // sanitizers on 2 cores (the ASan CI stage), longer than post's default 60 s.
          const Reply r = post(server.port(), "/v1/completions", body.dump(), {}, 600);
          status[i] = r.status;
          if (r.status != 200) return;
          if (!streaming) {
            got[i] = r.body["choices"][0]["text"];
            return;
          }
          for (const auto& e : sse_events(r.raw)) {
            if (e != "[DONE]") got[i] += json::parse(e)["choices"][0]["text"].get<std::string>();
          }
          return;
        }
        test_util::post_and_leave(server.port(), "/v1/completions", body.dump(), 2, 600);
        status[i] = -1;  // left on purpose
      });
    }
    for (auto& t : clients) t.join();
    for (int i = 0; i < kClients; ++i) {
      if (status[i] == -1) continue;
      const size_t c = (i * 7 + wave) % cases.size();
      EXPECT_EQ(status[i], 200) << "wave " << wave << ", client " << i << " lost";
      EXPECT_EQ(got[i], want[c]) << "wave " << wave << ", client " << i << ", case " << c;
    }
    ASSERT_TRUE(drained(server.port(), std::chrono::seconds(30))) << "wave " << wave;
    EXPECT_EQ(get(server.port(), "/health").status, 200);
    const int64_t rss = rss_kib();
    std::printf("wave %d: RSS %lld KiB\n", wave, static_cast<long long>(rss));
    if (wave == 0) rss_after_first = rss;
  }
  // The second wave reuses what the first allocated (threads, KV pool, buffers). Not under
  // AddressSanitizer: its quarantine keeps freed memory resident (LeakSanitizer checks leaks).
  if (!kAddressSanitizer) {
    EXPECT_LT(rss_kib() - rss_after_first, 32 * 1024) << "resident memory grew over a second wave";
  }
}

// Issue 18: a client that trickles its request a byte at a time (each within the read timeout)
// is closed at the request deadline instead of holding its thread forever; others are served.
TEST(Server, SlowClientIsClosedAtTheRequestDeadline) {
  RunningServer server({.request_deadline_s = 1});
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - start < std::chrono::seconds(8)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    closed = send(fd, "a", 1, MSG_NOSIGNAL) != 1;
    char c;
    if (!closed) closed = recv(fd, &c, 1, MSG_DONTWAIT) == 0;
    EXPECT_EQ(get(server.port(), "/health").status, 200);
  }
  close(fd);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(closed) << "a client trickling its headers was still connected after " << s << " s";
  EXPECT_LT(s, 5.0);
}

// Streaming and non-streaming alike: a client that leaves while its request still waits for a
// place is noticed before the request is admitted, so it generates nothing.
TEST(Server, StreamingClientThatLeavesWhileQueuedGeneratesNothing) {
  RunningServer server({.max_num_seqs = 1}, /*drafter=*/false);
  const double before = series(server.port(), "generation_tokens_total");
  constexpr int64_t kChoices = 32, kMaxTokens = 480;
  std::thread busy([&] {
    EXPECT_EQ(post(server.port(), "/v1/completions",
                   json{{"prompt", "Once upon a time"},
                        {"max_tokens", kMaxTokens},
                        {"n", kChoices},
                        {"ignore_eos", true}}
                       .dump())
                  .status,
              200);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    httplib::Client cli("127.0.0.1", server.port());
    cli.set_read_timeout(std::chrono::milliseconds(300));
    auto r = cli.Post("/v1/completions",
                      json{{"prompt", "The little dog"},
                           {"max_tokens", kMaxTokens},
                           {"ignore_eos", true},
                           {"stream", true}}
                          .dump(),
                      "application/json");
    EXPECT_FALSE(r) << "the streamed request was answered; the busy one ended too soon";
  }
  busy.join();
  ASSERT_TRUE(drained(server.port(), std::chrono::seconds(30)));
  EXPECT_EQ(series(server.port(), "generation_tokens_total") - before, kChoices * kMaxTokens)
      << "the request of the client that left generated tokens";
}

TEST(Server, BinaryServesAndStopsOnSigterm) {
  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  const std::string bin = std::string(BS_BINARY_DIR) + "/blockspec";
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[0]);
    execl(bin.c_str(), bin.c_str(), "serve", "--port", "0", "--threads", "1", "--served-model-name",
          "tiny", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err_pipe[1]);
  FILE* err = fdopen(err_pipe[0], "r");
  std::string log;
  char line[1024];
  int port = 0;
  while (port == 0 && std::fgets(line, sizeof line, err)) {
    log += line;
    const char* at = std::strstr(line, "listening on http://127.0.0.1:");
    if (at) port = std::atoi(at + std::strlen("listening on http://127.0.0.1:"));
  }
  ASSERT_GT(port, 0) << log;
  EXPECT_NE(log.find("drafter"), std::string::npos) << log;
  EXPECT_EQ(get(port, "/v1/models").body["data"][0]["id"], "tiny");
  const Reply r = post(port, "/v1/completions",
                       R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 5})");
  EXPECT_EQ(r.status, 200) << r.raw;
  kill(pid, SIGTERM);
  while (std::fgets(line, sizeof line, err)) log += line;
  std::fclose(err);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  EXPECT_NE(log.find("[cmpl-"), std::string::npos) << log;  // the request's log line
  EXPECT_NE(log.find("stopped"), std::string::npos) << log;
}

}  // namespace
}  // namespace bs::server
