// tokenizer.json "decoder" and the incremental detokenizer shared by full and streaming decode.
//
// Every supported decoder chain factors into (1) a per-token map, precomputed per id: Replace,
// ByteFallback (<0xNN> → one raw byte), ByteLevel (unicode → bytes; added tokens verbatim),
// Metaspace; (2) UTF-8 assembly of consecutive raw-byte pieces, invalid bytes → U+FFFD per
// maximal subpart; (3) whole-text Strip (leading / trailing content characters), and optionally
// (4) transformers' clean_up_tokenization_spaces. DecodeState runs (2)-(4) incrementally, so the
// concatenated output of pushes + finish() is the full decode by construction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_util.h"
#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"

namespace bs {

// One token's contribution before assembly.
struct DecodePiece {
  std::string data;
  bool bytes = false;  // raw bytes to assemble into UTF-8 (else valid UTF-8 text)
};

class DecoderSpec {
 public:
  // `config` is the "decoder" value (null → tokens joined with spaces).
  static Result<DecoderSpec> from_json(const json_util::Json& config,
                                       const json_util::JsonPath& at);

  DecodePiece make_piece(std::string_view token, bool added_token) const;

  bool join_with_space() const { return join_with_space_; }
  const std::string& strip_content() const { return strip_content_; }
  int strip_start() const { return strip_start_; }
  int strip_stop() const { return strip_stop_; }

 private:
  enum class Kind { kReplace, kByteFallback, kByteLevel };
  struct Step {
    Kind kind;
    Pattern pattern;
    std::string content;
  };
  static Status parse_into(const json_util::Json& config, const json_util::JsonPath& at,
                           DecoderSpec& spec);

  std::vector<Step> steps_;
  bool join_with_space_ = false;
  std::string strip_content_ = " ";
  int strip_start_ = 0;
  int strip_stop_ = 0;
};

// Incremental decode: feed pieces, receive the text that no later piece can change.
class DecodeState {
 public:
  DecodeState(const DecoderSpec& spec, bool clean_up_spaces);

  void push(const DecodePiece& piece, std::string& out);
  // End of the token stream: releases held-back text (incomplete UTF-8 becomes U+FFFD).
  void finish(std::string& out);

 private:
  void emit(std::string_view text, std::string& out);  // after UTF-8 assembly
  void emit_stripped(std::string_view text, std::string& out);
  void emit_cleaned(std::string_view text, std::string& out);

  const DecoderSpec* spec_;
  bool clean_up_spaces_;
  bool first_piece_ = true;
  unicode::Utf8Assembler utf8_;
  std::string scratch_;
  int strip_left_remaining_;
  std::string held_tail_;        // trailing strip characters held back (Strip stop > 0)
  std::string cleanup_pending_;  // text not yet safe to clean up
};

// transformers' clean_up_tokenization: " ." → "." and friends, applied in order.
std::string clean_up_tokenization(std::string_view text);

}  // namespace bs
