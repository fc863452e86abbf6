// UTF-8 and Unicode helpers for the tokenizer: code point iteration, lossy UTF-8 repair, a
// streaming lossy UTF-8 decoder, the GPT-2 byte<->unicode table, normalization forms (utf8proc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace bs::unicode {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Appends the UTF-8 encoding of cp (cp must be a Unicode scalar value).
void append_utf8(std::string& out, char32_t cp);

// Decodes one code point of valid UTF-8 at s[pos] and advances pos. Caller guarantees validity.
char32_t next_code_point(std::string_view s, size_t& pos);

// Length in bytes of the UTF-8 sequence introduced by lead byte b (1 for invalid lead bytes).
inline size_t utf8_len(unsigned char b) {
  return b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
}

bool is_valid_utf8(std::string_view s);

// Replaces every maximal invalid subpart with U+FFFD (WHATWG / Unicode "best practice",
// the behaviour of JavaScript's TextDecoder and Rust's String::from_utf8_lossy).
std::string to_valid_utf8(std::string_view s);

// Streaming version of to_valid_utf8: bytes go in, complete characters come out; an incomplete
// but still valid prefix of a character is held back until the next bytes or finish().
class Utf8Assembler {
 public:
  // Appends the decodable text of `bytes` to out.
  void push(std::string_view bytes, std::string& out);
  // Ends the byte run: a held-back incomplete sequence becomes one U+FFFD.
  void finish(std::string& out);
  bool has_pending() const { return need_ != 0; }

 private:
  void push_byte(unsigned char b, std::string& out);
  char pending_[4] = {};
  int have_ = 0;                         // bytes held in pending_
  int need_ = 0;                         // total length of the sequence being assembled (0 = none)
  unsigned char lo_ = 0x80, hi_ = 0xBF;  // allowed range of the next continuation byte
};

// GPT-2 ByteLevel mapping: every byte has a printable code point.
char32_t byte_to_code_point(unsigned char b);
// Inverse mapping; returns -1 for code points that are not in the table.
int code_point_to_byte(char32_t cp);

// White_Space property (Oniguruma's \s, Rust's char::is_whitespace).
bool is_whitespace(char32_t cp);
// Letter or number or underscore (word character for single_word added tokens).
bool is_word_char(char32_t cp);
// General category Mn (nonspacing mark).
bool is_nonspacing_mark(char32_t cp);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Unicode normalization of valid UTF-8 text.
std::string normalize(std::string_view s, NormalForm form);
// Simple (per code point) lowercase mapping of valid UTF-8 text.
std::string to_lower(std::string_view s);

}  // namespace bs::unicode
