// Python's printf-style string formatting (`"%s: %d" % (a, b)`, and Jinja's format filter), as
// CPython's str.__mod__ does it: conversions s r a d i u o x X e E f F g G c %, flags - + space #
// 0, width and precision (numbers or *), %(name)s keys into a dict argument.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tokenizer/jinja_interp.h"
#include "tokenizer/unicode.h"

namespace bs::jinja {
namespace {

struct Spec {
  bool left = false, plus = false, space = false, alt = false, zero = false;
  int64_t width = -1, precision = -1;
  char conv = 0;
};

// The arguments: a tuple gives positional values, a dict gives %(name) lookups (and is also the
// single positional value), anything else is the one positional value.
class Args {
 public:
  explicit Args(const Value& v) : v_(v) {
    if (v.is_list() && v.is_tuple()) {
      pos_ = v.items();
    } else {
      pos_.push_back(v);
    }
  }
  const Value& next() {
    if (i_ >= pos_.size()) throw Error("not enough arguments for format string");
    return pos_[i_++];
  }
  const Value& key(const std::string& k) {
    if (!v_.is_dict() || v_.is_namespace()) throw Error("format requires a mapping");
    used_key_ = true;
    const Value* x = v_.dict_data().find(Value(k));
    if (x == nullptr) throw Error("KeyError: '" + k + "'");
    return *x;
  }
  // Python: leftover positional values are an error unless the argument is a mapping.
  void finish() const {
    const bool mapping = v_.is_dict() && !v_.is_namespace();
    if (i_ < pos_.size() && !mapping && !used_key_) {
      throw Error("not all arguments converted during string formatting");
    }
  }

 private:
  const Value& v_;
  std::vector<Value> pos_;
  size_t i_ = 0;
  bool used_key_ = false;
};

int64_t star_arg(Args& args) {
  const Value& v = args.next();
  if (!v.is_int() && !v.is_bool()) throw Error("* wants int");
  return std::clamp<int64_t>(v.as_int(), -(int64_t{1} << 24), int64_t{1} << 24);
}

std::string pad(std::string body, const Spec& s, bool numeric) {
  const int64_t n = static_cast<int64_t>(utf8_length(body));
  if (s.width <= n) return body;
  const size_t fill = static_cast<size_t>(std::min<int64_t>(s.width - n, 1 << 20));
  if (s.left) return body + std::string(fill, ' ');
  if (numeric && s.zero) {
    // Zeros go after the sign and the 0x / 0o prefix.
    size_t at = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
    if (s.alt && body.size() >= at + 2 && body[at] == '0' &&
        (body[at + 1] == 'x' || body[at + 1] == 'X' || body[at + 1] == 'o')) {
      at += 2;
    }
    return body.insert(at, fill, '0');
  }
  return std::string(fill, ' ') + body;
}

std::string sign_prefix(bool negative, const Spec& s) {
  if (negative) return "-";
  if (s.plus) return "+";
  if (s.space) return " ";
  return "";
}

std::string format_int(const Value& v, const Spec& s) {
  const char c = s.conv;
  int64_t i = 0;
  if (v.is_int() || v.is_bool()) {
    i = v.as_int();
  } else if (v.kind() == Value::Kind::kFloat && (c == 'd' || c == 'i' || c == 'u')) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) throw Error("cannot convert float to integer");
    i = static_cast<int64_t>(std::trunc(d));
  } else if (c == 'd' || c == 'i' || c == 'u') {
    throw Error(std::string("%") + c + " format: a real number is required, not " + v.type_name());
  } else {
    throw Error(std::string("%") + c + " format: an integer is required, not " + v.type_name());
  }
  const bool negative = i < 0;
  const uint64_t mag = negative ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
  char buf[64];
  const char* fmt = c == 'x' ? "%llx" : c == 'X' ? "%llX" : c == 'o' ? "%llo" : "%llu";
  std::snprintf(buf, sizeof(buf), fmt, static_cast<unsigned long long>(mag));
  std::string digits = buf;
  if (s.precision > static_cast<int64_t>(digits.size())) {
    digits.insert(0, static_cast<size_t>(std::min<int64_t>(s.precision, 1 << 20)) - digits.size(),
                  '0');
  }
  if (s.alt && (c == 'x' || c == 'X')) digits = std::string("0") + c + digits;
  if (s.alt && c == 'o') digits = "0o" + digits;
  return pad(sign_prefix(negative, s) + digits, s, true);
}

std::string format_float(const Value& v, const Spec& s) {
  if (!v.is_number()) {
    throw Error(std::string("must be real number, not ") + v.type_name());
  }
  const double d = v.as_double();
  const int precision = s.precision < 0 ? 6 : static_cast<int>(std::min<int64_t>(s.precision, 300));
  std::string f = "%";
  if (s.alt) f += '#';
  f += ".*";
  f += s.conv;
  const int len = std::snprintf(nullptr, 0, f.c_str(), precision, std::fabs(d));
  std::string body(static_cast<size_t>(std::max(len, 0)) + 1, '\0');
  std::snprintf(body.data(), body.size(), f.c_str(), precision, std::fabs(d));
  body.resize(static_cast<size_t>(std::max(len, 0)));
  if (std::isinf(d)) body = (s.conv >= 'a') ? "inf" : "INF";
  if (std::isnan(d)) body = (s.conv >= 'a') ? "nan" : "NAN";
  return pad(sign_prefix(std::signbit(d) && !std::isnan(d), s) + body, s, std::isfinite(d));
}

// Python ascii(): repr() with non-ASCII code points as \xNN, \uNNNN or \UNNNNNNNN.
std::string ascii_repr(const std::string& repr) {
  std::string out;
  for (size_t i = 0; i < repr.size();) {
    const unsigned char b = static_cast<unsigned char>(repr[i]);
    if (b < 0x80) {
      out += repr[i++];
      continue;
    }
    const size_t n = std::min(unicode::utf8_len(b), repr.size() - i);
    char32_t cp = b & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(repr[i + k]) & 0x3F);
    i += n;
    char buf[16];
    if (cp <= 0xFF) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
    } else if (cp <= 0xFFFF) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
    } else {
      std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
    }
    out += buf;
  }
  return out;
}

std::string format_one(Interpreter& in, const Value& v, const Spec& s) {
  switch (s.conv) {
    case 's':
    case 'r':
    case 'a': {
      std::string text = s.conv == 's' ? v.to_str() : v.repr();
      if (s.conv == 'a') text = ascii_repr(text);
      if (s.precision >= 0 && static_cast<int64_t>(utf8_length(text)) > s.precision) {
        size_t at = 0;
        for (int64_t k = 0; k < s.precision; ++k) {
          do ++at;
          while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80);
        }
        text.resize(at);
      }
      return pad(std::move(text), s, false);
    }
    case 'd':
    case 'i':
    case 'u':
    case 'o':
    case 'x':
    case 'X':
      return format_int(v, s);
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G':
      return format_float(v, s);
    case 'c': {
      if (v.is_string() && utf8_length(v.str()) == 1) return pad(v.str(), s, false);
      if (!v.is_int()) throw Error("%c requires int or char");
      if (v.as_int() < 0 || v.as_int() > 0x10FFFF) throw Error("%c arg not in range(0x110000)");
      std::string out;
      unicode::append_utf8(out, static_cast<char32_t>(v.as_int()));
      return pad(std::move(out), s, false);
    }
    default:
      throw Error(std::string("unsupported format character '") + s.conv + "'");
  }
}

// Parses the spec after a '%' at fmt[i] (i is past the '%'); leaves i on the conversion char.
Spec parse_spec(const std::string& fmt, size_t& i, Args& args, const Value** keyed) {
  Spec s;
  auto at_end = [&] {
    if (i >= fmt.size()) throw Error("incomplete format");
  };
  at_end();
  if (fmt[i] == '(') {
    int depth = 1;
    const size_t start = ++i;
    while (i < fmt.size() && depth > 0) {
      if (fmt[i] == '(') ++depth;
      if (fmt[i] == ')') --depth;
      ++i;
    }
    if (depth > 0) throw Error("incomplete format key");
    *keyed = &args.key(fmt.substr(start, i - 1 - start));
    at_end();
  }
  for (; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '-')
      s.left = true;
    else if (c == '+')
      s.plus = true;
    else if (c == ' ')
      s.space = true;
    else if (c == '#')
      s.alt = true;
    else if (c == '0')
      s.zero = true;
    else
      break;
  }
  at_end();
  auto number = [&](int64_t& out) {
    if (fmt[i] == '*') {
      out = star_arg(args);
      ++i;
      return;
    }
    if (!std::isdigit(static_cast<unsigned char>(fmt[i]))) return;
    out = 0;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
      out = std::min<int64_t>(out * 10 + (fmt[i++] - '0'), 1 << 24);
    }
  };
  number(s.width);
  if (s.width < -1) {  // a negative * width left-justifies
    s.left = true;
    s.width = -s.width;
  }
  at_end();
  if (fmt[i] == '.') {
    ++i;
    at_end();
    s.precision = 0;
    number(s.precision);
  }
  while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
  at_end();
  s.conv = fmt[i];
  return s;
}

}  // namespace

std::string percent_format(Interpreter& in, const std::string& fmt, const Value& values,
                           bool escape) {
  Args args(values);
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    ++i;
    const Value* keyed = nullptr;
    const Spec s = parse_spec(fmt, i, args, &keyed);
    if (s.conv == '%') {
      out += '%';
      continue;
    }
    std::string one = format_one(in, keyed ? *keyed : args.next(), s);
    // Markup % values escapes what str() / repr() of a value gives, not numbers.
    const bool text = s.conv == 's' || s.conv == 'r' || s.conv == 'a';
    out += escape && text ? html_escape(one) : one;
    in.check_size(out.size());
  }
  args.finish();
  return out;
}

}  // namespace bs::jinja
