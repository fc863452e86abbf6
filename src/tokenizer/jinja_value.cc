#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/unicode.h"

namespace bs::jinja {

namespace {

thread_local ContainerScope* tl_scope = nullptr;

// Drops the expired entries once the list has doubled since the last sweep, so a long render
// that makes many short-lived containers keeps the registry at about twice the live ones.
template <typename T>
void remember_in(std::vector<std::weak_ptr<T>>& list, const std::shared_ptr<T>& item) {
  if (list.size() >= 64 && list.size() == list.capacity()) {
    std::erase_if(list, [](const std::weak_ptr<T>& w) { return w.expired(); });
  }
  list.push_back(item);
}

// Nesting bound of the recursive value operations (repr, ==, <), tojson's bound too: Python stops
// at its recursion limit with RecursionError; a template nesting containers deeper gets a
// jinja::Error instead of a stack overflow.
constexpr int kMaxValueNesting = 200;
thread_local int tl_value_nesting = 0;

class NestingGuard {
 public:
  explicit NestingGuard(const char* operation) {
    if (++tl_value_nesting > kMaxValueNesting) {
      --tl_value_nesting;
      throw Error(std::string(operation) + ": nesting too deep");
    }
  }
  ~NestingGuard() { --tl_value_nesting; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

// The containers whose repr is being written, outermost first (Python's Py_ReprEnter): meeting
// one again means the value holds itself, and Python writes that inner occurrence as [...].
thread_local std::vector<const void*> tl_repr_open;

class ReprEntry {
 public:
  explicit ReprEntry(const void* container)
      : guard_("repr"),
        reentered_(std::find(tl_repr_open.begin(), tl_repr_open.end(), container) !=
                   tl_repr_open.end()) {
    if (!reentered_) tl_repr_open.push_back(container);
  }
  ~ReprEntry() {
    if (!reentered_) tl_repr_open.pop_back();
  }
  ReprEntry(const ReprEntry&) = delete;
  ReprEntry& operator=(const ReprEntry&) = delete;
  bool reentered() const { return reentered_; }

 private:
  NestingGuard guard_;
  bool reentered_;
};

// Moves a dict's keys and values to the end of `out`, leaving the dict empty.
void move_dict_items(std::vector<std::pair<Value, Value>>& items, std::vector<Value>& out) {
  for (auto& [k, v] : items) {
    out.push_back(std::move(k));
    out.push_back(std::move(v));
  }
  items.clear();
}

}  // namespace

void Value::hand_over_sole_items(std::vector<Value>& out) {
  if (list_ && list_.use_count() == 1) {
    for (auto& v : list_->items) out.push_back(std::move(v));
    list_->items.clear();
  }
  if (dict_ && dict_.use_count() == 1) move_dict_items(dict_->items, out);
}

bool Value::holds_sole_container() const {
  return (list_ && list_.use_count() == 1 && !list_->items.empty()) ||
         (dict_ && dict_.use_count() == 1 && !dict_->items.empty());
}

void Value::destroy_flat(std::vector<Value>& doomed) {
  while (!doomed.empty()) {
    Value last = std::move(doomed.back());
    doomed.pop_back();
    last.hand_over_sole_items(doomed);
  }  // `last` dies here holding no container with items only it reached
}

ListData::~ListData() {
  if (std::none_of(items.begin(), items.end(),
                   [](const Value& v) { return v.holds_sole_container(); })) {
    return;  // nothing nested dies with this list: the plain destructor recurses one level
  }
  Value::destroy_flat(items);
}

DictData::~DictData() {
  const auto dies_nested = [](const auto& kv) {
    return kv.first.holds_sole_container() || kv.second.holds_sole_container();
  };
  if (std::none_of(items.begin(), items.end(), dies_nested)) return;
  std::vector<Value> doomed;
  doomed.reserve(items.size() * 2);
  move_dict_items(items, doomed);
  Value::destroy_flat(doomed);
}

ContainerScope::ContainerScope() : outer_(tl_scope) { tl_scope = this; }

ContainerScope::~ContainerScope() {
  tl_scope = outer_;
  // Hold every survivor first: emptying one container may free others of the list.
  std::vector<std::shared_ptr<ListData>> lists;
  std::vector<std::shared_ptr<DictData>> dicts;
  for (const auto& w : lists_) {
    if (auto l = w.lock()) lists.push_back(std::move(l));
  }
  for (const auto& w : dicts_) {
    if (auto d = w.lock()) dicts.push_back(std::move(d));
  }
  for (const auto& l : lists) l->items.clear();
  for (const auto& d : dicts) d->items.clear();
}

void ContainerScope::remember(const std::shared_ptr<ListData>& list) {
  if (tl_scope != nullptr) remember_in(tl_scope->lists_, list);
}

void ContainerScope::remember(const std::shared_ptr<DictData>& dict) {
  if (tl_scope != nullptr) remember_in(tl_scope->dicts_, dict);
}

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (const auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::list(std::vector<Value> items, bool tuple) {
  Value v(Kind::kList);
  v.list_ = std::make_shared<ListData>(std::move(items), tuple);
  ContainerScope::remember(v.list_);
  return v;
}

Value Value::iterator(std::vector<Value> items, const char* type) {
  Value v = list(std::move(items));
  v.list_->iterator_type = type;
  return v;
}

Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  Value v(Kind::kDict);
  v.dict_ = std::make_shared<DictData>();
  ContainerScope::remember(v.dict_);
  for (auto& [k, x] : items) v.dict_->set(std::move(k), std::move(x));
  return v;
}

Value Value::namespace_object(std::vector<std::pair<Value, Value>> items) {
  Value v = dict(std::move(items));
  v.dict_->is_namespace = true;
  return v;
}

Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v(Kind::kFunc);
  v.func_ = std::make_shared<Function>(Function{std::move(name), std::move(fn)});
  return v;
}

bool Value::is_namespace() const { return kind_ == Kind::kDict && dict_->is_namespace; }
const std::vector<Value>& Value::items() const { return list_->items; }
bool Value::is_tuple() const { return kind_ == Kind::kList && list_->tuple; }
Value Value::group(Value grouper, Value list) {
  Value v = Value::list({std::move(grouper), std::move(list)}, /*tuple=*/true);
  v.list_->group = true;
  return v;
}
bool Value::is_group() const { return kind_ == Kind::kList && list_->group; }
bool Value::is_iterator() const { return kind_ == Kind::kList && list_->iterator_type; }
DictData& Value::dict_data() const { return *dict_; }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kList:
      return list_->iterator_type || !list_->items.empty();
    case Kind::kDict:
      return dict_->is_namespace || !dict_->items.empty();
    case Kind::kFunc:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      if (list_->iterator_type) return list_->iterator_type;
      return list_->tuple ? "tuple" : "list";
    case Kind::kDict:
      return dict_->is_namespace ? "Namespace" : "dict";
    case Kind::kFunc:
      return "function";
  }
  return "object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits in scientific form, then Python's layout: fixed notation for
  // exponents in [-4, 16), scientific ("1e+16", "1.5e-07") otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  const size_t e = s.find('e');
  std::string mant = s.substr(0, e);
  const int exp = std::stoi(s.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    const int point = exp + 1;  // digits before the decimal point
    if (point <= 0) {
      out.append("0.").append(static_cast<size_t>(-point), '0').append(digits);
    } else if (point >= static_cast<int>(digits.size())) {
      out.append(digits).append(point - digits.size(), '0').append(".0");
    } else {
      out.append(digits, 0, point).append(1, '.').append(digits, point, std::string::npos);
    }
  } else {
    out.append(digits, 0, 1);
    if (digits.size() > 1) out.append(1, '.').append(digits, 1, std::string::npos);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return str_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";  // repr(jinja2.Undefined()), e.g. inside a printed list
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return int_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return float_repr(float_);
    case Kind::kString:
      return repr_string(str_);
    case Kind::kList: {
      const ReprEntry entry(list_.get());
      if (entry.reentered()) return list_->tuple ? "(...)" : "[...]";
      std::string out = list_->tuple ? "(" : "[";
      for (size_t i = 0; i < list_->items.size(); ++i) {
        if (i) out += ", ";
        out += list_->items[i].repr();
      }
      if (list_->tuple && list_->items.size() == 1) out += ",";
      return out + (list_->tuple ? ")" : "]");
    }
    case Kind::kDict: {
      const ReprEntry entry(dict_.get());
      if (entry.reentered()) return dict_->is_namespace ? "<Namespace {...}>" : "{...}";
      std::string out = dict_->is_namespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (i) out += ", ";
        out += dict_->items[i].first.repr() + ": " + dict_->items[i].second.repr();
      }
      return out + (dict_->is_namespace ? "}>" : "}");
    }
    case Kind::kFunc:
      return "<function " + func_->name + ">";
  }
  return "";
}

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (py_equal(k, key)) return &v;
  }
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (py_equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

bool py_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  const NestingGuard guard("comparison");
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.str() == b.str();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto &x = a.items(), &y = b.items();
      if (&x == &y) return true;  // Python compares a container with itself by identity
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!py_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      const DictData &x = a.dict_data(), &y = b.dict_data();
      if (&x == &y) return true;
      if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (w == nullptr || !py_equal(v, *w)) return false;
      }
      return true;
    }
    case K::kFunc:
      return &a.func() == &b.func();
    default:
      return false;
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      return a.as_double() < b.as_double();
    }
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order = code points
  if (a.is_list() && b.is_list()) {
    const NestingGuard guard("comparison");
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i])) return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw Error("'<' not supported between instances of '" + a.type_name() + "' and '" +
              b.type_name() + "'");
}

namespace {

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    if (c >= 0x80 && ensure_ascii) {
      const char32_t cp = unicode::next_code_point(s, i);
      char b[16];
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += b;
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (c == 0x7f && ensure_ascii)) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

// A dict key as json.dumps writes it (keys are coerced to strings).
std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString:
      return k.str();
    case Value::Kind::kBool:
      return k.as_bool() ? "true" : "false";
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kInt:
      return std::to_string(k.as_int());
    case Value::Kind::kFloat:
      return json_float(k.as_double());
    default:
      throw Error("keys must be str, int, float, bool or None, not " + k.type_name());
  }
}

void json_value(const Value& v, const JsonOptions& opt, int depth, std::string& out) {
  if (depth > kMaxValueNesting) throw Error("tojson: nesting too deep");
  auto newline = [&](int level) {
    if (!opt.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *opt.indent;
  };
  // "[]" / "{}" when empty, else the items separated, one per line when indenting.
  auto container = [&](char open, char close, size_t n, const auto& write_item) {
    out += open;
    for (size_t i = 0; i < n; ++i) {
      if (i) out += opt.item_sep;
      newline(depth + 1);
      write_item(i);
    }
    if (n) newline(depth);
    out += close;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat:
      out += json_float(v.as_double());
      return;
    case Value::Kind::kString:
      json_string(v.str(), opt.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      if (v.is_iterator()) break;
      const auto& items = v.items();
      container('[', ']', items.size(),
                [&](size_t i) { json_value(items[i], opt, depth + 1, out); });
      return;
    }
    case Value::Kind::kDict: {
      if (v.is_namespace()) break;
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, x] : v.dict_data().items) items.emplace_back(json_key(k), &x);
      if (opt.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      container('{', '}', items.size(), [&](size_t i) {
        json_string(items[i].first, opt.ensure_ascii, out);
        out += opt.key_sep;
        json_value(*items[i].second, opt, depth + 1, out);
      });
      return;
    }
    default:
      break;
  }
  throw Error("Object of type " + v.type_name() + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(v, opt, 0, out);
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace bs::jinja
