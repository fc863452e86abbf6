// Tree-walking interpreter of a parsed Jinja template (jinja_parser.h) with the semantics of
// Jinja2's ImmutableSandboxedEnvironment as transformers configures it for chat templates
// (globals raise_exception / strftime_now, tojson = json.dumps). Builtin filters, tests and the
// Python str/dict/list methods templates call live in jinja_builtins.cc.
//
// Limits keep hostile templates from hanging or crashing the process: nesting depth of
// evaluation (macro recursion included), a budget of evaluation steps, and the output size.
// Every failure throws jinja::Error.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_value.h"

namespace bs::jinja {

struct RenderOptions {
  // The local time strftime_now formats; defaults to the system clock.
  std::function<std::tm()> now;
  int max_depth = 500;            // nested evaluation frames
  int64_t max_steps = 5'000'000;  // evaluation steps (nodes, loop iterations, list items)
  size_t max_output = 64u << 20;  // bytes of rendered text (and of any one string)
};

// Renders `tmpl` with the template variables `vars`. Throws jinja::Error.
std::string render(const Template& tmpl, const std::vector<std::pair<std::string, Value>>& vars,
                   const RenderOptions& options = {});

class Interpreter {
 public:
  Interpreter(const Template& tmpl, const RenderOptions& options);

  std::string run(const std::vector<std::pair<std::string, Value>>& vars);

  // For builtins: call a callable value, apply a filter or test by name, charge work.
  Value call(const Value& fn, CallArgs& args, int line);
  Value filter(const std::string& name, const Value& input, CallArgs& args, int line);
  bool test(const std::string& name, const Value& v, CallArgs& args, int line);
  void charge(int64_t steps);
  // Checks the size of a string being built (strings, joins, repeats).
  void check_size(size_t bytes) const;
  // Checks and charges the length of a list being built (concatenation, repetition).
  void check_list(size_t n);
  std::tm now() const;

 private:
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    Frame* parent = nullptr;
  };
  enum class Flow { kNormal, kBreak, kContinue };

  Flow render_body(const Body& body, Frame& frame, std::string& out);
  Flow render_node(const Node& n, Frame& frame, std::string& out);
  Flow render_for(const Node& n, Frame& frame, std::string& out);
  Value eval(const Expr& e, Frame& frame);
  Value eval_call(const Expr& e, Frame& frame);
  CallArgs eval_args(const Expr& e, size_t first, Frame& frame);
  Value make_macro(const Node& n, Frame& frame);
  std::shared_ptr<Frame> capture(Frame& frame);
  const Value* lookup(const std::string& name, Frame& frame) const;
  void assign(const Node& n, Value v, Frame& frame);

  struct DepthGuard {
    explicit DepthGuard(Interpreter& in, int line);
    ~DepthGuard() { --in.depth_; }
    Interpreter& in;
  };

  const Template& tmpl_;
  RenderOptions options_;
  Frame globals_;
  Frame* root_ = nullptr;
  int depth_ = 0;
  int64_t steps_ = 0;
};

// jinja_builtins.cc
Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
bool has_test(const std::string& name);
bool has_filter(const std::string& name);
// A bound method of a str / dict / list value (`"a".upper`), or Undefined when there is none.
Value get_method(const Value& obj, const std::string& name);
// Globals: range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> builtin_globals();

// Python semantics shared by the interpreter and the builtins.
Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);  // Python `item in container`
// Jinja's getattr / getitem: Undefined when missing; throws on an Undefined receiver.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// Items of an iterable (list, tuple, str by code point, dict keys); Undefined gives none.
std::vector<Value> iterate(const Value& v);
// Python's printf-style `fmt % values` (jinja_format.cc): a tuple gives the positional values, a
// dict the %(name) ones, anything else is the one value. `escape` (Markup % values) HTML-escapes
// the text of %s / %r / %a conversions.
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& values,
                           bool escape = false);
// Code-point length of UTF-8 text.
size_t utf8_length(std::string_view s);

}  // namespace bs::jinja
