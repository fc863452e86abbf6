#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace bs::unicode {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t next_code_point(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  const size_t n = utf8_len(b0);
  if (n == 1 || pos + n > s.size()) {
    ++pos;
    return b0 < 0x80 ? b0 : kReplacementChar;
  }
  char32_t cp = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  pos += n;
  return cp;
}

namespace {

// For a lead byte: the sequence length and the allowed range of the first continuation byte.
// Returns false for bytes that cannot start a sequence.
bool lead_info(unsigned char b, int& need, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return false;
  }
  return true;
}

void append_replacement(std::string& out) { out.append("\xEF\xBF\xBD"); }

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    int need;
    unsigned char lo, hi;
    if (!lead_info(b, need, lo, hi) || i + need > n) return false;
    for (int k = 1; k < need; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < lo || c > hi) return false;
      lo = 0x80;
      hi = 0xBF;
    }
    i += need;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  Utf8Assembler assembler;
  assembler.push(s, out);
  assembler.finish(out);
  return out;
}

void Utf8Assembler::push(std::string_view bytes, std::string& out) {
  for (char c : bytes) push_byte(static_cast<unsigned char>(c), out);
}

void Utf8Assembler::push_byte(unsigned char b, std::string& out) {
  if (need_ == 0) {
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      return;
    }
    if (!lead_info(b, need_, lo_, hi_)) {
      need_ = 0;
      append_replacement(out);
      return;
    }
    pending_[0] = static_cast<char>(b);
    have_ = 1;
    return;
  }
  if (b >= lo_ && b <= hi_) {
    pending_[have_++] = static_cast<char>(b);
    lo_ = 0x80;
    hi_ = 0xBF;
    if (have_ == need_) {
      out.append(pending_, have_);
      need_ = have_ = 0;
    }
    return;
  }
  // The held bytes are a maximal invalid subpart; b starts over.
  append_replacement(out);
  need_ = have_ = 0;
  push_byte(b, out);
}

void Utf8Assembler::finish(std::string& out) {
  if (need_ != 0) append_replacement(out);
  need_ = have_ = 0;
}

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 512> from_cp{};
  ByteTables() {
    from_cp.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

char32_t byte_to_code_point(unsigned char b) { return byte_tables().to_cp[b]; }

int code_point_to_byte(char32_t cp) { return cp < 512 ? byte_tables().from_cp[cp] : -1; }

bool is_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool is_nonspacing_mark(char32_t cp) {
  return cp >= 0x300 &&
         utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_MN;
}

namespace {

// NFC boundary characters: a starter that no composition can absorb into the preceding
// character and that NFC maps to itself. Text splits into segments before each of them and NFC
// acts on each segment independently, so segments made of stable characters only are copied.
bool nfc_stable_slow(char32_t cp) {
  if (cp >= 0x1100 && cp <= 0x11FF) return false;  // conjoining jamo compose algorithmically
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  if (p->combining_class != 0 || p->comp_exclusion) return false;
  if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;  // second element
  if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) return true;  // no canonical one
  // A canonical decomposition: stable only for primary composites (NFC recomposes them).
  std::string one;
  append_utf8(one, cp);
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(one.data()),
                   static_cast<utf8proc_ssize_t>(one.size()), &dst,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const bool same = n == static_cast<utf8proc_ssize_t>(one.size()) &&
                    std::memcmp(dst, one.data(), one.size()) == 0;
  std::free(dst);
  return same;
}

constexpr char32_t kStableTableLimit = 0x30000;  // planes 0-2; beyond, compute on the fly

// Bitmap of nfc_stable_slow over [0, kStableTableLimit), built once.
const std::vector<uint64_t>& nfc_stable_table() {
  static const std::vector<uint64_t> table = [] {
    std::vector<uint64_t> bits(kStableTableLimit / 64, 0);
    for (char32_t cp = 0; cp < kStableTableLimit; ++cp) {
      if (cp < 0x300 || nfc_stable_slow(cp)) bits[cp / 64] |= uint64_t{1} << (cp % 64);
    }
    return bits;
  }();
  return table;
}

bool nfc_stable(char32_t cp, const std::vector<uint64_t>& table) {
  if (cp < 0x300) return true;  // Latin-1 / Latin Extended: starters, never second elements
  if (cp < kStableTableLimit) return (table[cp / 64] >> (cp % 64)) & 1;
  return nfc_stable_slow(cp);
}

std::string utf8proc_normalize(std::string_view s, int options) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) {  // Only on invalid input, which callers exclude; keep the text unchanged.
    std::free(dst);
    return std::string(s);
  }
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

// NFC, running utf8proc only on the segments that hold a non-stable character.
std::string nfc(std::string_view s) {
  const std::vector<uint64_t>& table = nfc_stable_table();
  std::string out;
  out.reserve(s.size());
  size_t copied = 0;    // s[0, copied) has been written to out
  size_t boundary = 0;  // start of the segment that holds the current position
  bool dirty = false;   // the current segment needs normalization
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
    } else {
      const char32_t cp = next_code_point(s, pos);
      if (!nfc_stable(cp, table)) {
        if (!dirty) {
          out.append(s.substr(copied, boundary - copied));
          copied = boundary;
          dirty = true;
        }
        continue;
      }
    }
    // A stable character starts a new segment.
    if (dirty) {
      out.append(utf8proc_normalize(s.substr(boundary, start - boundary),
                                    UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      copied = start;
      dirty = false;
    }
    boundary = start;
  }
  if (dirty) {
    out.append(utf8proc_normalize(s.substr(boundary), UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  } else {
    out.append(s.substr(copied));
  }
  return out;
}

}  // namespace

std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      return nfc(s);
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  return utf8proc_normalize(s, options);
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = next_code_point(s, pos);
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

}  // namespace bs::unicode
