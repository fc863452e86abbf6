#include "tokenizer/jinja_interp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "tokenizer/unicode.h"

namespace bs::jinja {
namespace {

[[noreturn]] void fail_undefined(const Value& v) {
  if (!v.str().empty() && v.str()[0] == '\x01') throw Error(v.str().substr(1));  // because
  throw Error(v.str().empty() ? std::string("value is undefined")
                              : "'" + v.str() + "' is undefined");
}

[[noreturn]] void fail_operands(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  throw Error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
              b.type_name() + "'");
}

bool is_numeric(const Value& v) { return v.is_number(); }

// Python slice indices of a sequence of length n.
std::vector<int64_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v,
                                   const Value& step_v) {
  auto as_index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (v.is_int() || v.is_bool()) return v.as_int();
    throw Error("slice indices must be integers or None");
  };
  const int64_t step = as_index(step_v).value_or(1);
  if (step == 0) throw Error("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t def) {
    if (!x) return def;
    int64_t i = *x;
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = clamp(as_index(start_v), step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(as_index(stop_v), step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  return out;
}

// Byte offsets of each code point of valid UTF-8 text, plus the end.
std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> off;
  off.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); i += unicode::utf8_len(static_cast<unsigned char>(s[i]))) {
    off.push_back(i);
  }
  off.push_back(s.size());
  return off;
}

// a op b for op in + - *, throwing on overflow (Python ints do not overflow; ours are 64-bit).
int64_t checked(char op, int64_t a, int64_t b) {
  int64_t r;
  const bool overflow = op == '+'   ? __builtin_add_overflow(a, b, &r)
                        : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                    : __builtin_mul_overflow(a, b, &r);
  if (overflow) throw Error("integer overflow");
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw Error("integer division or modulo by zero");
  if (a == std::numeric_limits<int64_t>::min() && b == -1) throw Error("integer overflow");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kString: {
      std::vector<Value> out;
      const std::string& s = v.str();
      const auto off = code_point_offsets(s);
      for (size_t i = 0; i + 1 < off.size(); ++i)
        out.emplace_back(s.substr(off[i], off[i + 1] - off[i]));
      return out;
    }
    case Value::Kind::kDict:
      if (!v.is_namespace()) {
        std::vector<Value> out;
        for (const auto& kv : v.dict_data().items) out.push_back(kv.first);
        return out;
      }
      [[fallthrough]];
    default:
      throw Error("'" + v.type_name() + "' object is not iterable");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        throw Error("'in <string>' requires string as left operand, not " + item.type_name());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& x : container.items()) {
        if (py_equal(x, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (!container.is_namespace()) return container.dict_data().find(item) != nullptr;
      [[fallthrough]];
    default:
      throw Error("argument of type '" + container.type_name() + "' is not iterable");
  }
}

namespace {

bool is_dict_method(const std::string& name) {
  return name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy" ||
         name == "pop" || name == "update" || name == "setdefault" || name == "clear" ||
         name == "popitem";
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (!name.empty() && name[0] == '_') return Value::undefined(name);  // sandbox: no internals
  if (obj.is_dict()) {
    if (!obj.is_namespace() && is_dict_method(name)) return get_method(obj, name);
    const Value* v = obj.dict_data().find(Value(name));
    return v ? *v : Value::undefined(name);
  }
  if (obj.is_group() && (name == "grouper" || name == "list")) {
    return obj.items()[name == "grouper" ? 0 : 1];
  }
  if (obj.is_string() || obj.is_list()) return get_method(obj, name);
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict()) {
    const Value* v = obj.dict_data().find(key);
    if (v) return *v;
    return key.is_string() ? get_attr(obj, key.str()) : Value::undefined();
  }
  if (obj.is_iterator()) return Value::undefined();  // a generator is not subscriptable
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      return obj.items()[i];
    }
    const auto off = code_point_offsets(obj.str());
    const int64_t n = static_cast<int64_t>(off.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined();
    return Value(obj.str().substr(off[i], off[i + 1] - off[i]));
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined();
}

Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.to_str() + b.to_str();
    in.check_size(s.size());
    return Value(std::move(s));
  }
  const bool num = is_numeric(a) && is_numeric(b);
  const bool flt = num && (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat);
  if (op == "+") {
    if (num) {
      if (flt) return Value(a.as_double() + b.as_double());
      return Value(checked('+', a.as_int(), b.as_int()));
    }
    if (a.is_string() && b.is_string()) {
      in.check_size(a.str().size() + b.str().size());
      if (a.is_markup() || b.is_markup()) {  // Markup + str escapes the str, and vice versa
        std::string s = (a.is_markup() ? a.str() : html_escape(a.str())) +
                        (b.is_markup() ? b.str() : html_escape(b.str()));
        in.check_size(s.size());
        return Value::markup(std::move(s));
      }
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_iterator() &&
        !b.is_iterator()) {
      in.check_list(a.items().size() + b.items().size());
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (a.is_string() && !b.is_undefined() && !a.is_undefined()) {
      throw Error("can only concatenate str (not \"" + b.type_name() + "\") to str");
    }
    fail_operands(op, a, b);
  }
  if (op == "-") {
    if (!num) fail_operands(op, a, b);
    if (flt) return Value(a.as_double() - b.as_double());
    return Value(checked('-', a.as_int(), b.as_int()));
  }
  if (op == "*") {
    if (num) {
      if (flt) return Value(a.as_double() * b.as_double());
      return Value(checked('*', a.as_int(), b.as_int()));
    }
    const Value* seq = a.is_string() || a.is_list() ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || (seq->is_list() && !seq->is_iterator())) &&
        (count->is_int() || count->is_bool())) {
      const int64_t n = std::max<int64_t>(0, count->as_int());
      if (seq->is_string()) {
        if (n > 0 && seq->str().size() > 0)
          in.check_size(seq->str().size() * std::min<int64_t>(n, 1LL << 40));
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq->str();
        return seq->is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
      }
      in.check_list(n > 0 && !seq->items().empty()
                        ? static_cast<size_t>(std::min<int64_t>(n, 1LL << 40)) * seq->items().size()
                        : 0);
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i)
        items.insert(items.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(items), seq->is_tuple());
    }
    fail_operands(op, a, b);
  }
  if (!num) {
    if (op == "%" && a.is_string()) {
      std::string s = percent_format(in, a.str(), b, a.is_markup());
      return a.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
    }
    fail_operands(op, a, b);
  }
  if (op == "/") {
    if (b.as_double() == 0) throw Error("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (flt) {
      if (b.as_double() == 0) throw Error("float floor division by zero");
      return Value(std::floor(a.as_double() / b.as_double()));
    }
    return Value(floor_div(a.as_int(), b.as_int()));
  }
  if (op == "%") {
    if (flt) {
      const double x = a.as_double(), y = b.as_double();
      if (y == 0) throw Error("float modulo");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
    const int64_t q = floor_div(a.as_int(), b.as_int());
    return Value(a.as_int() - q * b.as_int());
  }
  if (op == "**") {
    if (!flt && b.as_int() >= 0) {
      const int64_t base = a.as_int(), exp = b.as_int();
      if (exp == 0) return Value(int64_t{1});
      if (base == 0 || base == 1) return Value(base);
      if (base == -1) return Value(int64_t{exp % 2 ? -1 : 1});
      int64_t result = 1;  // |base| >= 2: overflows within 63 steps
      for (int64_t e = exp; e > 0; --e) result = checked('*', result, base);
      return Value(result);
    }
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  throw Error("unknown operator " + op);
}

// ---- Interpreter ----

Interpreter::DepthGuard::DepthGuard(Interpreter& in, int line) : in(in) {
  if (++in.depth_ > in.options_.max_depth) {
    --in.depth_;
    throw Error("maximum recursion depth exceeded", line);
  }
}

Interpreter::Interpreter(const Template& tmpl, const RenderOptions& options)
    : tmpl_(tmpl), options_(options) {}

void Interpreter::charge(int64_t steps) {
  steps_ += steps;
  if (steps_ > options_.max_steps) {
    throw Error("template exceeded its evaluation budget (" + std::to_string(options_.max_steps) +
                " steps)");
  }
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > options_.max_output) {
    throw Error("template output exceeds " + std::to_string(options_.max_output) + " bytes");
  }
}

void Interpreter::check_list(size_t n) {
  constexpr size_t kMaxList = 1'000'000;
  if (n > kMaxList) throw Error("list longer than " + std::to_string(kMaxList) + " items");
  charge(static_cast<int64_t>(n) * 4);
}

std::tm Interpreter::now() const {
  if (options_.now) return options_.now();
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

std::string Interpreter::run(const std::vector<std::pair<std::string, Value>>& vars) {
  for (auto& [k, v] : builtin_globals()) globals_.vars[k] = std::move(v);
  Frame root;
  root.parent = &globals_;
  for (const auto& [k, v] : vars) root.vars[k] = v;
  root_ = &root;
  std::string out;
  render_body(tmpl_.body, root, out);
  root_ = nullptr;
  return out;
}

Interpreter::Flow Interpreter::render_body(const Body& body, Frame& frame, std::string& out) {
  for (const auto& n : body) {
    const Flow f = render_node(*n, frame, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::render_node(const Node& n, Frame& frame, std::string& out) {
  DepthGuard guard(*this, n.line);
  charge(1);
  try {
    switch (n.kind) {
      case Node::Kind::kText:
        out += n.text;
        break;
      case Node::Kind::kOutput:
        out += eval(*n.expr, frame).to_str();
        break;
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (eval(*cond, frame).truthy()) return render_body(body, frame, out);
        }
        return render_body(n.else_body, frame, out);
      case Node::Kind::kFor:
        return render_for(n, frame, out);
      case Node::Kind::kSet:
        assign(n, eval(*n.expr, frame), frame);
        break;
      case Node::Kind::kSetBlock: {
        std::string s;
        render_body(n.body, frame, s);
        frame.vars[n.targets[0]] = Value(std::move(s));
        break;
      }
      case Node::Kind::kMacro:
        frame.vars[n.text] = make_macro(n, frame);
        break;
      case Node::Kind::kCallBlock: {
        const Node* node = &n;
        std::shared_ptr<Frame> scope = capture(frame);
        Value caller = Value::function("caller", [this, node, scope](Interpreter&, CallArgs& a) {
          Frame f;
          f.parent = scope ? scope.get() : root_;
          for (size_t i = 0; i < node->params.size(); ++i) {
            const Value* v = a.get(i, node->params[i].first);
            f.vars[node->params[i].first] = v ? *v
                                            : node->params[i].second
                                                ? eval(*node->params[i].second, f)
                                                : Value::undefined(node->params[i].first);
          }
          std::string s;
          render_body(node->body, f, s);
          return Value(std::move(s));
        });
        const Expr& call = *n.expr;
        const Value fn = eval(*call.args[0], frame);
        CallArgs args = eval_args(call, 1, frame);
        args.kw.emplace_back("caller", std::move(caller));
        out += this->call(fn, args, n.line).to_str();
        break;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kFilterBlock: {  // the body rendered in its own scope, then filtered
        Frame f;
        f.parent = &frame;
        std::string body;
        render_body(n.body, f, body);
        f.vars[kFilterBlockInput] = Value(std::move(body));
        out += eval(*n.expr, f).to_str();
        break;
      }
      case Node::Kind::kScope: {
        if (!n.new_scope) return render_body(n.body, frame, out);
        Frame f;
        f.parent = &frame;
        for (const auto& [name, e] : n.params) f.vars[name] = eval(*e, frame);
        return render_body(n.body, f, out);
      }
    }
  } catch (Error& e) {
    if (e.line == 0) e.line = n.line;
    throw;
  }
  check_size(out.size());
  return Flow::kNormal;
}

namespace {

// The targets of a parenthesized group "(a,(b,c))" or "(a,)" (jinja_parser.cc's expect_target).
std::vector<std::string> group_targets(const std::string& group) {
  std::vector<std::string> out(1);
  int depth = 0;
  for (size_t i = 1; i + 1 < group.size(); ++i) {
    const char c = group[i];
    if (c == ',' && depth == 0) {
      out.emplace_back();
      continue;
    }
    depth += c == '(' ? 1 : c == ')' ? -1 : 0;
    out.back() += c;
  }
  if (out.size() > 1 && out.back().empty()) out.pop_back();  // "(a,)"
  return out;
}

// Unpacks `item` into `targets` (Python's `a, (b, c) = item`).
void unpack_targets(const std::vector<std::string>& targets, const Value& item,
                    std::unordered_map<std::string, Value>& vars) {
  const std::vector<Value> parts = iterate(item);
  if (parts.size() != targets.size()) {
    throw Error(parts.size() > targets.size()
                    ? "too many values to unpack (expected " + std::to_string(targets.size()) + ")"
                    : "not enough values to unpack (expected " + std::to_string(targets.size()) +
                          ", got " + std::to_string(parts.size()) + ")");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i][0] == '(') {
      unpack_targets(group_targets(targets[i]), parts[i], vars);
    } else {
      vars[targets[i]] = parts[i];
    }
  }
}

void bind_targets(const std::vector<std::string>& targets, const Value& item,
                  std::unordered_map<std::string, Value>& vars) {
  if (targets.size() == 1 && targets[0][0] != '(') {
    vars[targets[0]] = item;
  } else if (targets.size() == 1) {
    unpack_targets(group_targets(targets[0]), item, vars);
  } else {
    unpack_targets(targets, item, vars);
  }
}

}  // namespace

Interpreter::Flow Interpreter::render_for(const Node& n, Frame& frame, std::string& out) {
  std::vector<Value> items = iterate(eval(*n.expr, frame));
  if (n.filter) {
    std::vector<Value> kept;
    for (Value& item : items) {
      charge(1);
      Frame f;
      f.parent = &frame;
      bind_targets(n.targets, item, f.vars);
      if (eval(*n.filter, f).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return render_body(n.else_body, frame, out);
  const int64_t len = static_cast<int64_t>(items.size());
  // loop.changed(*values): whether the values differ from those of its previous call.
  auto last_changed = std::make_shared<std::optional<std::vector<Value>>>();
  const Value changed = Value::function("changed", [last_changed](Interpreter&, CallArgs& a) {
    const auto& last = *last_changed;
    const bool same = last && last->size() == a.pos.size() &&
                      std::equal(a.pos.begin(), a.pos.end(), last->begin(), py_equal);
    if (!same) *last_changed = a.pos;
    return Value(!same);
  });
  for (int64_t i = 0; i < len; ++i) {
    charge(4);  // an iteration builds a frame and the loop object
    Frame f;
    f.parent = &frame;
    bind_targets(n.targets, items[i], f.vars);
    std::vector<std::pair<Value, Value>> loop = {
        {"index", Value(i + 1)},
        {"index0", Value(i)},
        {"revindex", Value(len - i)},
        {"revindex0", Value(len - i - 1)},
        {"first", Value(i == 0)},
        {"last", Value(i == len - 1)},
        {"length", Value(len)},
        {"depth", Value(1)},
        {"depth0", Value(0)},
        {"previtem", i > 0 ? items[i - 1] : Value::undefined("previtem")},
        {"nextitem", i + 1 < len ? items[i + 1] : Value::undefined("nextitem")},
        {"cycle", Value::function("cycle",
                                  [i](Interpreter&, CallArgs& a) {
                                    if (a.pos.empty()) throw Error("no items for cycling given");
                                    return a.pos[static_cast<size_t>(i) % a.pos.size()];
                                  })},
        {"changed", changed}};
    f.vars["loop"] = Value::dict(std::move(loop));
    const Flow flow = render_body(n.body, f, out);
    if (flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interpreter::assign(const Node& n, Value v, Frame& frame) {
  if (!n.attr.empty()) {
    const Value* ns = lookup(n.targets[0], frame);
    if (ns == nullptr || !ns->is_namespace()) {
      throw Error("cannot assign attribute on non-namespace object", n.line);
    }
    ns->dict_data().set(Value(n.attr), std::move(v));
    return;
  }
  bind_targets(n.targets, v, frame.vars);
}

const Value* Interpreter::lookup(const std::string& name, Frame& frame) const {
  for (const Frame* f = &frame; f != nullptr; f = f->parent) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return &it->second;
  }
  return nullptr;
}

// The variables a macro or caller body sees besides its arguments: those of the scope it was
// defined in. Top-level variables are read when it runs (Jinja2 resolves them in the context);
// those of enclosing loops and macros are copied now, so a macro that outlives its scope (stored
// in a namespace) never reads a dead frame. nullptr at top level.
std::shared_ptr<Interpreter::Frame> Interpreter::capture(Frame& frame) {
  if (&frame == root_) return nullptr;
  auto scope = std::make_shared<Frame>();
  for (Frame* f = &frame; f != nullptr && f != root_; f = f->parent) {
    charge(static_cast<int64_t>(f->vars.size()));
    for (const auto& [k, v] : f->vars) scope->vars.emplace(k, v);  // inner scopes win
  }
  scope->parent = root_;
  return scope;
}

namespace {

bool uses_name(const Expr* e, std::string_view name) {
  if (e == nullptr) return false;
  if (e->kind == Expr::Kind::kName && e->name == name) return true;
  for (const ExprPtr& a : e->args) {
    if (uses_name(a.get(), name)) return true;
  }
  for (const auto& [k, a] : e->kwargs) {
    if (uses_name(a.get(), name)) return true;
  }
  return false;
}

// Whether a macro body reads `name` (Jinja2 gives a macro varargs / kwargs only then).
bool uses_name(const Body& body, std::string_view name) {
  for (const auto& n : body) {
    if (uses_name(n->expr.get(), name) || uses_name(n->filter.get(), name) ||
        uses_name(n->body, name) || uses_name(n->else_body, name)) {
      return true;
    }
    for (const auto& [cond, b] : n->branches) {
      if (uses_name(cond.get(), name) || uses_name(b, name)) return true;
    }
    for (const auto& [k, x] : n->params) {
      if (uses_name(x.get(), name)) return true;
    }
  }
  return false;
}

}  // namespace

// A macro: positional and keyword arguments bind its parameters (defaults evaluated per call);
// extra positional ones go to `varargs` and unknown keywords to `kwargs` when the body reads
// them, else they are an error, as in Jinja2.
Value Interpreter::make_macro(const Node& n, Frame& frame) {
  const Node* node = &n;
  const bool varargs = uses_name(n.body, "varargs");
  const bool kwargs = uses_name(n.body, "kwargs");
  std::shared_ptr<Frame> scope = capture(frame);
  return Value::function(n.text, [this, node, varargs, kwargs, scope](Interpreter&, CallArgs& a) {
    DepthGuard guard(*this, node->line);
    const size_t n_params = node->params.size();
    if (a.pos.size() > n_params && !varargs) {
      throw Error("macro '" + node->text + "' takes not more than " + std::to_string(n_params) +
                  " argument(s)");
    }
    Frame f;
    f.parent = scope ? scope.get() : root_;
    std::vector<std::pair<Value, Value>> extra_kw;
    for (const auto& [k, v] : a.kw) {
      // A parameter already given by position takes no keyword (Jinja2 reports it as unknown).
      bool known = k == "caller";
      for (size_t i = a.pos.size(); i < n_params; ++i) known = known || node->params[i].first == k;
      if (!known && !kwargs) {
        throw Error("macro '" + node->text + "' takes no keyword argument '" + k + "'");
      }
      if (known) {
        f.vars[k] = v;
      } else {
        extra_kw.emplace_back(Value(k), v);
      }
    }
    for (size_t i = 0; i < n_params; ++i) {
      const auto& [name, def] = node->params[i];
      if (i < a.pos.size()) {
        f.vars[name] = a.pos[i];
      } else if (!f.vars.count(name)) {
        f.vars[name] = def ? eval(*def, f) : Value::undefined(name);
      }
    }
    if (varargs) {
      std::vector<Value> rest;
      for (size_t i = n_params; i < a.pos.size(); ++i) rest.push_back(a.pos[i]);
      f.vars["varargs"] = Value::list(std::move(rest), /*tuple=*/true);
    }
    if (kwargs) f.vars["kwargs"] = Value::dict(std::move(extra_kw));
    std::string s;
    render_body(node->body, f, s);
    return Value(std::move(s));
  });
}

Value Interpreter::call(const Value& fn, CallArgs& args, int line) {
  if (fn.is_func()) return fn.func().call(*this, args);
  if (fn.is_undefined()) fail_undefined(fn);
  throw Error("'" + fn.type_name() + "' object is not callable", line);
}

Value Interpreter::filter(const std::string& name, const Value& input, CallArgs& args, int line) {
  try {
    return apply_filter(*this, name, input, args);
  } catch (Error& e) {
    if (e.line == 0) e.line = line;
    throw;
  }
}

bool Interpreter::test(const std::string& name, const Value& v, CallArgs& args, int line) {
  try {
    return apply_test(*this, name, v, args);
  } catch (Error& e) {
    if (e.line == 0) e.line = line;
    throw;
  }
}

CallArgs Interpreter::eval_args(const Expr& e, size_t first, Frame& frame) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i], frame));
  for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x, frame));
  return a;
}

Value Interpreter::eval(const Expr& e, Frame& frame) {
  DepthGuard guard(*this, e.line);
  charge(1);
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName: {
      const Value* v = lookup(e.name, frame);
      return v ? *v : Value::undefined(e.name);
    }
    case Expr::Kind::kList: {
      std::vector<Value> items;
      for (const auto& x : e.args) items.push_back(eval(*x, frame));
      return Value::list(std::move(items), e.tuple);
    }
    case Expr::Kind::kDict: {
      std::vector<std::pair<Value, Value>> items;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        items.emplace_back(eval(*e.args[i], frame), eval(*e.args[i + 1], frame));
      }
      return Value::dict(std::move(items));
    }
    case Expr::Kind::kAttr:
      return get_attr(eval(*e.args[0], frame), e.name);
    case Expr::Kind::kItem: {
      const Value obj = eval(*e.args[0], frame);
      return get_item(obj, eval(*e.args[1], frame));
    }
    case Expr::Kind::kSlice: {
      const Value obj = eval(*e.args[0], frame);
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        if (e.args[k + 1]) parts[k] = eval(*e.args[k + 1], frame);
      }
      if (obj.is_iterator()) throw Error("'" + obj.type_name() + "' object is not subscriptable");
      if (obj.is_list()) {
        std::vector<Value> items;
        for (int64_t i : slice_indices(static_cast<int64_t>(obj.items().size()), parts[0], parts[1],
                                       parts[2])) {
          items.push_back(obj.items()[i]);
        }
        return Value::list(std::move(items), obj.is_tuple());
      }
      if (obj.is_string()) {
        const auto off = code_point_offsets(obj.str());
        std::string s;
        for (int64_t i :
             slice_indices(static_cast<int64_t>(off.size()) - 1, parts[0], parts[1], parts[2])) {
          s.append(obj.str(), off[i], off[i + 1] - off[i]);
        }
        return Value(std::move(s));
      }
      if (obj.is_undefined()) fail_undefined(obj);
      return Value::undefined();
    }
    case Expr::Kind::kCall: {
      const Value fn = eval(*e.args[0], frame);
      CallArgs args = eval_args(e, 1, frame);
      try {
        return call(fn, args, e.line);
      } catch (Error& err) {
        if (err.line == 0) err.line = e.line;
        throw;
      }
    }
    case Expr::Kind::kFilter: {
      const Value input = eval(*e.args[0], frame);
      CallArgs args = eval_args(e, 1, frame);
      return filter(e.name, input, args, e.line);
    }
    case Expr::Kind::kTest: {
      if (!has_test(e.name)) throw Error("no test named '" + e.name + "'", e.line);
      const Value v = eval(*e.args[0], frame);
      CallArgs args = eval_args(e, 1, frame);
      return Value(test(e.name, v, args, e.line) != e.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      const Value v = eval(*e.args[0], frame);
      if (!v.is_number()) {
        if (v.is_undefined()) fail_undefined(v);
        throw Error("bad operand type for unary " +
                        std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" +
                        v.type_name() + "'",
                    e.line);
      }
      if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value(v.as_int()) : v;
      if (v.kind() == Value::Kind::kFloat) return Value(-v.as_double());
      return Value(checked('-', 0, v.as_int()));
    }
    case Expr::Kind::kNot:
      return Value(!eval(*e.args[0], frame).truthy());
    case Expr::Kind::kBinary: {
      const Value a = eval(*e.args[0], frame);
      const Value b = eval(*e.args[1], frame);
      try {
        return binary_op(*this, e.name, a, b);
      } catch (Error& err) {
        if (err.line == 0) err.line = e.line;
        throw;
      }
    }
    case Expr::Kind::kCompare: {
      Value left = eval(*e.args[0], frame);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], frame);
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==")
          r = py_equal(left, right);
        else if (op == "!=")
          r = !py_equal(left, right);
        else if (op == "<")
          r = py_less(left, right);
        else if (op == ">")
          r = py_less(right, left);
        else if (op == "<=")
          r = py_less(left, right) || py_equal(left, right);
        else if (op == ">=")
          r = py_less(right, left) || py_equal(left, right);
        else if (op == "in")
          r = contains(right, left);
        else
          r = !contains(right, left);
        if (!r) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0], frame);
      return a.truthy() ? eval(*e.args[1], frame) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0], frame);
      return a.truthy() ? a : eval(*e.args[1], frame);
    }
    case Expr::Kind::kCond:
      if (eval(*e.args[0], frame).truthy()) return eval(*e.args[1], frame);
      return e.args[2] ? eval(*e.args[2], frame) : Value::undefined();
  }
  return Value::undefined();
}

std::string render(const Template& tmpl, const std::vector<std::pair<std::string, Value>>& vars,
                   const RenderOptions& options) {
  const ContainerScope containers;  // declared first: it empties them after the interpreter ends
  Interpreter in(tmpl, options);
  return in.run(vars);
}

}  // namespace bs::jinja
