#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace bs {

namespace {

// Oniguruma's \s: the White_Space property, as a character-class body.
constexpr std::string_view kWhiteSpaceClass =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr std::string_view kHexDigitClass = "0-9A-Fa-f";

bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Copies one escape sequence starting at p[i] == '\\' (including a braced \p{..} / \x{..}
// argument and a whole multibyte escaped character) and returns the index after it.
size_t copy_escape(std::string_view p, size_t i, std::string& out) {
  size_t end = i + 1;
  if (end < p.size()) {
    const char d = p[end];
    if ((d == 'p' || d == 'P' || d == 'x') && end + 1 < p.size() && p[end + 1] == '{') {
      const size_t close = p.find('}', end + 2);
      end = close == std::string_view::npos ? p.size() : close + 1;
    } else {
      end += unicode::utf8_len(static_cast<unsigned char>(d));
    }
  }
  end = std::min(end, p.size());
  out.append(p.substr(i, end - i));
  return end;
}

// Copies a character class starting at p[i] == '[' and returns the index after its ']'.
size_t copy_class(std::string_view p, size_t i, bool caseless, std::string& out) {
  std::string body = "[";
  size_t j = i + 1;
  if (j < p.size() && p[j] == '^') body.push_back(p[j++]);
  if (j < p.size() && p[j] == ']') body.push_back(p[j++]);  // literal ']' first
  int depth = 1;
  while (j < p.size() && depth > 0) {
    const char c = p[j];
    if (c == '\\' && j + 1 < p.size()) {
      const char d = p[j + 1];
      if (d == 's') {
        body.append(kWhiteSpaceClass);
        j += 2;
      } else if (d == 'h') {
        body.append(kHexDigitClass);
        j += 2;
      } else {
        std::string esc;
        j = copy_escape(p, j, esc);
        body.append(esc);
      }
      continue;
    }
    if (c == '[' && j + 1 < p.size() && p[j + 1] == ':') {  // POSIX [:alpha:]
      const size_t close = p.find(":]", j + 2);
      if (close != std::string_view::npos) {
        body.append(p.substr(j, close + 2 - j));
        j = close + 2;
        continue;
      }
    }
    if (c == '[') ++depth;
    if (c == ']') --depth;
    body.push_back(c);
    ++j;
  }
  if (caseless) {
    out.append("(?i:").append(body).append(")");
  } else {
    out.append(body);
  }
  return j;
}

}  // namespace

std::string rewrite_oniguruma_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  std::vector<bool> saved_caseless;  // caseless state to restore when each open group closes
  bool caseless = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      if (d == 's' || d == 'S') {
        out.append(d == 's' ? "[" : "[^").append(kWhiteSpaceClass).append("]");
        i += 2;
      } else if (d == 'h' || d == 'H') {
        out.append(d == 'h' ? "[" : "[^").append(kHexDigitClass).append("]");
        i += 2;
      } else {
        i = copy_escape(p, i, out);
      }
    } else if (c == '[') {
      i = copy_class(p, i, caseless, out);
    } else if (c == '(') {
      if (p.substr(i, 4) == "(?i:") {
        saved_caseless.push_back(caseless);
        caseless = true;
        out.append("(?:");
        i += 4;
      } else if (p.substr(i, 4) == "(?i)") {
        caseless = true;  // for the rest of the enclosing group
        i += 4;
      } else {
        saved_caseless.push_back(caseless);
        // Copy a group prefix such as (?: (?= (?<= (?<name> verbatim: it holds no literals.
        size_t j = i + 1;
        if (j < p.size() && p[j] == '?') {
          ++j;
          if (j < p.size() && (p[j] == 'P')) ++j;
          if (j < p.size() && p[j] == '<' && j + 1 < p.size() && p[j + 1] != '=' &&
              p[j + 1] != '!') {
            const size_t close = p.find('>', j);
            j = close == std::string_view::npos ? p.size() : close + 1;
          } else {
            while (j < p.size() &&
                   (p[j] == '<' || p[j] == '=' || p[j] == '!' || p[j] == ':' || p[j] == '>')) {
              ++j;
            }
          }
        }
        out.append(p.substr(i, j - i));
        i = j;
      }
    } else if (c == ')') {
      if (!saved_caseless.empty()) {
        caseless = saved_caseless.back();
        saved_caseless.pop_back();
      }
      out.push_back(c);
      ++i;
    } else if (caseless && is_ascii_letter(c)) {
      const char lower = static_cast<char>(c | 0x20);
      const char upper = static_cast<char>(lower & ~0x20);
      out.push_back('[');
      out.push_back(lower);
      out.push_back(upper);
      out.push_back(']');
      ++i;
    } else if (c == '{' && caseless) {  // quantifier {m,n}: copy, it holds no letters
      const size_t close = p.find('}', i);
      const size_t end = close == std::string_view::npos ? p.size() : close + 1;
      out.append(p.substr(i, end - i));
      i = end;
    } else {
      const size_t len = std::min(unicode::utf8_len(static_cast<unsigned char>(c)), p.size() - i);
      out.append(p.substr(i, len));
      i += len;
    }
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::unique_ptr<Code> code, std::string pattern)
    : code_(std::move(code)), pattern_(std::move(pattern)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

namespace {

Result<pcre2_code*> compile_pcre2(std::string_view source, std::string_view shown,
                                  uint32_t extra_options) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                   PCRE2_UTF | PCRE2_UCP | extra_options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return InvalidArgument("cannot compile regex '{}': {} (at offset {} of '{}')", shown,
                           reinterpret_cast<const char*>(message), offset, source);
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort; the interpreter is the fallback
  return code;
}

}  // namespace

Result<Regex> Regex::compile(std::string_view pattern) {
  const std::string rewritten = rewrite_oniguruma_pattern(pattern);
  // Oniguruma (Ruby syntax) treats ^ and $ as line anchors.
  BS_ASSIGN_OR_RETURN(pcre2_code * code, compile_pcre2(rewritten, pattern, PCRE2_MULTILINE));
  auto holder = std::make_unique<Code>();
  holder->code = code;
  return Regex(std::move(holder), std::string(pattern));
}

Result<Regex> Regex::literal(std::string_view text) {
  BS_ASSIGN_OR_RETURN(pcre2_code * code, compile_pcre2(text, text, PCRE2_LITERAL));
  auto holder = std::make_unique<Code>();
  holder->code = code;
  return Regex(std::move(holder), std::string(text));
}

std::vector<Regex::Span> Regex::find_all(std::string_view text) const {
  std::vector<Span> spans;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (md == nullptr) return spans;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  uint32_t options = PCRE2_NO_UTF_CHECK;
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), start, options, md, mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Long runs (e.g. whitespace before a lookahead) can exceed the default 32 KiB JIT stack:
      // retry with a larger one, then with the interpreter.
      if (jit_stack == nullptr) {
        jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
        if (mctx == nullptr) mctx = pcre2_match_context_create(nullptr);
        if (jit_stack != nullptr && mctx != nullptr) {
          pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
          continue;
        }
      }
      if ((options & PCRE2_NO_JIT) == 0) {
        options |= PCRE2_NO_JIT;
        continue;
      }
    }
    if (rc < 0) break;  // no match (or a resource limit): the rest of the text is unmatched
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      spans.emplace_back(b, e);
      start = e;
    } else {
      if (b >= text.size()) break;
      start = b + unicode::utf8_len(static_cast<unsigned char>(text[b]));
    }
  }
  pcre2_match_context_free(mctx);
  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  pcre2_match_data_free(md);
  return spans;
}

}  // namespace bs
