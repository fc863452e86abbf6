// tokenizer.json pattern objects: {"String": "..."} (literal) or {"Regex": "..."}.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"

namespace bs {

class Pattern {
 public:
  // `config` is the object holding a "pattern" member; `at` is its path.
  static Result<Pattern> from_json(const json_util::Json& config, const json_util::JsonPath& at);
  // A regex given in code (Oniguruma syntax).
  static Result<Pattern> from_regex(std::string_view source);

  std::vector<Regex::Span> find_all(std::string_view text) const;
  // Replaces every match with `replacement` (taken literally).
  std::string replace_all(std::string_view text, std::string_view replacement) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // set for Regex patterns
};

}  // namespace bs
