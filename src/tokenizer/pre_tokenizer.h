// tokenizer.json "pre_tokenizer": Split (string/regex, every split behaviour, invert),
// ByteLevel (optional GPT-2 regex, add_prefix_space), Metaspace, Digits, Whitespace,
// WhitespaceSplit, and Sequence of these.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_util.h"
#include "tokenizer/pattern.h"

namespace bs {

class PreTokenizer {
 public:
  // `config` is the "pre_tokenizer" value (null → the whole section is one pre-token).
  static Result<PreTokenizer> from_json(const json_util::Json& config,
                                        const json_util::JsonPath& at);

  // Storage for pre-tokens that are not slices of the input (one per encode call).
  struct Scratch {
    std::deque<std::string> owned;
    std::vector<std::string_view> pieces, next;
  };

  // Splits one normalized section (valid UTF-8) into pre-tokens, appended to `out` as views into
  // `section` or into `scratch` (valid until the next call with the same scratch).
  // `first_section`: the section starts at the beginning of the input (Metaspace "first").
  void apply(std::string_view section, bool first_section, Scratch& scratch,
             std::vector<std::string_view>& out) const;

  // True when the pipeline ends with ByteLevel: apply() then leaves the byte → unicode mapping
  // to the model and returns raw bytes.
  bool raw_byte_level() const { return raw_byte_level_; }

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  enum class Prepend { kAlways, kFirst, kNever };
  struct Step {
    Kind kind;
    Pattern pattern;  // Split (also used for ByteLevel's regex, Digits, Whitespace)
    bool has_pattern = false;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
    std::string replacement;        // Metaspace
    Prepend prepend = Prepend::kAlways;
    bool split = true;  // Metaspace
  };

  static Status parse_into(const json_util::Json& config, const json_util::JsonPath& at,
                           std::vector<Step>& steps);
  static void split(const Step& step, std::string_view piece, std::vector<std::string_view>& out);
  void apply_step(const Step& step, bool last, std::string_view piece, bool first_section,
                  Scratch& scratch, std::vector<std::string_view>& out) const;

  std::vector<Step> steps_;
  bool raw_byte_level_ = false;
};

}  // namespace bs
