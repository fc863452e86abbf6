// tokenizer.json "normalizer": NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents, Prepend,
// Replace (string or regex) and Sequence.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_util.h"
#include "tokenizer/pattern.h"

namespace bs {

class Normalizer {
 public:
  // `config` is the "normalizer" value (null → identity).
  static Result<Normalizer> from_json(const json_util::Json& config, const json_util::JsonPath& at);

  // Normalizes valid UTF-8 text; an empty input stays empty.
  std::string apply(std::string_view text) const;
  bool is_identity() const { return steps_.empty(); }

 private:
  enum class Kind {
    kNfc,
    kNfd,
    kNfkc,
    kNfkd,
    kLowercase,
    kStrip,
    kStripAccents,
    kPrepend,
    kReplace
  };
  struct Step {
    Kind kind;
    std::string text;                  // Prepend: prefix; Replace: content
    Pattern pattern;                   // Replace
    bool left = false, right = false;  // Strip
  };
  static Status parse_into(const json_util::Json& config, const json_util::JsonPath& at,
                           std::vector<Step>& steps);
  std::vector<Step> steps_;
};

}  // namespace bs
