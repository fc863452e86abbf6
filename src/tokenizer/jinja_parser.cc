#include "tokenizer/jinja_parser.h"

#include <cstdlib>
#include <cstring>

#include "tokenizer/jinja_interp.h"
#include "tokenizer/unicode.h"

namespace bs::jinja {
namespace {

constexpr int kMaxNesting = 100;  // expression / statement nesting the parser accepts

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;
  int line;
  int64_t ival = 0;
  double fval = 0;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string rstrip_ws(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  return std::string(s.substr(0, n));
}

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Python string-literal escapes (Jinja decodes literals with "unicode-escape").
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    auto hex = [&](int digits) {
      if (i + digits >= s.size()) {
        throw Error("truncated \\x/\\u escape in string literal", line);
      }
      const std::string h(s.substr(i + 1, digits));
      char* end = nullptr;
      const unsigned long cp = std::strtoul(h.c_str(), &end, 16);
      if (h.size() != static_cast<size_t>(digits) || *end != '\0' || cp > 0x10FFFF ||
          (cp >= 0xD800 && cp <= 0xDFFF)) {
        throw Error("invalid \\x/\\u escape in string literal", line);
      }
      i += digits;
      unicode::append_utf8(out, static_cast<char32_t>(cp));
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
      case '\'':
      case '"':
        out += c;
        break;
      case '\n':
        break;  // line continuation
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        if (c >= '0' && c <= '7') {
          int v = 0, k = 0;
          while (k < 3 && i < s.size() && s[i] >= '0' && s[i] <= '7')
            v = v * 8 + (s[i++] - '0'), ++k;
          --i;
          unicode::append_utf8(out, static_cast<char32_t>(v));
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

// ---- Lexer: template source -> tokens ----

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Newlines are normalized to "\n" and one trailing newline is dropped (keep_trailing_newline
    // is off), as Jinja's lexer does.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      std::string text =
          src_.substr(pos_, tag == std::string::npos ? std::string::npos : tag - pos_);
      const int text_line = line_;
      if (tag == std::string::npos) {
        emit_text(std::move(text), text_line);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')
                            ? src_[tag + 2]
                            : 0;
      line_ += count_newlines(text);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        text = lstrip_block(std::move(text), line_starting);
      }
      emit_text(std::move(text), text_line);
      pos_ = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        line_starting = lex_comment();
      } else if (kind == '%' && try_raw(line_starting)) {
        line_starting = ends_with_newline_;
      } else {
        line_starting = lex_tag(kind == '%');
      }
    }
    tokens_.push_back({Tok::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // lstrip_blocks: spaces/tabs between the start of the line and a block tag are dropped.
  static std::string lstrip_block(std::string text, bool line_starting) {
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos == text.size()) return text;
    for (size_t i = l_pos; i < text.size(); ++i) {
      if (!is_space(text[i])) return text;
    }
    text.resize(l_pos);
    return text;
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back({Tok::kText, std::move(text), line});
  }

  // After a closing marker: `-` eats all whitespace, a block/comment end (trim_blocks) one
  // newline unless marked `+`. Returns whether what was consumed ends with a newline.
  bool after_end(char sign, bool trim_newline) {
    const size_t start = pos_;
    if (sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (sign != '+' && trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += count_newlines(std::string_view(src_).substr(start, pos_ - start));
    return pos_ > start && src_[pos_ - 1] == '\n';
  }

  bool lex_comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) throw Error("unterminated comment", line_);
    char sign = 0;
    if (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    line_ += count_newlines(std::string_view(src_).substr(pos_, end - pos_));
    pos_ = end + 2;
    return after_end(sign, true);
  }

  // {% raw %} ... {% endraw %}: the content is text.
  bool try_raw(bool line_starting) {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    char sign = 0;
    if (p < src_.size() && src_[p] == '-') sign = '-', ++p;
    if (src_.compare(p, 2, "%}") != 0) return false;
    const int raw_line = line_;
    line_ += count_newlines(std::string_view(src_).substr(pos_, p - pos_));
    pos_ = p + 2;
    if (sign == '-') after_end('-', false);
    // Find {%[-+]? endraw [-+]?%}.
    for (size_t at = src_.find("{%", pos_); at != std::string::npos; at = src_.find("{%", at + 1)) {
      size_t q = at + 2;
      char open_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) open_sign = src_[q++];
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char close_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) close_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, at - pos_);
      const int text_line = line_;
      line_ += count_newlines(std::string_view(src_).substr(pos_, q + 2 - pos_));
      if (open_sign == '-') {
        text = rstrip_ws(text);
      } else if (open_sign != '+') {
        text = lstrip_block(std::move(text), false);
      }
      emit_text(std::move(text), text_line);
      pos_ = q + 2;
      const bool consumed = after_end(close_sign, true);
      ends_with_newline_ = consumed;
      (void)line_starting;
      return true;
    }
    throw Error("missing {% endraw %}", raw_line);
  }

  // The inside of {{ ... }} or {% ... %}. Returns whether the end consumed a newline.
  bool lex_tag(bool block) {
    tokens_.push_back({block ? Tok::kBlockBegin : Tok::kVarBegin, "", line_});
    const int begin_line = line_;
    int balance = 0;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        throw Error(block ? "unexpected end of template: missing '%}'" : "missing '}}'",
                    begin_line);
      }
      const std::string_view rest = std::string_view(src_).substr(pos_);
      if (balance == 0) {
        char sign = 0;
        size_t len = 0;
        if (block) {
          if (rest.starts_with("-%}"))
            sign = '-', len = 3;
          else if (rest.starts_with("+%}"))
            sign = '+', len = 3;
          else if (rest.starts_with("%}"))
            len = 2;
        } else {
          if (rest.starts_with("-}}"))
            sign = '-', len = 3;
          else if (rest.starts_with("}}"))
            len = 2;
        }
        if (len) {
          tokens_.push_back({block ? Tok::kBlockEnd : Tok::kVarEnd, "", line_});
          pos_ += len;
          return after_end(sign, block);
        }
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
          ++n;
        tokens_.push_back({Tok::kName, std::string(rest.substr(0, n)), line_});
        pos_ += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number(rest);
      } else if (c == '\'' || c == '"') {
        size_t n = 1;
        while (n < rest.size() && rest[n] != c) n += rest[n] == '\\' ? 2 : 1;
        if (n >= rest.size()) throw Error("unterminated string literal", line_);
        tokens_.push_back({Tok::kString, unescape(rest.substr(1, n - 1), line_), line_});
        line_ += count_newlines(rest.substr(0, n));
        pos_ += n + 1;
      } else {
        static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2) {
          if (rest.starts_with(o)) op = o;
        }
        if (op.empty()) {
          if (std::strchr("+-*/%~<>=()[]{},.:|", c) == nullptr) {
            throw Error(std::string("unexpected character '") + c + "'", line_);
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++balance;
        if (op == ")" || op == "]" || op == "}") {
          if (--balance < 0) throw Error("unexpected '" + op + "'", line_);
        }
        tokens_.push_back({Tok::kOp, op, line_});
        pos_ += op.size();
      }
    }
  }

  void lex_number(std::string_view rest) {
    size_t n = 0;
    auto digits = [&] {
      while (n < rest.size() &&
             (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
        ++n;
    };
    digits();
    bool is_float = false;
    // Right after a '.' a number is an integer (Jinja2's float pattern has (?<!\.)), so
    // `matrix.0.1` reads items 0 and 1.
    const bool after_dot =
        !tokens_.empty() && tokens_.back().type == Tok::kOp && tokens_.back().text == ".";
    if (after_dot) {
      // no fraction, no exponent
    } else if (n + 1 < rest.size() && rest[n] == '.' &&
               std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      ++n;
      digits();
    }
    if (!after_dot && n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        n = m;
        digits();
      }
    }
    std::string text;
    for (char ch : rest.substr(0, n)) {
      if (ch != '_') text += ch;
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, text, line_};
    if (is_float) {
      t.fval = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.ival = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) throw Error("integer literal too large", line_);
    }
    tokens_.push_back(std::move(t));
    pos_ += n;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool ends_with_newline_ = false;
  std::vector<Token> tokens_;
};

// ---- Parser: tokens -> AST ----

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  std::unique_ptr<Template> run() {
    auto t = std::make_unique<Template>();
    std::string end = parse_body(t->body, {});
    if (!end.empty()) throw Error("unexpected '" + end + "'", cur().line);
    return t;
  }

 private:
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::kName && cur().text == n; }
  [[noreturn]] void fail(const std::string& what) const { throw Error(what, cur().line); }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail("expected '" + std::string(op) + "', got '" + describe() + "'");
    ++i_;
  }
  std::string describe() const {
    switch (cur().type) {
      case Tok::kBlockEnd:
        return "%}";
      case Tok::kVarEnd:
        return "}}";
      case Tok::kEof:
        return "end of template";
      default:
        return cur().text;
    }
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail("expected a name, got '" + describe() + "'");
    return toks_[i_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) fail("expected '%}', got '" + describe() + "'");
    ++i_;
  }

  struct Depth {
    explicit Depth(Parser& p) : p(p) {
      if (++p.depth_ > kMaxNesting) p.fail("template nesting too deep");
    }
    ~Depth() { --p.depth_; }
    Parser& p;
  };

  // Parses nodes until a block tag whose keyword is in `ends` (returned, tag keyword consumed,
  // rest of the tag not) or the end of the template ("" returned).
  std::string parse_body(Body& body, const std::vector<std::string_view>& ends) {
    Depth depth(*this);
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (!ends.empty())
          fail("unexpected end of template: missing '{% " + std::string(ends[0]) + " %}'");
        return "";
      }
      if (t.type == Tok::kText) {
        auto n = std::make_unique<Node>(Node{Node::Kind::kText, t.line});
        n->text = t.text;
        body.push_back(std::move(n));
        ++i_;
      } else if (t.type == Tok::kVarBegin) {
        ++i_;
        auto n = std::make_unique<Node>(Node{Node::Kind::kOutput, t.line});
        n->expr = parse_expr();
        if (cur().type != Tok::kVarEnd) fail("expected '}}', got '" + describe() + "'");
        ++i_;
        body.push_back(std::move(n));
      } else if (t.type == Tok::kBlockBegin) {
        ++i_;
        const std::string kw = expect_name();
        for (auto e : ends) {
          if (kw == e) return kw;
        }
        body.push_back(parse_statement(kw, t.line));
      } else {
        fail("unexpected token '" + describe() + "'");
      }
    }
  }

  std::unique_ptr<Node> parse_statement(const std::string& kw, int line) {
    auto n = std::make_unique<Node>(Node{Node::Kind::kText, line});
    if (kw == "if") {
      n->kind = Node::Kind::kIf;
      ExprPtr cond = parse_expr();
      while (true) {
        expect_block_end();
        Body b;
        const std::string end = parse_body(b, {"elif", "else", "endif"});
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = parse_expr();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          parse_body(n->else_body, {"endif"});
        }
        expect_block_end();
        break;
      }
    } else if (kw == "for") {
      n->kind = Node::Kind::kFor;
      n->targets.push_back(expect_target());
      while (is_op(",")) {
        ++i_;
        n->targets.push_back(expect_target());
      }
      if (!is_name("in")) fail("expected 'in' in for loop");
      ++i_;
      n->expr = parse_expr(/*allow_cond=*/false);
      if (is_name("if")) {
        ++i_;
        n->filter = parse_expr();
      }
      if (is_name("recursive")) fail("recursive loops are not supported");
      expect_block_end();
      const std::string end = parse_body(n->body, {"else", "endfor"});
      if (end == "else") {
        expect_block_end();
        parse_body(n->else_body, {"endfor"});
      }
      expect_block_end();
    } else if (kw == "set") {
      n->kind = Node::Kind::kSet;
      n->targets.push_back(expect_target());
      if (is_op(".") && n->targets[0][0] != '(') {
        ++i_;
        n->attr = expect_name();
      } else {
        while (is_op(",")) {
          ++i_;
          n->targets.push_back(expect_target());
        }
      }
      if (cur().type == Tok::kBlockEnd && n->targets.size() == 1 && n->attr.empty() &&
          n->targets[0][0] != '(') {
        n->kind = Node::Kind::kSetBlock;
        ++i_;
        parse_body(n->body, {"endset"});
        expect_block_end();
        return n;
      }
      expect_op("=");
      n->expr = parse_tuple_or_expr();
      expect_block_end();
    } else if (kw == "macro") {
      n->kind = Node::Kind::kMacro;
      n->text = expect_name();
      parse_params(n->params);
      expect_block_end();
      parse_body(n->body, {"endmacro"});
      expect_block_end();
    } else if (kw == "call") {
      n->kind = Node::Kind::kCallBlock;
      if (is_op("(")) parse_params(n->params);
      n->expr = parse_expr();
      if (n->expr->kind != Expr::Kind::kCall) fail("expected a macro call after 'call'");
      expect_block_end();
      parse_body(n->body, {"endcall"});
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
    } else if (kw == "generation") {
      n->kind = Node::Kind::kScope;
      expect_block_end();
      parse_body(n->body, {"endgeneration"});
      expect_block_end();
    } else if (kw == "filter") {
      n->kind = Node::Kind::kFilterBlock;
      ExprPtr input = make(Expr::Kind::kName, line);
      input->name = kFilterBlockInput;
      ExprPtr f = make(Expr::Kind::kFilter, line);
      f->name = expect_name();
      f->args.push_back(std::move(input));
      if (is_op("(")) parse_call_args(*f);
      n->expr = parse_filters(std::move(f));
      expect_block_end();
      parse_body(n->body, {"endfilter"});
      expect_block_end();
    } else if (kw == "with") {
      n->kind = Node::Kind::kScope;
      n->new_scope = true;
      while (cur().type != Tok::kBlockEnd) {
        if (!n->params.empty()) expect_op(",");
        std::string name = expect_name();
        expect_op("=");
        n->params.emplace_back(std::move(name), parse_expr());
      }
      expect_block_end();
      parse_body(n->body, {"endwith"});
      expect_block_end();
    } else {
      fail("unknown tag '" + kw + "'");
    }
    return n;
  }

  // An assignment target: a name, or a parenthesized group of targets (`for a, (b, c) in ...`),
  // which Node::targets holds as the text "(b,c)" (no name starts with '('); `(x)` is just x.
  std::string expect_target() {
    if (!is_op("(")) return expect_name();
    Depth depth(*this);
    ++i_;
    std::vector<std::string> parts;
    const bool comma = comma_list(")", [&] { parts.push_back(expect_target()); });
    if (parts.empty()) fail("expected a name, got ')'");
    if (parts.size() == 1 && !comma) return parts[0];
    std::string group = "(";
    for (size_t k = 0; k < parts.size(); ++k) group += (k ? "," : "") + parts[k];
    return group + (parts.size() == 1 ? ",)" : ")");
  }

  void parse_params(std::vector<std::pair<std::string, ExprPtr>>& params) {
    expect_op("(");
    comma_list(")", [&] {
      std::string name = expect_name();
      ExprPtr def;
      if (is_op("=")) {
        ++i_;
        def = parse_expr();
      }
      params.emplace_back(std::move(name), std::move(def));
    });
  }

  // Items separated by commas up to `close` (consumed; a trailing comma is allowed). Returns
  // whether there was a comma.
  template <typename Item>
  bool comma_list(std::string_view close, Item item) {
    bool comma = false, first = true;
    while (!is_op(close)) {
      if (!first) {
        expect_op(",");
        comma = true;
        if (is_op(close)) break;
      }
      first = false;
      item();
    }
    ++i_;
    return comma;
  }

  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // `a, b` at the top of a set statement is a tuple.
  ExprPtr parse_tuple_or_expr() {
    const int line = cur().line;
    ExprPtr first = parse_expr();
    if (!is_op(",")) return first;
    ExprPtr t = make(Expr::Kind::kList, line);
    t->tuple = true;
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type == Tok::kBlockEnd) break;
      t->args.push_back(parse_expr());
    }
    return t;
  }

  ExprPtr parse_expr(bool allow_cond = true) {
    Depth depth(*this);
    ExprPtr e = parse_or();
    while (allow_cond && is_name("if")) {
      const int line = cur().line;
      ++i_;
      ExprPtr c = make(Expr::Kind::kCond, line);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      if (is_name("else")) {
        ++i_;
        c->args.push_back(parse_expr());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, ExprPtr a, ExprPtr b, int line, std::string name = "") {
    ExprPtr e = make(k, line);
    e->name = std::move(name);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // One left-associative level: next (op next)*, where op(cur()) names the operator or is "".
  template <typename Next, typename Op>
  ExprPtr left_assoc(Expr::Kind kind, Next next, Op op) {
    ExprPtr e = next();
    for (std::string o = op(); !o.empty(); o = op()) {
      const int line = cur().line;
      ++i_;
      e = binary(kind, std::move(e), next(), line, o);
    }
    return e;
  }
  std::string op_of(std::initializer_list<std::string_view> ops) const {
    for (auto o : ops) {
      if (is_op(o)) return std::string(o);
    }
    return "";
  }

  ExprPtr parse_or() {
    return left_assoc(
        Expr::Kind::kOr, [&] { return parse_and(); },
        [&] { return std::string(is_name("or") ? "or" : ""); });
  }

  ExprPtr parse_and() {
    return left_assoc(
        Expr::Kind::kAnd, [&] { return parse_not(); },
        [&] { return std::string(is_name("and") ? "and" : ""); });
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth depth(*this);
      ExprPtr e = make(Expr::Kind::kNot, cur().line);
      ++i_;
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    return left_assoc(
        Expr::Kind::kBinary, [&] { return parse_concat(); },
        [&] {
          return op_of({"+", "-"});
        });
  }

  ExprPtr parse_concat() {
    return left_assoc(
        Expr::Kind::kBinary, [&] { return parse_math2(); }, [&] { return op_of({"~"}); });
  }

  ExprPtr parse_math2() {
    return left_assoc(
        Expr::Kind::kBinary, [&] { return parse_pow(); },
        [&] {
          return op_of({"*", "/", "//", "%"});
        });
  }

  ExprPtr parse_pow() {
    return left_assoc(
        Expr::Kind::kBinary, [&] { return parse_unary(true); }, [&] { return op_of({"**"}); });
  }

  ExprPtr parse_unary(bool with_filter) {
    Depth depth(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, cur().line);
      ++i_;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == Tok::kName) {
      ++i_;
      ExprPtr e = make(Expr::Kind::kLiteral, line);
      if (t.text == "true" || t.text == "True") {
        e->value = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) s += toks_[i_++].text;  // adjacent literals concatenate
      ExprPtr e = make(Expr::Kind::kLiteral, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      ExprPtr e = make(Expr::Kind::kLiteral, line);
      e->value = t.type == Tok::kInt ? Value(t.ival) : Value(t.fval);
      ++i_;
      return e;
    }
    if (is_op("(")) {
      ++i_;
      ExprPtr t = make(Expr::Kind::kList, line);
      t->tuple = true;
      const bool comma = comma_list(")", [&] { t->args.push_back(parse_expr()); });
      if (t->args.size() == 1 && !comma) return std::move(t->args[0]);
      return t;
    }
    if (is_op("[")) {
      ++i_;
      ExprPtr l = make(Expr::Kind::kList, line);
      comma_list("]", [&] { l->args.push_back(parse_expr()); });
      return l;
    }
    if (is_op("{")) {
      ++i_;
      ExprPtr d = make(Expr::Kind::kDict, line);
      comma_list("}", [&] {
        d->args.push_back(parse_expr());
        expect_op(":");
        d->args.push_back(parse_expr());
      });
      return d;
    }
    fail("unexpected '" + describe() + "'");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = cur().line;
      if (is_op(".")) {
        ++i_;
        if (cur().type == Tok::kInt) {
          ExprPtr item = make(Expr::Kind::kItem, line);
          ExprPtr key = make(Expr::Kind::kLiteral, line);
          key->value = Value(toks_[i_++].ival);
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(key));
          e = std::move(item);
        } else {
          ExprPtr a = make(Expr::Kind::kAttr, line);
          a->name = expect_name();
          a->args.push_back(std::move(e));
          e = std::move(a);
        }
      } else if (is_op("[")) {
        ++i_;
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), line);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    bool slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
      if (k < 2 && is_op(":")) {
        slice = true;
        ++i_;
      } else {
        break;
      }
    }
    expect_op("]");
    ExprPtr e = make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
    e->args.push_back(std::move(target));
    if (!slice) {
      if (!parts[0]) fail("expected a subscript");
      e->args.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->args.push_back(std::move(p));
    }
    return e;
  }

  ExprPtr parse_call(ExprPtr callee, int line) {
    ExprPtr c = make(Expr::Kind::kCall, line);
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return c;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    comma_list(")", [&] {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string name = toks_[i_].text;
        i_ += 2;
        call.kwargs.emplace_back(std::move(name), parse_expr());
      } else {
        if (!call.kwargs.empty()) fail("positional argument follows keyword argument");
        call.args.push_back(parse_expr());
      }
    });
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      const int line = cur().line;
      if (is_op("|")) {
        ++i_;
        ExprPtr f = make(Expr::Kind::kFilter, line);
        f->name = expect_name();
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++i_;
        ExprPtr t = make(Expr::Kind::kTest, line);
        if (is_name("not")) {
          t->negated = true;
          ++i_;
        }
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Tok::kName && cur().text != "else" && cur().text != "or" &&
                    cur().text != "and" && cur().text != "if") ||
                   cur().type == Tok::kString || cur().type == Tok::kInt ||
                   cur().type == Tok::kFloat || is_op("[") || is_op("{")) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), line);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
};

// ---- Unknown filters and tests ----
//
// Jinja2 rejects a filter or test it does not know when it compiles the template, except inside
// an `if` statement (its conditions and bodies) or a conditional expression: there the name is
// looked up when it runs, so `{% if x is string %}{{ x | from_json }}{% endif %}` renders while the
// branch is not taken. A new scope (a for loop's body, a macro, a call block, a set block, with,
// generation) is checked strictly again, as Jinja2's inner frames are not "soft".

void check_names(const Expr* e, bool soft) {
  if (e == nullptr) return;
  if (e->kind == Expr::Kind::kCond) soft = true;
  if (!soft && e->kind == Expr::Kind::kFilter && !has_filter(e->name)) {
    throw Error("no filter named '" + e->name + "'", e->line);
  }
  if (!soft && e->kind == Expr::Kind::kTest && !has_test(e->name)) {
    throw Error("no test named '" + e->name + "'", e->line);
  }
  for (const ExprPtr& a : e->args) check_names(a.get(), soft);
  for (const auto& [name, a] : e->kwargs) check_names(a.get(), soft);
}

void check_names(const Body& body, bool soft);

void check_names(const Node& n, bool soft) {
  using K = Node::Kind;
  switch (n.kind) {
    case K::kIf:
      for (const auto& [cond, body] : n.branches) {
        check_names(cond.get(), true);
        check_names(body, true);
      }
      check_names(n.else_body, true);
      return;
    case K::kFor:
      check_names(n.expr.get(), soft);
      check_names(n.filter.get(), false);
      check_names(n.body, false);
      check_names(n.else_body, false);
      return;
    case K::kCallBlock:
      check_names(n.expr.get(), soft);
      [[fallthrough]];
    case K::kMacro:
      for (const auto& [name, def] : n.params) check_names(def.get(), soft);
      check_names(n.body, false);
      return;
    case K::kScope:
      for (const auto& [name, x] : n.params) check_names(x.get(), soft);
      check_names(n.body, false);
      return;
    case K::kSetBlock:
      check_names(n.body, false);
      return;
    case K::kFilterBlock:
      check_names(n.expr.get(), soft);
      check_names(n.body, false);
      return;
    default:
      check_names(n.expr.get(), soft);
      return;
  }
}

void check_names(const Body& body, bool soft) {
  for (const auto& n : body) check_names(*n, soft);
}

}  // namespace

std::unique_ptr<Template> parse(std::string_view source) {
  std::unique_ptr<Template> t = Parser(Lexer(source).run()).run();
  check_names(t->body, /*soft=*/false);
  return t;
}

}  // namespace bs::jinja
