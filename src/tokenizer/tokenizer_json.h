// Parses tokenizer.json in one streaming pass: model.vocab (an object) and model.merges go
// straight into flat vectors, everything else into a DOM. A DOM of the 151k-entry Qwen3 vocab and
// merges would cost most of the load time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_util.h"

namespace bs {

struct TokenizerJson {
  // The document; model.vocab / model.merges, when captured, are left as empty containers.
  json_util::Json doc;
  std::vector<std::pair<std::string, int64_t>> vocab;       // model.vocab as an object
  std::vector<std::pair<std::string, std::string>> merges;  // "a b" strings or ["a", "b"] pairs
  bool vocab_captured = false;
  // Set when model.vocab is an object with non-integer values (fine for a model that is not BPE;
  // the BPE builder reports it).
  std::string vocab_error;
  bool merges_captured = false;
};

// `file` names the source in error messages.
Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& file);

}  // namespace bs
