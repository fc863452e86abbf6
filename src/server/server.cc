#include "server/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <random>
#include <thread>
#include <utility>

#include "engine/generate.h"
#include "server/engine_worker.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/tool_calls.h"

namespace bs::server {

using json = nlohmann::json;

namespace {

using Jobs = std::vector<std::shared_ptr<Job>>;

constexpr int64_t kDefaultCompletionTokens = 16;  // OpenAI's default for /v1/completions
// How often a handler waiting on its jobs checks that its client is still connected.
constexpr auto kClientCheck = std::chrono::milliseconds(100);

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.http_status, error_body(e));
}

// Routes that need the API key (vLLM's rule: the API, not health or metrics).
bool needs_key(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

// The HTTP status of a failed job: 400 for a request the engine refuses (e.g. too large for the
// KV cache), 503 when the device ran out of memory for it (the server goes on; a retry may
// succeed), 500 for other engine errors.
int job_error_status(const Status& status) {
  if (status.code() == StatusCode::kOutOfMemory) return 503;
  return status.code() == StatusCode::kInvalidArgument ? 400 : 500;
}

// The tool call ids of a chat job: "call_" and the job id's unique part.
std::string call_id_prefix(const std::string& job_id) {
  return "call_" + job_id.substr(job_id.find('-') + 1);
}

// The chat template's text for `messages`, or the API error: the model's answer when it has no
// template, a 400 naming messages when the template refuses them.
std::optional<ApiError> render_chat(const ServedModel& model,
                                    const nlohmann::ordered_json& messages,
                                    const nlohmann::ordered_json& template_kwargs,
                                    bool add_generation_prompt, std::string* text) {
  if (!model.render_chat) {
    return ApiError{.http_status = model.chat_unavailable_status,
                    .message = model.chat_unavailable,
                    .param = "messages"};
  }
  auto rendered = model.render_chat(messages, template_kwargs, add_generation_prompt);
  if (!rendered.ok()) return ApiError{.message = rendered.status().message(), .param = "messages"};
  *text = std::move(*rendered);
  return std::nullopt;
}

}  // namespace

struct Server::Impl {
  Impl(ServedModel m, ServerOptions o)
      : model(std::move(m)),
        options(std::move(o)),
        metrics(model.name, model.max_model_len),
        worker(model, metrics,
               {.max_num_seqs = options.max_num_seqs,
                .kv_blocks = (options.kv_cache_tokens + kKvBlockSize - 1) / kKvBlockSize,
                .max_context = model.max_model_len,
                .max_prefill_tokens = options.max_prefill_tokens,
                .preemption = options.preemption,
                .prefix_caching = options.prefix_caching},
               options.log_requests),
        http({.core_threads = core_handler_threads(options.max_num_seqs),
              .request_deadline_s = options.request_deadline_s,
              .max_request_bytes = options.max_request_bytes}),
        limits{.max_depth = options.max_json_depth, .max_bytes = options.max_request_bytes},
        created(std::time(nullptr)),
        id_prefix(fmt::format("{:08x}", std::random_device{}())) {}

  void add_routes();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  // The finished response (non-streaming) of request `id`: one choice per job, in order, with
  // its text and its tokens' logprobs; chat replies are read for tool calls by `tools`
  // (finish_reason "tool_calls" when any).
  json response_body(const std::string& id, const Jobs& jobs, const std::vector<std::string>& texts,
                     bool chat, ToolCallParser tools) const;
  // One SSE chunk of request `id` for choice `index`: delta text (or nothing), finish_reason (or
  // null) and logprobs (or null).
  json chunk(const std::string& id, int index, bool chat, const json& delta_or_text,
             const json& finish, const json& logprobs = nullptr) const;
  // choices[].logprobs for `logprobs` (the next tokens of the reply): chat
  // {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}, completions
  // {tokens, token_logprobs, top_logprobs: [{text: logprob}] (the top N and the chosen token),
  // text_offset}. Token strings come from TokenTexts; *text_offset (characters of the reply's
  // token strings before these tokens) advances past them.
  json logprobs_json(const std::vector<LogprobsEntry>& logprobs, bool chat,
                     int64_t* text_offset) const;
  // Streams the jobs of request `id` (choice i = jobs[i]) as SSE, each choice's text as it
  // comes; chat content goes through a ToolCallStream by `tools`.
  // `client`: the connection's socket (connection_socket), checked while waiting.
  void stream(httplib::Response& res, const std::string& id, Jobs jobs, bool chat,
              bool include_usage, ToolCallParser tools, int client);
  // Usage of a request's choices: prompt tokens once per prompt (n choices share one).
  json usage(const Jobs& jobs, int n) const;
  // The drafter's figures of these choices together.
  json speculative(const Jobs& jobs) const;

  ServedModel model;
  ServerOptions options;
  Metrics metrics;
  EngineWorker worker;  // declared after what it uses, before http (handlers wait on it)
  HttpServer http;
  RequestLimits limits;
  int64_t created;
  std::string id_prefix;
  std::atomic<uint64_t> next_id{0};
  std::atomic<bool> run_called{false};
};

json Server::Impl::usage(const Jobs& jobs, int n) const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const GenerateStats& st = jobs[i]->stats();
    if (i % n == 0) prompt += st.prompt_tokens, cached += st.cached_tokens;
    completion += st.generated_tokens;
  }
  json u = {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
  // OpenAI's and vLLM's field (vLLM adds it with prefix caching on).
  if (options.prefix_caching) u["prompt_tokens_details"] = {{"cached_tokens", cached}};
  return u;
}

json Server::Impl::speculative(const Jobs& jobs) const {
  GenerateStats st;
  for (const auto& job : jobs) {
    st.steps += job->stats().steps;
    st.drafted += job->stats().drafted;
    st.accepted += job->stats().accepted;
  }
  return {{"drafter", model.drafter->family()},
          {"acceptance_length", st.acceptance_length()},
          {"drafts", st.steps},
          {"draft_tokens", st.drafted},
          {"accepted_tokens", st.accepted}};
}

json Server::Impl::logprobs_json(const std::vector<LogprobsEntry>& logprobs, bool chat,
                                 int64_t* text_offset) const {
  // OpenAI's bytes: the token text's UTF-8 bytes as integers.
  const auto bytes = [](const std::string& s) {
    json b = json::array();
    for (char c : s) b.push_back(static_cast<unsigned char>(c));
    return b;
  };
  if (chat) {
    json content = json::array();
    for (const LogprobsEntry& e : logprobs) {
      const TokenLogprobs& lp = e.logprobs;
      const std::string& text = e.text;
      json top = json::array();
      for (size_t i = 0; i < lp.top.size(); ++i) {
        const std::string& alt = e.top_texts[i];
        top.push_back({{"token", alt}, {"logprob", lp.top[i].logprob}, {"bytes", bytes(alt)}});
      }
      content.push_back({{"token", text},
                         {"logprob", lp.logprob},
                         {"bytes", bytes(text)},
                         {"top_logprobs", top}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const LogprobsEntry& e : logprobs) {
    const TokenLogprobs& lp = e.logprobs;
    const std::string& text = e.text;
    tokens.push_back(text);
    offsets.push_back(*text_offset);
    for (char c : text) *text_offset += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    if (!e.scored) {  // an echoed prompt's first token: nothing before it to predict it
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(lp.logprob);
    json top = json::object();
    for (size_t i = 0; i < lp.top.size(); ++i) {
      const std::string& alt = e.top_texts[i];
      if (!top.contains(alt)) top[alt] = lp.top[i].logprob;  // ids of one text: the likelier
    }
    if (!top.contains(text)) top[text] = lp.logprob;
    top_logprobs.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

json Server::Impl::response_body(const std::string& id, const Jobs& jobs,
                                 const std::vector<std::string>& texts, bool chat,
                                 ToolCallParser tools) const {
  json choices = json::array();
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& job = *jobs[i];
    const std::string& text = texts[i];
    std::vector<LogprobsEntry> logprobs;
    job.take_logprobs(&logprobs);
    int64_t offset = 0;
    json choice = {{"index", i},
                   {"logprobs", job.options.logprobs >= 0 ? logprobs_json(logprobs, chat, &offset)
                                                          : json(nullptr)},
                   {"finish_reason", job.finish_reason()}};
    if (chat) {
      const ParsedReply reply = parse_tool_calls(tools, text);
      choice["message"] = chat_message(reply, call_id_prefix(job.id));
      if (!reply.calls.empty()) choice["finish_reason"] = "tool_calls";
    } else {
      choice["text"] = text;
    }
    choices.push_back(std::move(choice));
  }
  const int n = jobs.front()->choices_per_prompt;
  json body = {{"id", id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created},
               {"model", model.name},
               {"choices", std::move(choices)},
               {"usage", usage(jobs, n)}};
  if (model.drafter) body["blockspec"] = speculative(jobs);
  return body;
}

json Server::Impl::chunk(const std::string& id, int index, bool chat, const json& delta_or_text,
                         const json& finish, const json& logprobs) const {
  json choice = {{"index", index}, {"logprobs", logprobs}, {"finish_reason", finish}};
  choice[chat ? "delta" : "text"] = delta_or_text;
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model.name},
          {"choices", json::array({choice})}};
}

void Server::Impl::stream(httplib::Response& res, const std::string& id, Jobs jobs, bool chat,
                          bool include_usage, ToolCallParser tools, int client) {
  res.set_header("Cache-Control", "no-cache");
  // Per choice: text taken from its job but not sent yet, the completions text offset of its
  // next token, its tool-call reader, and whether its last chunk went out.
  struct Choice {
    std::string pending;
    int64_t text_offset = 0;
    std::unique_ptr<ToolCallStream> tools;
    bool done = false;
  };
  auto state = std::make_shared<std::vector<Choice>>(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    (*state)[i].tools = std::make_unique<ToolCallStream>(tools, call_id_prefix(jobs[i]->id));
  }
  auto started = std::make_shared<bool>(false);
  const auto cancel_all = [jobs] {
    for (const auto& job : jobs) job->cancel();
  };
  const auto provider = [this, id, jobs, chat, include_usage, state, started, cancel_all, client](
                            size_t, httplib::DataSink& sink) {
    if (peer_closed(client)) {  // the client left, perhaps while its jobs wait for the KV cache
      cancel_all();
      return false;
    }
    const auto send = [&](json event) {
      if (include_usage && !event.contains("usage") && !event.contains("error")) {
        event["usage"] = nullptr;
      }
      const std::string s = "data: " + dump(event) + "\n\n";
      return sink.write(s.data(), s.size());
    };
    const auto finish_stream = [&] {
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    };
    if (!*started) {
      *started = true;
      for (int i = 0; chat && i < static_cast<int>(jobs.size()); ++i) {
        if (!send(chunk(id, i, chat, {{"role", "assistant"}, {"content", ""}}, nullptr))) {
          cancel_all();
          return false;
        }
      }
    }
    // Waits a little on the first unfinished choice when none had news at the last look.
    bool news = false;
    for (size_t i = 0; i < jobs.size(); ++i) {
      Choice& c = (*state)[i];
      if (c.done) continue;
      Job& job = *jobs[i];
      const bool ended = job.wait_text(&c.pending, std::chrono::milliseconds(0));
      const std::string text = c.tools->push(std::exchange(c.pending, {}));
      std::vector<LogprobsEntry> logprobs;
      job.take_logprobs(&logprobs);
      const json logprobs_field =
          logprobs.empty() ? json(nullptr) : logprobs_json(logprobs, chat, &c.text_offset);
      const json delta = chat ? json{{"content", text}} : json(text);
      const int index = static_cast<int>(i);
      if (!text.empty() || !logprobs.empty()) {
        news = true;
        if (!send(chunk(id, index, chat, delta, nullptr, logprobs_field))) {
          cancel_all();  // the client went away
          return false;
        }
      }
      if (!ended) continue;
      news = true;
      c.done = true;
      if (!job.status().ok()) {
        cancel_all();
        send(error_body(
            {.http_status = job_error_status(job.status()), .message = job.status().message()}));
        return finish_stream();
      }
      for (json& d : c.tools->finish()) {
        if (!send(chunk(id, index, chat, d, nullptr))) {
          cancel_all();
          return false;
        }
      }
      json last = chunk(id, index, chat, chat ? json::object() : json(""),
                        c.tools->has_tool_calls() ? "tool_calls" : job.finish_reason());
      if (model.drafter) last["blockspec"] = speculative({jobs[i]});
      send(std::move(last));
    }
    const auto open =
        std::find_if(state->begin(), state->end(), [](const Choice& c) { return !c.done; });
    if (open != state->end()) {
      if (!news)
        jobs[open - state->begin()]->wait_text(&open->pending, std::chrono::milliseconds(100));
      return true;
    }
    if (include_usage) {
      json u = chunk(id, 0, chat, nullptr, nullptr);
      u["choices"] = json::array();
      u["usage"] = usage(jobs, jobs.front()->choices_per_prompt);
      send(std::move(u));
    }
    return finish_stream();
  };
  res.set_chunked_content_provider("text/event-stream", provider, [cancel_all](bool success) {
    if (!success) cancel_all();
  });
}

void Server::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  CompletionRequest r;
  if (auto e = parse_completion_request(req.body, chat, &r, limits)) return send_error(res, *e);
  if (!r.model.empty() && r.model != model.name) {
    return send_error(res, {.http_status = 404,
                            .message = fmt::format("model '{}' does not exist; this server "
                                                   "serves '{}'",
                                                   r.model, model.name),
                            .param = "model",
                            .code = "model_not_found"});
  }
  // The prompts as token ids (chat: the rendered messages), and what echo repeats of each.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo_texts;
  if (chat) {
    std::string text;
    if (auto e =
            render_chat(model, r.messages, r.template_kwargs, r.add_generation_prompt, &text)) {
      return send_error(res, *e);
    }
    prompts.push_back(model.tokenizer->encode(text, /*add_special_tokens=*/false));
    echo_texts.emplace_back();
  }
  for (PromptInput& p : r.prompts) {
    prompts.push_back(p.is_ids ? std::move(p.ids)
                               : model.tokenizer->encode(p.text, /*add_special_tokens=*/true));
    if (r.echo) echo_texts.push_back(p.is_ids ? model.tokenizer->decode(prompts.back()) : p.text);
  }
  if (r.truncate_prompt_tokens) {  // vLLM's: keep the last N tokens (-1: what the window takes)
    const int64_t keep =
        *r.truncate_prompt_tokens == -1 ? model.max_model_len - 1 : *r.truncate_prompt_tokens;
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (std::ssize(prompts[i]) <= keep) continue;
      prompts[i].erase(prompts[i].begin(), prompts[i].end() - keep);
      if (r.echo) echo_texts[i] = model.tokenizer->decode(prompts[i]);
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (Status s = validate_prompt(*model.target, prompts[i], model.max_model_len); !s.ok()) {
      const std::string which = prompts.size() > 1 ? fmt::format("prompt {}: ", i) : "";
      return send_error(res,
                        {.message = which + s.message(), .param = chat ? "messages" : "prompt"});
    }
  }
  std::vector<int32_t> stop_ids;
  if (!r.ignore_eos) stop_ids = model.tokenizer->eos_ids();
  for (const int32_t token : r.stop_token_ids) {
    if (token >= model.target->config().vocab_size) {
      return send_error(res, {.message = fmt::format("stop_token_ids: token id {} out of range "
                                                     "(vocabulary of {})",
                                                     token, model.target->config().vocab_size),
                              .param = "stop_token_ids"});
    }
    stop_ids.push_back(token);
  }
  for (const auto& [token, bias] : r.sampling.logit_bias) {
    if (token >= model.target->config().vocab_size) {
      return send_error(res, {.message = fmt::format("logit_bias: token id {} out of range "
                                                     "(vocabulary of {})",
                                                     token, model.target->config().vocab_size),
                              .param = "logit_bias"});
    }
  }
  const std::string id =
      fmt::format("{}-{}{:06x}", chat ? "chatcmpl" : "cmpl", id_prefix, next_id++);
  Jobs jobs;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int64_t room = model.max_model_len - static_cast<int64_t>(prompts[p].size());
    const auto group = std::make_shared<ChoiceGroup>(r.n);
    for (int j = 0; j < r.n; ++j) {
      auto job = std::make_shared<Job>();
      // One engine request per choice; a choice's log lines name it after the request.
      job->id = prompts.size() * r.n > 1 ? fmt::format("{}-{}", id, jobs.size()) : id;
      job->choices_per_prompt = r.n;
      job->group = group;
      job->prompt = prompts[p];
      job->options.max_tokens = r.max_tokens.value_or(chat ? room : kDefaultCompletionTokens);
      job->options.sampling = r.sampling;
      // The n choices of a seeded request draw from seeds seed, seed + 1, ...
      if (r.sampling.seed) job->options.sampling.seed = *r.sampling.seed + j;
      job->options.stop_ids = stop_ids;
      job->options.max_context = model.max_model_len;
      job->options.draft_tokens = model.draft_tokens;
      job->options.draft_confidence_min = model.draft_confidence_min;
      job->options.verify_budget = model.verify_budget;
      job->options.logprobs = r.logprobs;
      job->stop = r.stop;
      job->include_stop = r.include_stop_str_in_output;
      job->skip_special_tokens = r.skip_special_tokens;
      job->echo = r.echo;
      if (r.echo) job->echo_text = echo_texts[p];
      jobs.push_back(std::move(job));
    }
  }
  if (jobs.empty()) {  // parse_completion_request guarantees n >= 1 and a prompt; never answer none
    return send_error(res, {.http_status = 500, .message = "internal error: no choices"});
  }
  for (const auto& job : jobs) worker.submit(job);
  const ToolCallParser tools = r.parse_tool_calls ? model.tool_call_parser : ToolCallParser::kNone;
  const int client = connection_socket(req);
  if (r.stream) return stream(res, id, std::move(jobs), chat, r.include_usage, tools, client);
  std::vector<std::string> texts(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    // A client that disconnects cancels its jobs: their KV blocks free at the next step.
    while (!jobs[i]->wait_until_ended(&texts[i], kClientCheck)) {
      if (peer_closed(client)) {
        for (const auto& job : jobs) job->cancel();
        res.status = 499;  // nginx's "client closed request": nobody reads it
        return;
      }
    }
    if (!jobs[i]->status().ok()) {
      for (const auto& other : jobs) other->cancel();
      return send_error(res, {.http_status = job_error_status(jobs[i]->status()),
                              .message = jobs[i]->status().message()});
    }
  }
  send_json(res, 200, response_body(id, jobs, texts, chat, tools));
}

void Server::Impl::add_routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    http.request_began(req);
    if (options.api_key.empty() || !needs_key(req.path) ||
        req.get_header_value("Authorization") == "Bearer " + options.api_key) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    send_error(res, {.http_status = 401,
                     .message = "invalid or missing API key: send the header "
                                "'Authorization: Bearer <key>'",
                     .code = "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  // Called for every status >= 400: fills in the bodies httplib leaves empty (no route, ...).
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.is_chunked_content_provider_) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        const int status = res.status;
        std::string message = fmt::format("HTTP {} for {} {}", status, req.method, req.path);
        if (status == 404) message = fmt::format("no route {} {}", req.method, req.path);
        if (status == 413) {
          // cpp-httplib also answers 413 to form-encoded bodies over 8 KiB.
          message = fmt::format(
              "request body too large: the limit is {} bytes (serve "
              "--max-request-bytes), 8192 for application/x-www-form-urlencoded "
              "(send JSON as application/json)",
              options.max_request_bytes);
        }
        send_error(res, {.http_status = status, .message = message});
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, {.http_status = 500, .message = "internal error: " + what});
      });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"status", "ok"}});
  });
  const json card = {{"id", model.name},        {"object", "model"},
                     {"created", created},      {"owned_by", "blockspec"},
                     {"root", model.model_dir}, {"max_model_len", model.max_model_len}};
  http.Get("/v1/models", [card](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({card})}});
  });
  // The id may hold slashes (org/name), as served names often do.
  http.Get(R"(/v1/models/(.+))", [this, card](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] == model.name) return send_json(res, 200, card);
    send_error(res,
               {.http_status = 404,
                .message = fmt::format("The model '{}' does not exist; this server serves '{}'",
                                       req.matches[1].str(), model.name),
                .param = "model",
                .code = "model_not_found"});
  });
  http.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"version", BLOCKSPEC_VERSION}});
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, /*chat=*/false);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, /*chat=*/true);
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    TokenizeRequest r;
    if (auto e = parse_tokenize_request(req.body, &r, limits)) return send_error(res, *e);
    if (r.chat) {
      if (auto e = render_chat(model, r.messages, r.template_kwargs, r.add_generation_prompt,
                               &r.prompt)) {
        return send_error(res, *e);
      }
    }
    const auto ids = model.tokenizer->encode(r.prompt, r.add_special_tokens);
    send_json(res, 200,
              {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.max_model_len}});
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    std::vector<int32_t> ids;
    if (auto e = parse_detokenize_request(req.body, &ids, limits)) return send_error(res, *e);
    send_json(res, 200, {{"prompt", model.tokenizer->decode(ids)}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

Server::Server(ServedModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), std::move(options))) {
  impl_->add_routes();
}

Server::~Server() { stop(); }

Result<int> Server::bind() {
  return impl_->http.bind_exclusive(impl_->options.host, impl_->options.port);
}

Status Server::run() {
  impl_->run_called = true;
  const bool ok = impl_->http.listen_after_bind();
  impl_->run_called = false;
  if (!ok) return FailedPrecondition("the HTTP server stopped with an error");
  return Status::Ok();
}

void Server::stop() {
  // httplib ignores stop() until listening has started: wait for it when run() is on its way.
  while (impl_->run_called && !impl_->http.is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->http.stop();
}

const ServedModel& Server::model() const { return impl_->model; }

}  // namespace bs::server
