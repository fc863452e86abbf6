// Values of the chat-template interpreter (jinja_*.h): the Python objects a Jinja2 template sees
// (None, bool, int, float, str, list/tuple, dict, namespace, callables) plus Jinja's Undefined,
// with Python's semantics for truthiness, equality, ordering, str() and repr(), and json.dumps.
// Internal to src/tokenizer; errors inside the interpreter are thrown as jinja::Error and turned
// into a Status at the ChatTemplate boundary.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bs::jinja {

// A template error (syntax, type error, raise_exception, limit exceeded). `line` is 0 when unknown.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int line = 0) : std::runtime_error(what), line(line) {}
  int line;
};

class Value;
struct ListData;
struct DictData;
struct Function;
class Interpreter;

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Argument `i` by position or `name` by keyword; nullptr when not given.
  const Value* get(size_t i, std::string_view name) const;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kFunc
  };

  Value() = default;  // Undefined
  static Value undefined(std::string name = "") {
    Value v;
    v.str_ = std::move(name);
    return v;
  }
  // An Undefined that stands for `message` when used (the sandbox's unsafe attributes: not
  // defined, and calling one fails with why), held as the name with a leading '\x01'.
  static Value undefined_because(const std::string& message) { return undefined("\x01" + message); }
  static Value none() { return Value(Kind::kNone); }
  Value(bool b) : kind_(Kind::kBool), int_(b) {}                      // NOLINT: implicit by design
  Value(int v) : kind_(Kind::kInt), int_(v) {}                        // NOLINT
  Value(int64_t v) : kind_(Kind::kInt), int_(v) {}                    // NOLINT
  Value(double v) : kind_(Kind::kFloat), float_(v) {}                 // NOLINT
  Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}  // NOLINT
  Value(const char* s) : kind_(Kind::kString), str_(s) {}             // NOLINT
  // markupsafe's Markup: a str marked safe (the safe and escape filters). Concatenating plain text
  // to it with + escapes that text (&, <, >, ", ' become entities), as Markup.__add__ does.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  static Value list(std::vector<Value> items, bool tuple = false);
  // What Jinja2's map / select / reject / selectattr / rejectattr / items / batch / slice
  // filters return: a generator (reverse: a list_reverseiterator), held here as its items. Unlike
  // a list it is always true, has no len(), cannot be indexed, added or turned into JSON.
  static Value iterator(std::vector<Value> items, const char* type = "generator");
  static Value dict(std::vector<std::pair<Value, Value>> items = {});
  static Value namespace_object(std::vector<std::pair<Value, Value>> items = {});
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
  // JSON (input conversion): objects keep the key order of the JSON type (nlohmann::json sorts
  // keys, nlohmann::ordered_json keeps the document's order, as Python's json does).
  template <typename Json>
  static Value from_json(const Json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }  // bool excluded
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return markup_; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const;
  bool is_func() const { return kind_ == Kind::kFunc; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // int or bool
  double as_double() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return str_; }  // string value, or Undefined's name
  const std::vector<Value>& items() const;         // list
  bool is_tuple() const;
  bool is_iterator() const;  // a generator / iterator (Value::iterator)
  bool is_group() const;     // a tuple made by group()
  // groupby's result item: the tuple (grouper, list) whose attributes .grouper / .list are those.
  static Value group(Value grouper, Value list);
  DictData& dict_data() const;
  const Function& func() const { return *func_; }

  bool truthy() const;
  // Python str(): what {{ value }} prints (Undefined prints as "").
  std::string to_str() const;
  // Python repr().
  std::string repr() const;
  std::string type_name() const;

 private:
  friend struct ListData;
  friend struct DictData;
  explicit Value(Kind k) : kind_(k) {}
  // Destruction without a recursion per level of nesting: a container's destructor hands the
  // items of every container that dies with it to one loop (destroy_flat), so freeing a chain
  // nested a million deep does not overflow the stack.
  bool holds_sole_container() const;  // the only owner of a list or dict with items
  void hand_over_sole_items(std::vector<Value>& out);
  static void destroy_flat(std::vector<Value>& doomed);
  Kind kind_ = Kind::kUndefined;
  bool markup_ = false;  // kString: a Markup
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<Function> func_;
};

// While one is alive on a thread, every list and dict made on that thread is remembered, and
// the scope's end empties those still alive. A template can build a reference cycle
// (`{% set ns.a = ns %}`, `{% do l.append(l) %}`) that shared ownership alone never frees;
// emptying the containers breaks every cycle. render() holds one for the whole render.
class ContainerScope {
 public:
  ContainerScope();
  ~ContainerScope();
  ContainerScope(const ContainerScope&) = delete;
  ContainerScope& operator=(const ContainerScope&) = delete;
  // Called by Value::list / Value::dict.
  static void remember(const std::shared_ptr<ListData>& list);
  static void remember(const std::shared_ptr<DictData>& dict);

 private:
  std::vector<std::weak_ptr<ListData>> lists_;
  std::vector<std::weak_ptr<DictData>> dicts_;
  ContainerScope* outer_;
};

// Containers free nested containers in a loop, not a recursion (Value::destroy_flat).
struct ListData {
  ListData() = default;
  ListData(std::vector<Value> items, bool tuple) : items(std::move(items)), tuple(tuple) {}
  ~ListData();
  ListData(const ListData&) = delete;
  ListData& operator=(const ListData&) = delete;
  std::vector<Value> items;
  bool tuple = false;
  const char* iterator_type = nullptr;  // Value::iterator: "generator", ...
  bool group = false;  // groupby's (grouper, list) tuple, with those two attributes
};

// Insertion-ordered dict (Python 3.7+); namespaces are dicts with is_namespace set.
struct DictData {
  DictData() = default;
  ~DictData();
  DictData(const DictData&) = delete;
  DictData& operator=(const DictData&) = delete;
  std::vector<std::pair<Value, Value>> items;
  bool is_namespace = false;
  const Value* find(const Value& key) const;
  void set(Value key, Value value);
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> call;
};

template <typename Json>
inline Value Value::from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::detail::value_t::null:
      return none();
    case nlohmann::detail::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::detail::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::detail::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::detail::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::detail::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::detail::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::detail::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        items.emplace_back(Value(it.key()), from_json(it.value()));
      }
      return dict(std::move(items));
    }
    default:
      return undefined();
  }
}

// Python ==.
bool py_equal(const Value& a, const Value& b);
// Python <; throws Error on unorderable types.
bool py_less(const Value& a, const Value& b);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
// Python json.dumps; throws Error for values JSON cannot hold (Undefined, functions).
std::string to_json(const Value& v, const JsonOptions& opt);

// markupsafe.escape of text: & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(std::string_view s);

// Python float repr ("1.0", "1e+20", "1.5e-07", "inf", "nan").
std::string float_repr(double d);

}  // namespace bs::jinja
