// PCRE2 regex for tokenizer.json patterns (written for Oniguruma, the Rust tokenizers engine).
// The pattern is rewritten where the engines differ: \s / \S use the White_Space property,
// \h / \H are hex digits, and (?i:...) folds ASCII letters only.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace bs {

class Regex {
 public:
  // [begin, end) byte offsets of one match.
  using Span = std::pair<size_t, size_t>;

  static Result<Regex> compile(std::string_view pattern);
  // Compiles a literal string (no metacharacters).
  static Result<Regex> literal(std::string_view text);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // All non-overlapping matches, left to right, in valid UTF-8 text. An empty match advances
  // the search by one character.
  std::vector<Span> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  Regex(std::unique_ptr<Code> code, std::string pattern);

  std::unique_ptr<Code> code_;
  std::string pattern_;  // as given
};

// The rewrite applied by Regex::compile, exposed for tests.
std::string rewrite_oniguruma_pattern(std::string_view pattern);

}  // namespace bs
