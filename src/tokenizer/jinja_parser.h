// Lexer and parser of the Jinja2 subset used by chat templates, with the whitespace rules of the
// environment transformers renders them in (trim_blocks, lstrip_blocks, `-`/`+` markers, one
// trailing newline dropped). parse() throws jinja::Error (with the line) on a syntax error.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace bs::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // args (tuple when `tuple`)
    kDict,     // args: key, value, key, value, ...
    kAttr,     // args[0] . name
    kItem,     // args[0] [ args[1] ]
    kSlice,    // args[0] [ args[1] : args[2] : args[3] ] (null parts omitted)
    kCall,     // args[0] ( args[1..], kwargs )
    kFilter,   // args[0] | name ( args[1..], kwargs )
    kTest,     // args[0] is [not] name ( args[1..] )
    kNeg,      // - args[0]
    kPos,      // + args[0]
    kNot,      // not args[0]
    kBinary,   // args[0] name args[1]: + - * / // % ** ~
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ... (==, !=, <, <=, >, >=, in, notin)
    kAnd,
    kOr,
    kCond,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;  // kTest: `is not`
  bool tuple = false;    // kList
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,       // text
    kOutput,     // {{ expr }}
    kIf,         // branches (cond, body); else_body
    kFor,        // targets in expr [if filter] body; else_body
    kSet,        // targets = expr, or attr_target.attr = expr
    kSetBlock,   // {% set targets[0] %} body {% endset %}
    kMacro,      // name(params) body
    kCallBlock,  // {% call expr %} body {% endcall %}: body becomes caller()
    kBreak,
    kContinue,
    kScope,        // {% generation %} / {% with %}: body (with: assignments in sets)
    kFilterBlock,  // {% filter f(args) | g %} body: expr is the filter chain applied to the
                   // name kFilterBlockInput, which holds the rendered body
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace attribute: targets[0].attr
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null); kScope
  bool new_scope = false;                               // kScope: {% with %}
};

// The name the filter chain of a {% filter %} block reads its body from (not an identifier).
inline constexpr const char* kFilterBlockInput = "(filter block)";

struct Template {
  Body body;
};

// Parses template source. Throws jinja::Error naming the line on a syntax error.
std::unique_ptr<Template> parse(std::string_view source);

}  // namespace bs::jinja
