// Builtin filters, tests, globals and Python str/dict/list methods of the chat-template
// interpreter, following Jinja2 3.1 and CPython.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "tokenizer/jinja_interp.h"
#include "tokenizer/unicode.h"

namespace bs::jinja {
namespace {

// ---- Unicode text helpers ----

std::u32string decode(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) out += unicode::next_code_point(s, i);
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) unicode::append_utf8(out, c);
  return out;
}

char32_t upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t titlecase(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
bool is_cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool is_alpha(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool is_digit(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
}
bool is_numeric(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO;
}
// Python str.isspace().
bool is_py_space(char32_t c) { return unicode::is_whitespace(c) || (c >= 0x1C && c <= 0x1F); }

std::string map_chars(std::string_view s, char32_t (*f)(char32_t)) {
  std::u32string u = decode(s), out;
  for (char32_t c : u) {
    if (c == 0xDF && f == upper) {
      out += U"SS";  // the one full (one-to-many) case mapping templates plausibly meet
    } else {
      out += f(c);
    }
  }
  return encode(out);
}

// Python str.title().
std::string py_title(std::string_view s) {
  std::u32string u = decode(s);
  bool prev_cased = false;
  for (char32_t& c : u) {
    const bool cased = is_cased(c);
    c = cased ? (prev_cased ? lower(c) : titlecase(c)) : c;
    prev_cased = cased;
  }
  return encode(u);
}

// Python str.capitalize().
std::string py_capitalize(std::string_view s) {
  std::u32string u = decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? titlecase(u[i]) : lower(u[i]);
  return encode(u);
}

// Jinja's title filter: words start after '-', whitespace, '(', '{', '[', '<'.
std::string jinja_title(std::string_view s) {
  std::u32string u = decode(s);
  bool word_start = true;
  for (char32_t& c : u) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
    if (sep) {
      word_start = true;
      continue;
    }
    c = word_start ? upper(c) : lower(c);
    word_start = false;
  }
  return encode(u);
}

// Python str.strip / lstrip / rstrip; `chars` nullptr strips whitespace.
std::string py_strip(std::string_view s, const Value* chars, bool left, bool right) {
  const std::u32string u = decode(s);
  std::u32string set;
  const bool ws = chars == nullptr || chars->is_none();
  if (!ws) {
    if (!chars->is_string()) throw Error("strip arg must be None or str");
    set = decode(chars->str());
  }
  auto strip_it = [&](char32_t c) {
    return ws ? is_py_space(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip_it(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(u[e - 1])) --e;
  }
  return encode(std::u32string_view(u).substr(b, e - b));
}

// Python str.split / rsplit.
// Python str.splitlines: breaks at \n, \r, \r\n, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029.
std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = 0;  // bytes of the line break at i
    if (c == '\r') {
      n = i + 1 < s.size() && s[i + 1] == '\n' ? 2 : 1;
    } else if (c == '\n' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E)) {
      n = 1;
    } else if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      n = 2;
    } else if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xA8 ||
                static_cast<unsigned char>(s[i + 2]) == 0xA9)) {
      n = 3;
    }
    if (n == 0) {
      ++i;
      continue;
    }
    lines.push_back(s.substr(start, (keepends ? i + n : i) - start));
    i += n;
    start = i;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

// Python str.islower / isupper: some cased character, and none of the other case.
bool py_is_case(const std::string& s, bool want_lower) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    if (!is_cased(c)) continue;
    cased = true;
    if ((want_lower ? upper(c) : lower(c)) == c && (want_lower ? lower(c) : upper(c)) != c) {
      return false;
    }
  }
  return cased;
}

Value py_split(const std::string& s, const Value* sep_v, const Value* max_v, bool from_right) {
  int64_t maxsplit = -1;
  if (max_v && !max_v->is_none()) {
    if (!max_v->is_int()) throw Error("maxsplit must be an integer");
    maxsplit = max_v->as_int();
  }
  std::vector<std::string> parts;
  if (sep_v == nullptr || sep_v->is_none()) {
    const std::u32string u = decode(s);
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end) in code points
    if (!from_right) {
      size_t i = 0;
      while (i < u.size()) {
        while (i < u.size() && is_py_space(u[i])) ++i;
        if (i == u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(i, u.size());  // the rest, trailing whitespace included
          break;
        }
        size_t j = i;
        while (j < u.size() && !is_py_space(u[j])) ++j;
        words.emplace_back(i, j);
        i = j;
      }
    } else {
      size_t i = u.size();
      while (i > 0) {
        while (i > 0 && is_py_space(u[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(0, i);  // the rest, leading whitespace included
          break;
        }
        size_t j = i;
        while (j > 0 && !is_py_space(u[j - 1])) --j;
        words.emplace_back(j, i);
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto [b, e] : words) parts.push_back(encode(std::u32string_view(u).substr(b, e - b)));
  } else {
    if (!sep_v->is_string()) throw Error("must be str or None, not " + sep_v->type_name());
    const std::string& sep = sep_v->str();
    if (sep.empty()) throw Error("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (true) {
        const size_t at = s.find(sep, start);
        if (at == std::string::npos ||
            (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.push_back(s.substr(start));
          break;
        }
        parts.push_back(s.substr(start, at - start));
        start = at + sep.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        const size_t at = end >= sep.size() ? s.rfind(sep, end - sep.size()) : std::string::npos;
        if (at == std::string::npos ||
            (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.push_back(s.substr(0, end));
          break;
        }
        parts.push_back(s.substr(at + sep.size(), end - at - sep.size()));
        end = at;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value::list(std::move(out));
}

std::string py_replace(Interpreter& in, const std::string& s, const std::string& old,
                       const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` between every character (and at both ends).
    const std::u32string u = decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) out += with, ++done;
      if (i < u.size()) unicode::append_utf8(out, u[i]);
      in.check_size(out.size());
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += with;
    in.check_size(out.size());
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// ---- argument helpers ----

Value arg(const CallArgs& a, size_t i, std::string_view name, const Value& fallback) {
  const Value* v = a.get(i, name);
  return v ? *v : fallback;
}

std::string need_string(const Value& v, const char* what) {
  if (!v.is_string()) {
    if (v.is_undefined()) throw Error(std::string(what) + ": argument is undefined");
    throw Error(std::string(what) + ": expected a string, got " + v.type_name());
  }
  return v.str();
}

int64_t need_int(const Value& v, const char* what) {
  if (!v.is_int() && !v.is_bool())
    throw Error(std::string(what) + ": expected an integer, got " + v.type_name());
  return v.as_int();
}

Value length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value(0);
    case Value::Kind::kString:
      return Value(static_cast<int64_t>(utf8_length(v.str())));
    case Value::Kind::kList:
      if (v.is_iterator()) throw Error("object of type '" + v.type_name() + "' has no len()");
      return Value(static_cast<int64_t>(v.items().size()));
    case Value::Kind::kDict:
      if (!v.is_namespace()) return Value(static_cast<int64_t>(v.dict_data().items.size()));
      [[fallthrough]];
    default:
      throw Error("object of type '" + v.type_name() + "' has no len()");
  }
}

Value dict_items(const Value& v) {
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict_data().items) out.push_back(Value::list({k, x}, true));
  return Value::list(std::move(out));
}

// Attribute path "a.b" / "0" of Jinja's make_attrgetter.
// With a default (map, groupby), an Undefined step becomes the default before the next one, as
// Jinja2's make_attrgetter does, so a missing "tool_calls.0.name" yields the default.
Value attr_path(const Value& item, const std::string& path, const Value* def = nullptr) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    char* end = nullptr;
    const long long idx = std::strtoll(part.c_str(), &end, 10);
    v = !part.empty() && *end == '\0' ? get_item(v, Value(static_cast<int64_t>(idx)))
                                      : get_item(v, Value(part));
    if (def != nullptr && !def->is_none() && v.is_undefined()) v = *def;
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Python round(x, digits): correctly rounded from the exact binary value, ties to even.
double py_round(double x, int64_t digits) {
  if (digits == 0) return std::nearbyint(x);
  if (digits > 0 && digits <= 300 && std::isfinite(x)) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(digits), x);  // exact rounding
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, static_cast<double>(digits));
  const double y = x * p;
  if (!std::isfinite(y)) return x;
  return std::nearbyint(y) / p;
}

// Python round(i, digits) of an int: unchanged for digits >= 0, else to a multiple of
// 10^-digits, ties to even.
int64_t round_int(int64_t i, int64_t digits) {
  if (digits >= 0) return i;
  if (digits < -18) return 0;
  int64_t p = 1;
  for (int64_t k = 0; k < -digits; ++k) p *= 10;
  int64_t q = i / p, r = i % p;
  if (r < 0) {
    r += p;
    --q;
  }
  if (2 * r > p || (2 * r == p && q % 2 != 0)) ++q;
  int64_t out = 0;
  if (__builtin_mul_overflow(q, p, &out)) throw Error("integer overflow");
  return out;
}

// Python's int() of a string (Jinja's int filter falls back to float()).
std::optional<int64_t> parse_int(const std::string& s, int64_t base) {
  std::string t = py_strip(s, nullptr, true, true);
  std::string digits;
  for (char c : t) {
    if (c != '_') digits += c;
  }
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& s) {
  const std::string t = py_strip(s, nullptr, true, true);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return v;
}

bool compare_key_less(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string()) {
    return map_chars(a.str(), lower) < map_chars(b.str(), lower);
  }
  return py_less(a, b);
}

// The sort filter's order: Jinja2 sorts by one-item lists of the keys, so equal keys (None and
// None) compare equal before any '<' that Python would refuse.
bool sort_less(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string()) {
    return map_chars(a.str(), lower) < map_chars(b.str(), lower);
  }
  return !py_equal(a, b) && py_less(a, b);
}

Value sort_key(const Value& item, const Value& attribute) {
  return attribute.is_string() ? attr_path(item, attribute.str()) : item;
}

// dictsort(case_sensitive=False, by="key", reverse=False): the dict's (key, value) pairs sorted
// by key or value; strings compare lowercased unless case_sensitive (Python's stable sorted()).
Value dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
  const Value by = arg(a, 1, "by", Value("key"));
  const bool reverse = arg(a, 2, "reverse", Value(false)).truthy();
  if (!by.is_string() || (by.str() != "key" && by.str() != "value")) {
    throw Error("You can only sort by either 'key' or 'value'");
  }
  if (!v.is_dict() || v.is_namespace()) {
    throw Error("dictsort: '" + v.type_name() + "' object has no attribute 'items'");
  }
  const size_t at = by.str() == "key" ? 0 : 1;
  std::vector<Value> pairs = dict_items(v).items();
  in.charge(static_cast<int64_t>(pairs.size()) * 20);
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const Value &kx = x.items()[at], &ky = y.items()[at];
    return reverse ? compare_key_less(ky, kx, cs) : compare_key_less(kx, ky, cs);
  });
  return Value::list(std::move(pairs));
}

// select / reject / selectattr / rejectattr.
Value select(Interpreter& in, const Value& seq, CallArgs& a, bool by_attr, bool keep) {
  // Jinja2 reads the arguments and iterates only `if value:`, so None selects nothing.
  if (!seq.truthy()) return Value::iterator({});
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) throw Error("selectattr/rejectattr: missing attribute name");
    attr = need_string(a.pos[0], "selectattr");
    i = 1;
  }
  std::string test_name;
  CallArgs test_args;
  if (i < a.pos.size()) {
    test_name = need_string(a.pos[i], "select");
    test_args.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(i) + 1, a.pos.end());
    test_args.kw = a.kw;
  }
  std::vector<Value> out;
  for (const Value& item : iterate(seq)) {
    in.charge(1);
    const Value v = by_attr ? attr_path(item, attr) : item;
    CallArgs ta = test_args;
    const bool ok = test_name.empty() ? v.truthy() : in.test(test_name, v, ta, 0);
    if (ok == keep) out.push_back(item);
  }
  return Value::iterator(std::move(out));
}

// The sandbox makes a mutating method an Undefined (`l.append is defined` is false) whose call
// fails with this message.
Value unsafe_method(const std::string& type, const std::string& name) {
  return Value::undefined_because("access to attribute '" + name + "' of '" + type +
                                  "' object is unsafe.");
}

// Python str.format with positional / named fields and no format specs.
std::string py_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t end = fmt.find('}', i);
      if (end == std::string::npos) throw Error("Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, end - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        throw Error("str.format: format specs and conversions are not supported");
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < a.pos.size() ? &a.pos[auto_index] : nullptr;
        ++auto_index;
      } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        const size_t k = std::strtoul(field.c_str(), nullptr, 10);
        v = k < a.pos.size() ? &a.pos[k] : nullptr;
      } else {
        v = a.get(SIZE_MAX, field);
      }
      if (v == nullptr) throw Error("str.format: no argument for field '{" + field + "}'");
      out += v->to_str();
      i = end;
    } else if (c == '}') {
      throw Error("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

// Code-point index of byte offset `at` in s (Python str.find's result).
int64_t cp_index(const std::string& s, size_t at) {
  return static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, at)));
}

// Byte offset of code-point index `i` (negative counts from the end, clamped).
size_t byte_offset(const std::string& s, int64_t i) {
  const int64_t n = static_cast<int64_t>(utf8_length(s));
  if (i < 0) i = std::max<int64_t>(0, i + n);
  if (i >= n) return s.size();
  size_t pos = 0;
  for (int64_t k = 0; k < i; ++k) pos += unicode::utf8_len(static_cast<unsigned char>(s[pos]));
  return pos;
}

// Python str.center / ljust / rjust: pads to `width` code points with a one-character fill.
std::string py_justify(Interpreter& in, const std::string& s, const std::string& how, CallArgs& a) {
  const int64_t width = need_int(arg(a, 0, "width", Value()), how.c_str());
  const std::string fill = arg(a, 1, "fillchar", Value(" ")).to_str();
  if (utf8_length(fill) != 1) throw Error("The fill character must be exactly one character long");
  const int64_t n = static_cast<int64_t>(utf8_length(s));
  if (width <= n) return s;
  const int64_t marg = width - n;
  in.check_size(static_cast<size_t>(std::min<int64_t>(marg, int64_t{1} << 40)) * fill.size() +
                s.size());
  int64_t left = how == "ljust" ? 0 : how == "rjust" ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = left; i < marg; ++i) out += fill;
  return out;
}

// str.partition / rpartition: (head, sep, tail), or the whole string with two empty parts.
Value py_partition(const std::string& s, const Value& sep_v, bool right) {
  const std::string sep = need_string(sep_v, right ? "rpartition" : "partition");
  if (sep.empty()) throw Error("empty separator");
  const size_t at = right ? s.rfind(sep) : s.find(sep);
  if (at == std::string::npos) {
    return right ? Value::list({Value(""), Value(""), Value(s)}, true)
                 : Value::list({Value(s), Value(""), Value("")}, true);
  }
  return Value::list({Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))}, true);
}

// The rarer str methods (string_method has the common ones).
Value more_string_method(const std::string& s, const std::string& name) {
  using F = std::function<Value(Interpreter&, CallArgs&)>;
  auto method = [&](F f) { return Value::function(name, std::move(f)); };
  if (name == "center" || name == "ljust" || name == "rjust") {
    return method(
        [s, name](Interpreter& in, CallArgs& a) { return Value(py_justify(in, s, name, a)); });
  }
  if (name == "partition" || name == "rpartition") {
    const bool right = name == "rpartition";
    return method([s, right](Interpreter&, CallArgs& a) {
      return py_partition(s, arg(a, 0, "sep", Value()), right);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return method([s, prefix](Interpreter&, CallArgs& a) {
      const std::string x = need_string(arg(a, 0, "prefix", Value()), "removeprefix");
      if (prefix && s.starts_with(x)) return Value(s.substr(x.size()));
      if (!prefix && s.ends_with(x)) return Value(s.substr(0, s.size() - x.size()));
      return Value(s);
    });
  }
  if (name == "zfill") {  // zeros after a leading sign
    return method([s](Interpreter& in, CallArgs& a) {
      const int64_t width = need_int(arg(a, 0, "width", Value()), "zfill");
      const int64_t n = static_cast<int64_t>(utf8_length(s));
      if (width <= n) return Value(s);
      in.check_size(static_cast<size_t>(width));
      const size_t at = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
      return Value(s.substr(0, at) + std::string(static_cast<size_t>(width - n), '0') +
                   s.substr(at));
    });
  }
  if (name == "swapcase") {
    return method([s](Interpreter&, CallArgs&) {
      std::u32string u = decode(s);
      for (char32_t& c : u) c = lower(c) != c ? lower(c) : upper(c);
      return Value(encode(u));
    });
  }
  return Value::undefined(name);
}

Value string_method(const std::string& s, const std::string& name) {
  using F = std::function<Value(Interpreter&, CallArgs&)>;
  auto method = [&](F f) { return Value::function(name, std::move(f)); };
  const Value none = Value::none();
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return method([s, start](Interpreter&, CallArgs& a) {
      const Value* p = a.get(0, "prefix");
      if (p == nullptr) throw Error("startswith/endswith: missing argument");
      // Optional start / end code-point indexes: the test applies to s[start:end].
      const Value from = arg(a, 1, "start", Value::none()), to = arg(a, 2, "end", Value::none());
      std::string t = s;
      if (!from.is_none() || !to.is_none()) {
        const int64_t n = static_cast<int64_t>(utf8_length(s));
        const int64_t b = from.is_none() ? 0 : need_int(from, "startswith");
        const size_t lo = byte_offset(s, b),
                     hi = to.is_none() ? s.size() : byte_offset(s, need_int(to, "startswith"));
        if (b > n) return Value(false);  // Python: a start past the end never matches
        t = lo <= hi ? s.substr(lo, hi - lo) : std::string();
      }
      std::vector<Value> options = p->is_tuple() ? p->items() : std::vector<Value>{*p};
      for (const Value& o : options) {
        const std::string x = need_string(o, start ? "startswith" : "endswith");
        if (start ? t.starts_with(x) : t.ends_with(x)) return Value(true);
      }
      return Value(false);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return method([s, l, r](Interpreter&, CallArgs& a) {
      return Value(py_strip(s, a.get(0, "chars"), l, r));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return method([s, right](Interpreter&, CallArgs& a) {
      return py_split(s, a.get(0, "sep"), a.get(1, "maxsplit"), right);
    });
  }
  if (name == "replace") {
    return method([s](Interpreter& in, CallArgs& a) {
      if (!a.kw.empty()) throw Error("str.replace() takes no keyword arguments");
      const Value none;
      const Value count = arg(a, 2, "count", Value(int64_t{-1}));
      return Value(py_replace(in, s, need_string(arg(a, 0, "old", none), "replace"),
                              need_string(arg(a, 1, "new", none), "replace"),
                              need_int(count, "replace")));
    });
  }
  if (name == "upper")
    return method([s](Interpreter&, CallArgs&) { return Value(map_chars(s, upper)); });
  if (name == "lower")
    return method([s](Interpreter&, CallArgs&) { return Value(map_chars(s, lower)); });
  if (name == "title") return method([s](Interpreter&, CallArgs&) { return Value(py_title(s)); });
  if (name == "capitalize") {
    return method([s](Interpreter&, CallArgs&) { return Value(py_capitalize(s)); });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const bool right = name[0] == 'r';
    const bool raise = name.ends_with("index");
    return method([s, right, raise](Interpreter&, CallArgs& a) {
      const Value none;
      const std::string sub = need_string(arg(a, 0, "sub", none), "find");
      const Value start_v = arg(a, 1, "start", Value::none());
      const Value end_v = arg(a, 2, "end", Value::none());
      const size_t b = start_v.is_none() ? 0 : byte_offset(s, need_int(start_v, "find"));
      const size_t e = end_v.is_none() ? s.size() : byte_offset(s, need_int(end_v, "find"));
      size_t at = std::string::npos;
      if (b <= e && e - b >= sub.size()) {
        const std::string_view window = std::string_view(s).substr(b, e - b);
        at = right ? window.rfind(sub) : window.find(sub);
        if (at != std::string::npos) at += b;
      }
      if (at == std::string::npos) {
        if (raise) throw Error("substring not found");
        return Value(int64_t{-1});
      }
      return Value(cp_index(s, at));
    });
  }
  if (name == "count") {
    return method([s](Interpreter&, CallArgs& a) {
      const Value none;
      const std::string sub = need_string(arg(a, 0, "sub", none), "count");
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return method([s](Interpreter& in, CallArgs& a) {
      const Value none;
      std::string out;
      bool first = true;
      for (const Value& v : iterate(arg(a, 0, "iterable", none))) {
        if (!first) out += s;
        first = false;
        out += need_string(v, "join");
        in.check_size(out.size());
      }
      return Value(std::move(out));
    });
  }
  if (name == "format") {
    return method([s](Interpreter&, CallArgs& a) { return Value(py_format(s, a)); });
  }
  if (name == "splitlines") {
    return method([s](Interpreter&, CallArgs& a) {
      const bool keep = arg(a, 0, "keepends", Value(false)).truthy();
      std::vector<Value> lines;
      for (std::string& line : py_splitlines(s, keep)) lines.emplace_back(std::move(line));
      return Value::list(std::move(lines));
    });
  }
  using Pred = bool (*)(char32_t);
  auto all_of = [&](Pred p) {
    return method([s, p](Interpreter&, CallArgs&) {
      const std::u32string u = decode(s);
      return Value(!u.empty() && std::all_of(u.begin(), u.end(), p));
    });
  };
  if (name == "isdigit" || name == "isdecimal") return all_of(is_digit);
  if (name == "isnumeric") return all_of(is_numeric);
  if (name == "istitle") {  // cased runs start with a title/upper case letter, then lowercase
    return method([s](Interpreter&, CallArgs&) {
      bool cased = false, prev_cased = false;
      for (char32_t c : decode(s)) {
        const bool up = is_cased(c) && lower(c) != c, low = is_cased(c) && !up;
        if (up && prev_cased) return Value(false);
        if (low && !prev_cased) return Value(false);
        cased = cased || is_cased(c);
        prev_cased = is_cased(c);
      }
      return Value(cased);
    });
  }
  if (name == "isalpha") return all_of(is_alpha);
  if (name == "isspace") return all_of(is_py_space);
  if (name == "isalnum") return all_of([](char32_t c) { return is_alpha(c) || is_digit(c); });
  if (name == "islower" || name == "isupper") {
    const bool want_lower = name == "islower";
    return method(
        [s, want_lower](Interpreter&, CallArgs&) { return Value(py_is_case(s, want_lower)); });
  }
  (void)none;
  return more_string_method(s, name);
}

// ---- the rarer filters (Jinja2 3.1's definitions) ----

// batch(linecount, fill_with=None): lists of linecount items, the last one padded.
Value batch(Interpreter& in, const Value& v, CallArgs& a) {
  const int64_t n = need_int(arg(a, 0, "linecount", Value()), "batch");
  const Value fill = arg(a, 1, "fill_with", Value::none());
  std::vector<Value> out, tmp;
  for (const Value& item : iterate(v)) {
    in.charge(1);
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (!fill.is_none() && static_cast<int64_t>(tmp.size()) < n) {
      in.check_list(static_cast<size_t>(n));
      tmp.resize(static_cast<size_t>(n), fill);
    }
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::iterator(std::move(out));
}

// slice(slices, fill_with=None): the items cut into `slices` columns, the first ones longer.
Value slice(Interpreter& in, const Value& v, CallArgs& a) {
  const int64_t slices = need_int(arg(a, 0, "slices", Value()), "slice");
  const Value fill = arg(a, 1, "fill_with", Value::none());
  if (slices <= 0) throw Error("slice: integer division or modulo by zero");
  const std::vector<Value> seq = iterate(v);
  const int64_t len = static_cast<int64_t>(seq.size());
  const int64_t per = len / slices, with_extra = len % slices;
  in.check_list(static_cast<size_t>(std::min<int64_t>(slices, 1 << 30)));
  std::vector<Value> out;
  int64_t offset = 0;
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t start = offset + k * per;
    if (k < with_extra) ++offset;
    const int64_t end = offset + (k + 1) * per;
    std::vector<Value> part(seq.begin() + start, seq.begin() + end);
    if (!fill.is_none() && k >= with_extra) part.push_back(fill);
    out.push_back(Value::list(std::move(part)));
  }
  return Value::iterator(std::move(out));
}

// truncate(length=255, killwords=False, end='...', leeway=5).
Value truncate(const Value& v, CallArgs& a) {
  const std::string s = v.to_str();
  const int64_t length = need_int(arg(a, 0, "length", Value(255)), "truncate");
  const bool killwords = arg(a, 1, "killwords", Value(false)).truthy();
  const std::string end = arg(a, 2, "end", Value("...")).to_str();
  const Value leeway_v = arg(a, 3, "leeway", Value::none());
  const int64_t leeway = leeway_v.is_none() ? 5 : need_int(leeway_v, "truncate");
  const int64_t end_len = static_cast<int64_t>(utf8_length(end));
  if (length < end_len) {
    throw Error("expected length >= " + std::to_string(end_len) + ", got " +
                std::to_string(length));
  }
  if (leeway < 0) throw Error("expected leeway >= 0, got " + std::to_string(leeway));
  const int64_t n = static_cast<int64_t>(utf8_length(s));
  if (n <= length || n - length <= leeway) return Value(s);  // (no overflow: length >= 0)
  std::string head = s.substr(0, byte_offset(s, length - end_len));
  if (!killwords) {
    const size_t space = head.rfind(' ');
    if (space != std::string::npos) head.resize(space);
  }
  return Value(head + end);
}

// wordcount: the number of \w+ runs (letters, digits, underscore).
Value wordcount(const Value& v) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : decode(v.to_str())) {
    const bool w = is_alpha(c) || is_numeric(c) || c == U'_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

// Removes every non-overlapping `open`...`close` span, leftmost first (the regex open.*?close).
// Once a close is not found no later one is either, which keeps "<<<<..." linear.
std::string remove_spans(const std::string& s, std::string_view open, std::string_view close) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t b = s.find(open, i);
    const size_t e = b == std::string::npos ? b : s.find(close, b + open.size());
    if (e == std::string::npos) break;
    out.append(s, i, b - i);
    i = e + close.size();
  }
  out.append(s, std::min(i, s.size()), std::string::npos);
  return out;
}

// Markup.striptags: comments, then tags removed, whitespace runs collapsed to one space, then the
// basic HTML entities unescaped.
Value striptags(const Value& v) {
  const std::string text = remove_spans(remove_spans(v.to_str(), "<!--", "-->"), "<", ">");
  std::string words;
  const Value split = py_split(text, nullptr, nullptr, false);  // outlives the loop
  for (const Value& word : split.items()) {
    if (!words.empty()) words += ' ';
    words += word.str();
  }
  static const std::pair<std::string_view, std::string_view> kEntities[] = {
      {"&lt;", "<"},  {"&gt;", ">"},   {"&quot;", "\""}, {"&#34;", "\""},
      {"&#39;", "'"}, {"&apos;", "'"}, {"&amp;", "&"}};
  std::string out;
  for (size_t i = 0; i < words.size();) {
    const auto* hit = std::find_if(std::begin(kEntities), std::end(kEntities), [&](const auto& e) {
      return std::string_view(words).substr(i).starts_with(e.first);
    });
    if (hit == std::end(kEntities)) {
      out += words[i++];
    } else {
      out += hit->second;
      i += hit->first.size();
    }
  }
  return Value(std::move(out));
}

// groupby(attribute, default=None, case_sensitive=False): the items sorted by the attribute and
// grouped, as (grouper, list) tuples; when case-insensitive the grouper is the first item's value.
Value groupby(Interpreter& in, const Value& v, CallArgs& a) {
  const Value attribute = arg(a, 0, "attribute", Value());
  const Value def = arg(a, 1, "default", Value::none());
  const bool cs = arg(a, 2, "case_sensitive", Value(false)).truthy();
  auto key_of = [&](const Value& item) {
    Value k =
        attribute.is_int() ? get_item(item, attribute) : attr_path(item, attribute.to_str(), &def);
    if (k.is_undefined() && !def.is_none()) k = def;
    return k;
  };
  auto folded = [&](const Value& k) {
    return !cs && k.is_string() ? Value(map_chars(k.str(), lower)) : k;
  };
  std::vector<Value> items = iterate(v);
  in.charge(static_cast<int64_t>(items.size()) * 20);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return py_less(folded(key_of(x)), folded(key_of(y)));
  });
  std::vector<Value> out, members;
  Value current;
  auto flush = [&] {
    out.push_back(Value::group(cs ? current : key_of(members[0]), Value::list(members)));
    members.clear();
  };
  for (const Value& item : items) {
    const Value k = folded(key_of(item));
    if (!members.empty() && !py_equal(k, current)) flush();
    current = k;
    members.push_back(item);
  }
  if (!members.empty()) flush();
  return Value::list(std::move(out));
}

// The filters above by name; false when `name` is none of them.
bool more_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& a,
                 Value& out) {
  if (name == "batch") {
    out = batch(in, v, a);
  } else if (name == "slice") {
    out = slice(in, v, a);
  } else if (name == "truncate") {
    out = truncate(v, a);
  } else if (name == "wordcount") {
    out = wordcount(v);
  } else if (name == "striptags") {
    out = striptags(v);
  } else if (name == "groupby") {
    out = groupby(in, v, a);
  } else if (name == "center") {
    CallArgs ca;
    ca.pos.push_back(arg(a, 0, "width", Value(80)));
    out = Value(py_justify(in, v.to_str(), "center", ca));
  } else {
    return false;
  }
  return true;
}

}  // namespace

Value get_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj.str(), name);
  if (obj.is_dict() && !obj.is_namespace()) {
    if (name == "items") {
      return Value::function(name, [obj](Interpreter&, CallArgs&) { return dict_items(obj); });
    }
    if (name == "keys" || name == "values") {
      const bool keys = name == "keys";
      return Value::function(name, [obj, keys](Interpreter&, CallArgs&) {
        std::vector<Value> out;
        for (const auto& [k, v] : obj.dict_data().items) out.push_back(keys ? k : v);
        return Value::list(std::move(out));
      });
    }
    if (name == "get") {
      return Value::function(name, [obj](Interpreter&, CallArgs& a) {
        if (a.pos.empty()) throw Error("get expected at least 1 argument, got 0");
        const Value* v = obj.dict_data().find(a.pos[0]);
        return v ? *v : a.pos.size() > 1 ? a.pos[1] : Value::none();
      });
    }
    if (name == "copy")
      return Value::function(name, [obj](Interpreter&, CallArgs&) { return obj; });
    if (name == "pop" || name == "update" || name == "setdefault" || name == "clear" ||
        name == "popitem") {
      return unsafe_method("dict", name);
    }
  }
  if (obj.is_list() && !obj.is_iterator()) {
    if (name == "copy" && !obj.is_tuple()) {
      return Value::function(name,
                             [obj](Interpreter&, CallArgs&) { return Value::list(obj.items()); });
    }
    if (name == "index" || name == "count") {
      const bool index = name == "index";
      return Value::function(name, [obj, index](Interpreter&, CallArgs& a) {
        if (a.pos.empty()) throw Error("list method expects an argument");
        int64_t n = 0;
        for (size_t i = 0; i < obj.items().size(); ++i) {
          if (!py_equal(obj.items()[i], a.pos[0])) continue;
          if (index) return Value(static_cast<int64_t>(i));
          ++n;
        }
        if (index) throw Error(a.pos[0].repr() + " is not in list");
        return Value(n);
      });
    }
    if (name == "append" || name == "extend" || name == "pop" || name == "insert" ||
        name == "remove" || name == "sort" || name == "reverse" || name == "clear") {
      return unsafe_method(obj.type_name(), name);
    }
  }
  return Value::undefined(name);
}

// ---- filters ----

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  const Value none = Value::none();
  const Value undef;
  in.charge(1);
  if (name == "default" || name == "d") {
    const bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value(""));
    return v;
  }
  if (name == "length" || name == "count") return length_of(v);
  if (name == "string") return Value(v.to_str());
  // safe: Markup(str(value)); escape / e: Markup of the escaped text unless already Markup;
  // forceescape: escapes even Markup.
  if (name == "safe") return v.is_markup() ? v : Value::markup(v.to_str());
  if (name == "escape" || name == "e") {
    return v.is_markup() ? v : Value::markup(html_escape(v.to_str()));
  }
  if (name == "forceescape") return Value::markup(html_escape(v.to_str()));
  if (name == "trim") return Value(py_strip(v.to_str(), a.get(0, "chars"), true, true));
  if (name == "upper") return Value(map_chars(v.to_str(), upper));
  if (name == "lower") return Value(map_chars(v.to_str(), lower));
  if (name == "title") return Value(jinja_title(v.to_str()));
  if (name == "capitalize") return Value(py_capitalize(v.to_str()));
  if (name == "replace") {
    const Value count = arg(a, 2, "count", none);
    return Value(py_replace(in, v.to_str(), arg(a, 0, "old", undef).to_str(),
                            arg(a, 1, "new", undef).to_str(),
                            count.is_none() ? -1 : need_int(count, "replace")));
  }
  if (name == "tojson") {
    JsonOptions opt;
    opt.ensure_ascii = arg(a, 0, "ensure_ascii", Value(false)).truthy();
    const Value indent = arg(a, 1, "indent", none);
    if (indent.is_int()) {
      opt.indent =
          std::string(static_cast<size_t>(std::clamp<int64_t>(indent.as_int(), 0, 64)), ' ');
    } else if (indent.is_string()) {
      opt.indent = indent.str();
    } else if (!indent.is_none()) {
      throw Error("tojson: indent must be an int or a string");
    }
    if (opt.indent) opt.item_sep = ",";
    const Value seps = arg(a, 2, "separators", none);
    if (seps.is_list() && seps.items().size() == 2) {
      opt.item_sep = need_string(seps.items()[0], "tojson separators");
      opt.key_sep = need_string(seps.items()[1], "tojson separators");
    } else if (!seps.is_none()) {
      throw Error("tojson: separators must be a pair of strings");
    }
    opt.sort_keys = arg(a, 3, "sort_keys", Value(false)).truthy();
    std::string s = to_json(v, opt);
    in.check_size(s.size());
    return Value(std::move(s));
  }
  if (name == "join") {
    const Value sep = arg(a, 0, "d", Value(""));
    const Value attribute = arg(a, 1, "attribute", none);
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep.to_str();
      first = false;
      out += (attribute.is_none() ? item : attr_path(item, attribute.to_str())).to_str();
      in.check_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    if (name == "last" && v.is_iterator()) {
      throw Error("'" + v.type_name() + "' object is not reversible");
    }
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::list(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::iterator({});
    if (!v.is_dict() || v.is_namespace()) throw Error("Can only get item pairs from a mapping.");
    return Value::iterator(dict_items(v).items());
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = decode(v.str());
      std::reverse(u.begin(), u.end());
      return Value(encode(u));
    }
    // reversed(value) where Python has it; a generator becomes a reversed list.
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    if (v.is_iterator() || v.is_undefined()) return Value::list(std::move(items));
    return Value::iterator(std::move(items), v.is_dict()    ? "dict_reversekeyiterator"
                                             : v.is_tuple() ? "reversed"
                                                            : "list_reverseiterator");
  }
  if (name == "int") {
    const Value def = arg(a, 0, "default", Value(0));
    const int64_t base = need_int(arg(a, 1, "base", Value(10)), "int");
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    if (v.kind() == Value::Kind::kFloat) {
      if (!std::isfinite(v.as_double())) return def;
      return Value(static_cast<int64_t>(std::trunc(v.as_double())));
    }
    if (v.is_string()) {
      if (auto i = parse_int(v.str(), base)) return Value(*i);
      if (auto d = parse_float(v.str()); d && std::isfinite(*d)) {
        return Value(static_cast<int64_t>(std::trunc(*d)));
      }
    }
    return def;
  }
  if (name == "float") {
    const Value def = arg(a, 0, "default", Value(0.0));
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      if (auto d = parse_float(v.str())) return Value(*d);
    }
    return def;
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::kFloat) return Value(std::fabs(v.as_double()));
    if (v.is_int() || v.is_bool()) {
      if (v.as_int() == INT64_MIN) throw Error("integer overflow");
      return Value(std::abs(v.as_int()));
    }
    throw Error("bad operand type for abs(): '" + v.type_name() + "'");
  }
  if (name == "round") {
    const int64_t precision = need_int(arg(a, 0, "precision", Value(0)), "round");
    const std::string method = arg(a, 1, "method", Value("common")).to_str();
    if (!v.is_number()) throw Error("round: expected a number, got " + v.type_name());
    if (method == "common" && v.kind() != Value::Kind::kFloat) {
      return Value(round_int(v.as_int(), precision));  // Python's round(int, n) is an int
    }
    const double x = v.as_double();
    if (method == "common") return Value(py_round(x, precision));
    const double p = std::pow(10.0, static_cast<double>(precision));
    if (method == "ceil") return Value(std::ceil(x * p) / p);
    if (method == "floor") return Value(std::floor(x * p) / p);
    throw Error("method must be common, ceil or floor");
  }
  if (name == "unique") {
    const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
    const Value attribute = arg(a, 1, "attribute", none);
    std::vector<Value> out, seen;
    for (const Value& item : iterate(v)) {
      in.charge(static_cast<int64_t>(seen.size()) + 1);
      Value key = attribute.is_none() ? item : attr_path(item, attribute.to_str());
      if (!cs && key.is_string()) key = Value(map_chars(key.str(), lower));
      if (std::none_of(seen.begin(), seen.end(),
                       [&](const Value& s) { return py_equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::iterator(std::move(out));
  }
  if (name == "sort") {
    const bool reverse = arg(a, 0, "reverse", Value(false)).truthy();
    const bool cs = arg(a, 1, "case_sensitive", Value(false)).truthy();
    const Value attribute = arg(a, 2, "attribute", none);
    std::vector<Value> items = iterate(v);
    in.charge(static_cast<int64_t>(items.size()) * 20);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value kx = sort_key(x, attribute), ky = sort_key(y, attribute);
      return reverse ? sort_less(ky, kx, cs) : sort_less(kx, ky, cs);
    });
    return Value::list(std::move(items));
  }
  if (name == "min" || name == "max") {
    const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
    const Value attribute = arg(a, 1, "attribute", none);
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      const Value ki = sort_key(items[i], attribute), kb = sort_key(items[best], attribute);
      if (name == "min" ? compare_key_less(ki, kb, cs) : compare_key_less(kb, ki, cs)) best = i;
    }
    return items[best];
  }
  if (name == "sum") {
    const Value attribute = arg(a, 0, "attribute", none);
    Value total = arg(a, 1, "start", Value(0));
    for (const Value& item : iterate(v)) {
      total = binary_op(in, "+", total,
                        attribute.is_none() ? item : attr_path(item, attribute.to_str()));
    }
    return total;
  }
  if (name == "map") {
    std::vector<Value> out;
    if (!v.truthy()) return Value::iterator({});  // as select: nothing when the value is falsy
    const Value* attribute = a.get(SIZE_MAX, "attribute");
    if (attribute) {
      const Value* def = a.get(SIZE_MAX, "default");
      for (const Value& item : iterate(v)) {
        in.charge(1);
        out.push_back(attr_path(item, attribute->to_str(), def));
      }
    } else {
      if (a.pos.empty()) throw Error("map: missing filter name or attribute");
      const std::string filter_name = need_string(a.pos[0], "map");
      for (const Value& item : iterate(v)) {
        CallArgs fa;
        fa.pos.assign(a.pos.begin() + 1, a.pos.end());
        fa.kw = a.kw;
        out.push_back(in.filter(filter_name, item, fa, 0));
      }
    }
    return Value::iterator(std::move(out));
  }
  if (name == "dictsort") return dictsort(in, v, a);
  if (name == "format") {  // str(value) % (kwargs or args)
    if (!a.pos.empty() && !a.kw.empty()) {
      throw Error("can't handle positional and keyword arguments at the same time");
    }
    std::vector<std::pair<Value, Value>> kw;
    for (const auto& [k, x] : a.kw) kw.emplace_back(Value(k), x);
    return Value(percent_format(
        in, v.to_str(), kw.empty() ? Value::list(a.pos, true) : Value::dict(std::move(kw))));
  }
  if (name == "select") return select(in, v, a, false, true);
  if (name == "reject") return select(in, v, a, false, false);
  if (name == "selectattr") return select(in, v, a, true, true);
  if (name == "rejectattr") return select(in, v, a, true, false);
  if (name == "attr") {  // getattr(): a dict's keys are not attributes, its methods are
    const std::string attr = arg(a, 0, "name", undef).to_str();
    if ((v.is_dict() && !v.is_namespace()) || v.is_list()) return get_method(v, attr);
    return get_attr(v, attr);
  }
  if (name == "indent") {
    const Value width = arg(a, 0, "width", Value(4));
    const bool first = arg(a, 1, "first", Value(false)).truthy();
    const bool blank = arg(a, 2, "blank", Value(false)).truthy();
    const std::string pad =
        width.is_string()
            ? width.str()
            : std::string(
                  static_cast<size_t>(std::clamp<int64_t>(need_int(width, "indent"), 0, 256)), ' ');
    // Jinja2: (s + "\n").splitlines(), joined again with "\n".
    std::vector<std::string> lines = py_splitlines(v.to_str() + "\n", false);
    if (lines.empty()) lines.emplace_back();
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n";
      if (i > 0 && (blank || !lines[i].empty())) out += pad;
      out += lines[i];
      in.check_size(out.size());
    }
    if (first) out = pad + out;
    return Value(std::move(out));
  }
  if (Value out; more_filter(in, name, v, a, out)) return out;
  throw Error("no filter named '" + name + "'");
}

// ---- tests ----

template <size_t N>
bool one_of(const char* const (&names)[N], const std::string& name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

bool has_filter(const std::string& name) {
  static const char* kFilters[] = {
      "default",  "d",         "length",    "count",      "string",      "safe",   "trim",
      "upper",    "lower",     "title",     "capitalize", "replace",     "tojson", "join",
      "first",    "last",      "list",      "items",      "reverse",     "int",    "float",
      "abs",      "round",     "unique",    "sort",       "min",         "max",    "sum",
      "map",      "select",    "reject",    "selectattr", "rejectattr",  "attr",   "indent",
      "dictsort", "format",    "escape",    "e",          "forceescape", "batch",  "slice",
      "truncate", "wordcount", "striptags", "groupby",    "center"};
  return one_of(kFilters, name);
}

bool has_test(const std::string& name) {
  static const char* kTests[] = {
      "defined", "undefined",   "none",        "string",   "number", "integer",  "float",
      "mapping", "iterable",    "sequence",    "boolean",  "true",   "false",    "even",
      "odd",     "divisibleby", "in",          "equalto",  "eq",     "==",       "ne",
      "!=",      "lt",          "<",           "le",       "<=",     "gt",       ">",
      "ge",      ">=",          "greaterthan", "lessthan", "sameas", "callable", "lower",
      "upper",   "filter",      "test",        "escaped"};
  return one_of(kTests, name);
}

bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  const Value undef;
  const Value x = arg(a, 0, "value", undef);
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "iterable") {
    return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
  }
  if (name == "sequence") {
    return v.is_undefined() || v.is_string() || (v.is_list() && !v.is_iterator()) ||
           (v.is_dict() && !v.is_namespace());
  }
  if (name == "callable") return v.is_func() || v.is_undefined();  // Undefined has __call__
  if (name == "even" || name == "odd") {
    const int64_t i = need_int(v, name.c_str());
    return (i % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const int64_t d = need_int(x, "divisibleby");
    if (d == 0) throw Error("integer division or modulo by zero");
    return need_int(v, "divisibleby") % d == 0;
  }
  if (name == "in") return contains(x, v);
  if (name == "equalto" || name == "eq" || name == "==") return py_equal(v, x);
  if (name == "ne" || name == "!=") return !py_equal(v, x);
  if (name == "lt" || name == "<" || name == "lessthan") return py_less(v, x);
  if (name == "gt" || name == ">" || name == "greaterthan") return py_less(x, v);
  if (name == "le" || name == "<=") return py_less(v, x) || py_equal(v, x);
  if (name == "ge" || name == ">=") return py_less(x, v) || py_equal(v, x);
  if (name == "sameas") return v.kind() == x.kind() && py_equal(v, x);
  if (name == "lower" || name == "upper") return py_is_case(v.to_str(), name == "lower");
  if (name == "escaped") return v.is_markup();
  if (name == "filter") return v.is_string() && has_filter(v.str());
  if (name == "test") return v.is_string() && has_test(v.str());
  (void)in;
  throw Error("no test named '" + name + "'");
}

// ---- globals ----

std::vector<std::pair<std::string, Value>> builtin_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back(
      "range", Value::function("range", [](Interpreter& in, CallArgs& a) {
        if (a.pos.empty() || a.pos.size() > 3) throw Error("range expected 1 to 3 arguments");
        int64_t start = 0, stop = 0, step = 1;
        if (a.pos.size() == 1) {
          stop = need_int(a.pos[0], "range");
        } else {
          start = need_int(a.pos[0], "range");
          stop = need_int(a.pos[1], "range");
          if (a.pos.size() == 3) step = need_int(a.pos[2], "range");
        }
        if (step == 0) throw Error("range() arg 3 must not be zero");
        const double n = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                   static_cast<double>(step));
        if (n > 100000) {
          throw Error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        }
        std::vector<Value> out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
        in.charge(static_cast<int64_t>(out.size()));
        return Value::list(std::move(out));
      }));
  auto kwargs_dict = [](CallArgs& a, bool ns) {
    std::vector<std::pair<Value, Value>> items;
    if (!a.pos.empty()) {
      if (a.pos.size() > 1 || !a.pos[0].is_dict())
        throw Error("expected at most one mapping argument");
      items = a.pos[0].dict_data().items;
    }
    for (auto& [k, v] : a.kw) items.emplace_back(Value(k), v);
    return ns ? Value::namespace_object(std::move(items)) : Value::dict(std::move(items));
  };
  g.emplace_back("namespace",
                 Value::function("namespace", [kwargs_dict](Interpreter&, CallArgs& a) {
                   return kwargs_dict(a, true);
                 }));
  g.emplace_back("dict", Value::function("dict", [kwargs_dict](Interpreter&, CallArgs& a) {
                   return kwargs_dict(a, false);
                 }));
  // cycler(*items): .next() returns the current item and advances, .current, .reset().
  g.emplace_back(
      "cycler", Value::function("cycler", [](Interpreter&, CallArgs& a) {
        if (a.pos.empty()) throw Error("at least one item has to be provided");
        const std::vector<Value> items = a.pos;
        auto pos = std::make_shared<size_t>(0);
        Value c = Value::dict({{Value("current"), items[0]}});
        // The functions hold the cycler to update .current (the render's container
        // scope breaks that cycle).
        c.dict_data().set(Value("next"),
                          Value::function("next", [items, pos, c](Interpreter&, CallArgs&) {
                            const Value rv = items[*pos];
                            *pos = (*pos + 1) % items.size();
                            c.dict_data().set(Value("current"), items[*pos]);
                            return rv;
                          }));
        c.dict_data().set(Value("reset"),
                          Value::function("reset", [items, pos, c](Interpreter&, CallArgs&) {
                            *pos = 0;
                            c.dict_data().set(Value("current"), items[0]);
                            return Value::none();
                          }));
        return c;
      }));
  // joiner(sep=", "): a callable returning "" the first time, then sep.
  g.emplace_back("joiner", Value::function("joiner", [](Interpreter&, CallArgs& a) {
                   const std::string sep = arg(a, 0, "sep", Value(", ")).to_str();
                   auto used = std::make_shared<bool>(false);
                   return Value::function("joiner", [sep, used](Interpreter&, CallArgs&) {
                     const bool first = !*used;
                     *used = true;
                     return Value(first ? std::string() : sep);
                   });
                 }));
  g.emplace_back("raise_exception",
                 Value::function("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
                   const Value* msg = a.get(0, "message");
                   throw Error(msg ? msg->to_str() : std::string("raise_exception"));
                 }));
  g.emplace_back("strftime_now", Value::function("strftime_now", [](Interpreter& in, CallArgs& a) {
                   const Value undef;
                   const std::string fmt = need_string(arg(a, 0, "format", undef), "strftime_now");
                   const std::tm tm = in.now();
                   char buf[512];
                   const size_t n =
                       fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
                   if (n == 0 && !fmt.empty())
                     throw Error("strftime_now: format produced no output or is too long");
                   return Value(std::string(buf, n));
                 }));
  return g;
}

}  // namespace bs::jinja
