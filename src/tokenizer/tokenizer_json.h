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

// The largest token id a tokenizer may use (vocab and added tokens). Ids index dense tables, so
// an id of 2^31 in a hostile tokenizer.json would allocate gigabytes; real vocabularies stay far
// below (Qwen3 151,669, Gemma 3 262,145), so 2^22 leaves room and bounds the tables at ~100 MiB.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

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
