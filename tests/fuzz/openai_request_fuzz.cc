// Fuzzes the OpenAI request parsers of the server (src/server/openai.h, over the depth- and
// range-limited parse_request_json of request_json.h): /v1/completions and
// /v1/chat/completions bodies, /tokenize and /detokenize. Every body is a request or an ApiError
// (a 400), never an exception or a crash; an accepted request is within the documented limits.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    bs::server::CompletionRequest req;
    if (!bs::server::parse_completion_request(body, chat, &req)) {
      const int64_t choices = chat ? req.n : static_cast<int64_t>(req.prompts.size()) * req.n;
      if (req.n < 1 || choices > bs::server::kMaxChoices) std::abort();
      if (req.max_tokens && *req.max_tokens < 0) std::abort();
    }
  }
  bs::server::TokenizeRequest tokenize;
  (void)bs::server::parse_tokenize_request(body, &tokenize);
  std::vector<int32_t> tokens;
  (void)bs::server::parse_detokenize_request(body, &tokens);
  return 0;
}
