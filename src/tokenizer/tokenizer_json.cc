#include "tokenizer/tokenizer_json.h"

#include <charconv>

#include "tokenizer/unicode.h"

namespace bs {

namespace {

using json_util::Json;

// ---------------------------------------------------------------------------------------------
// Fast path: a structural scan finds model.vocab and model.merges, a dedicated scanner reads
// them, nlohmann parses the (small) rest. Any surprise returns false and the SAX path below
// (which also produces the precise error messages) takes over.

constexpr size_t kNone = std::string_view::npos;

// Index just past the string starting at t[i] == '"', or kNone.
size_t skip_string(std::string_view t, size_t i) {
  for (size_t j = i + 1; j < t.size(); ++j) {
    if (t[j] == '\\') {
      ++j;
    } else if (t[j] == '"') {
      return j + 1;
    }
  }
  return kNone;
}

// Index just past the object / array starting at t[i], or kNone.
size_t skip_container(std::string_view t, size_t i) {
  int depth = 0;
  while (i < t.size()) {
    const char c = t[i];
    if (c == '"') {
      i = skip_string(t, i);
      if (i == kNone) return kNone;
      continue;
    }
    if (c == '{' || c == '[') ++depth;
    if ((c == '}' || c == ']') && --depth == 0) return i + 1;
    ++i;
  }
  return kNone;
}

struct Span {
  size_t begin = kNone, end = kNone;
};

bool find_model_spans(std::string_view t, Span& vocab, Span& merges) {
  std::vector<char> stack;        // open containers
  std::vector<uint8_t> want_key;  // per open object: the next string is a key
  std::string_view keys[3];       // latest key in the root object and in the depth-2 object
  size_t i = 0;
  while (i < t.size()) {
    const char c = t[i];
    if (c == '"') {
      const size_t end = skip_string(t, i);
      if (end == kNone) return false;
      if (!stack.empty() && stack.back() == '{' && want_key.back()) {
        if (stack.size() <= 2) keys[stack.size()] = t.substr(i + 1, end - i - 2);
        want_key.back() = 0;
      }
      i = end;
      continue;
    }
    if (c == '{' || c == '[') {
      if (stack.size() == 2 && stack[0] == '{' && stack[1] == '{' && keys[1] == "model" &&
          ((c == '{' && keys[2] == "vocab") || (c == '[' && keys[2] == "merges"))) {
        const size_t end = skip_container(t, i);
        if (end == kNone) return false;
        (c == '{' ? vocab : merges) = Span{i, end};
        i = end;
        continue;
      }
      stack.push_back(c);
      want_key.push_back(c == '{');
    } else if (c == '}' || c == ']') {
      if (stack.empty()) return false;
      stack.pop_back();
      want_key.pop_back();
    } else if (c == ',' && !stack.empty() && stack.back() == '{') {
      want_key.back() = 1;
    }
    ++i;
  }
  return vocab.begin != kNone && merges.begin != kNone;
}

class SpanScanner {
 public:
  explicit SpanScanner(std::string_view t) : t_(t) {}

  void skip_ws() {
    while (i_ < t_.size() &&
           (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) {
      ++i_;
    }
  }
  bool eat(char c) {
    skip_ws();
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool peek(char c) {
    skip_ws();
    return i_ < t_.size() && t_[i_] == c;
  }
  bool at_end() {
    skip_ws();
    return i_ == t_.size();
  }
  bool integer(int64_t& v) {
    skip_ws();
    const auto [ptr, ec] = std::from_chars(t_.data() + i_, t_.data() + t_.size(), v);
    if (ec != std::errc() || ptr == t_.data() + i_) return false;
    i_ = static_cast<size_t>(ptr - t_.data());
    return i_ >= t_.size() || (t_[i_] != '.' && t_[i_] != 'e' && t_[i_] != 'E');
  }
  // A JSON string, unescaped; false on anything but valid JSON with valid UTF-8.
  bool string(std::string& out) {
    if (!eat('"')) return false;
    out.clear();
    bool ascii = true;
    while (i_ < t_.size()) {
      const char c = t_[i_++];
      if (c == '"') return ascii || unicode::is_valid_utf8(out);
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (static_cast<unsigned char>(c) >= 0x80) ascii = false;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= t_.size()) return false;
      const char e = t_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          char32_t cp;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // surrogate pair
            char32_t lo;
            if (i_ + 2 > t_.size() || t_[i_] != '\\' || t_[i_ + 1] != 'u') return false;
            i_ += 2;
            if (!hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return false;
          }
          unicode::append_utf8(out, cp);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }

 private:
  bool hex4(char32_t& cp) {
    if (i_ + 4 > t_.size()) return false;
    cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = t_[i_++];
      const int v = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (v < 0) return false;
      cp = cp * 16 + static_cast<char32_t>(v);
    }
    return true;
  }

  std::string_view t_;
  size_t i_ = 0;
};

bool scan_vocab(std::string_view t, TokenizerJson& out) {
  SpanScanner s(t);
  if (!s.eat('{')) return false;
  std::string key;
  if (s.eat('}')) return s.at_end();
  do {
    int64_t id;
    if (!s.string(key) || !s.eat(':') || !s.integer(id) || id < 0 || id > kMaxTokenId) {
      return false;
    }
    out.vocab.emplace_back(key, id);
  } while (s.eat(','));
  return s.eat('}') && s.at_end();
}

bool scan_merges(std::string_view t, TokenizerJson& out) {
  SpanScanner s(t);
  if (!s.eat('[')) return false;
  if (s.eat(']')) return s.at_end();
  std::string a, b;
  do {
    if (s.peek('"')) {
      if (!s.string(a)) return false;
      const size_t space = a.find(' ');
      if (space == std::string::npos) return false;
      out.merges.emplace_back(a.substr(0, space), a.substr(space + 1));
    } else {
      if (!s.eat('[') || !s.string(a) || !s.eat(',') || !s.string(b) || !s.eat(']')) {
        return false;
      }
      out.merges.emplace_back(a, b);
    }
  } while (s.eat(','));
  return s.eat(']') && s.at_end();
}

bool fast_parse(std::string_view text, TokenizerJson& out) {
  Span vocab, merges;
  if (!find_model_spans(text, vocab, merges)) return false;
  if (!scan_vocab(text.substr(vocab.begin, vocab.end - vocab.begin), out) ||
      !scan_merges(text.substr(merges.begin, merges.end - merges.begin), out)) {
    return false;
  }
  // The rest of the document with empty containers in place of the captured values.
  const bool vocab_first = vocab.begin < merges.begin;
  const Span& first = vocab_first ? vocab : merges;
  const Span& second = vocab_first ? merges : vocab;
  std::string rest;
  rest.reserve(text.size() - (vocab.end - vocab.begin) - (merges.end - merges.begin) + 4);
  rest.append(text.substr(0, first.begin)).append(vocab_first ? "{}" : "[]");
  rest.append(text.substr(first.end, second.begin - first.end));
  rest.append(vocab_first ? "[]" : "{}").append(text.substr(second.end));
  try {
    out.doc = Json::parse(rest);
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  if (!out.doc.is_object()) return false;
  out.vocab_captured = out.merges_captured = true;
  return true;
}

// ---------------------------------------------------------------------------------------------
// General path: SAX over the whole document.

// SAX handler: builds a DOM except for the two big arrays, which it captures.
class Handler : public nlohmann::json_sax<Json> {
 public:
  explicit Handler(TokenizerJson& out) : out_(out) {}

  const std::string& error() const { return error_; }

  bool null() override { return value(Json()); }
  bool boolean(bool v) override { return value(Json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return vocab_entry(v);
    return value(Json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) {
      return vocab_entry(v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    }
    return value(Json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(Json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) return merge_string(v);
    if (mode_ == Mode::kVocab) return vocab_other("a string");
    return value(Json(std::move(v)));
  }
  bool binary(binary_t&) override { return fail("binary values are not JSON"); }

  bool start_object(std::size_t) override {
    if (mode_ == Mode::kVocab) {
      ++vocab_skip_depth_;
      return vocab_other("an object");
    }
    if (mode_ != Mode::kDom) return fail(capture_field() + " holds an unexpected object");
    if (at_model_member("vocab")) {
      mode_ = Mode::kVocab;
      out_.vocab_captured = true;
      return true;
    }
    return open(Json::object());
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab && vocab_skip_depth_ > 0) {
      --vocab_skip_depth_;
      return true;
    }
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return value(Json::object());
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ != 1) return fail("model.merges entries must be strings or [a, b] pairs");
      merge_depth_ = 2;
      pair_.clear();
      return true;
    }
    if (mode_ == Mode::kVocab) {
      ++vocab_skip_depth_;
      return vocab_other("an array");
    }
    if (at_model_member("merges")) {
      mode_ = Mode::kMerges;
      merge_depth_ = 1;
      out_.merges_captured = true;
      return true;
    }
    return open(Json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kVocab) {
      --vocab_skip_depth_;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ == 2) {
        if (pair_.size() != 2) {
          return fail(fmt::format("model.merges[{}] must have exactly 2 strings, got {}",
                                  out_.merges.size(), pair_.size()));
        }
        out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        merge_depth_ = 1;
        return true;
      }
      mode_ = Mode::kDom;
      return value(Json::array());
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    if (error_.empty()) error_ = fmt::format("invalid JSON at byte {}: {}", position, e.what());
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges };
  struct Frame {
    Json* node;
    std::string name;  // key of this container in its parent ("" for array elements / root)
  };

  bool fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  std::string capture_field() const {
    return mode_ == Mode::kVocab ? "model.vocab" : "model.merges";
  }
  // True when the next value is the member `name` of the top-level "model" object.
  bool at_model_member(std::string_view name) const {
    return stack_.size() == 2 && stack_[1].name == "model" && stack_[1].node->is_object() &&
           key_ == name;
  }
  // A vocab value that is not a token id: remembered, and the rest of the value is skipped.
  bool vocab_other(const char* what) {
    if (out_.vocab_error.empty()) {
      out_.vocab_error = fmt::format("model.vocab['{}'] must be an integer id, got {}", key_, what);
    }
    return true;
  }
  bool vocab_entry(int64_t id) {
    if (vocab_skip_depth_ > 0) return true;
    if (id < 0 || id > kMaxTokenId) {
      return fail(fmt::format("model.vocab['{}'] is {}: a token id must be in 0..{}", key_, id,
                              kMaxTokenId));
    }
    out_.vocab.emplace_back(std::move(key_), id);
    return true;
  }
  bool merge_string(std::string& s) {
    if (merge_depth_ == 2) {
      pair_.push_back(std::move(s));
      return true;
    }
    const size_t space = s.find(' ');
    if (space == std::string::npos) {
      return fail(fmt::format("model.merges[{}] = '{}' must be two tokens separated by a space",
                              out_.merges.size(), s));
    }
    out_.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    return true;
  }
  // Inserts v into the current container and returns a pointer to the stored value.
  Json* insert(Json v) {
    if (stack_.empty()) {
      out_.doc = std::move(v);
      return &out_.doc;
    }
    Json& parent = *stack_.back().node;
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    Json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(Json v) {
    if (mode_ == Mode::kVocab) return vocab_other(v.type_name());
    if (mode_ == Mode::kMerges) return fail("model.merges entries must be strings or pairs");
    insert(std::move(v));
    return true;
  }
  bool open(Json container) {
    std::string name = !stack_.empty() && stack_.back().node->is_object() ? key_ : std::string();
    Json* node = insert(std::move(container));
    stack_.push_back({node, std::move(name)});
    return true;
  }

  TokenizerJson& out_;
  std::vector<Frame> stack_;
  std::string key_;
  Mode mode_ = Mode::kDom;
  int merge_depth_ = 0;
  int vocab_skip_depth_ = 0;  // nesting inside a non-integer vocab value
  std::vector<std::string> pair_;
  std::string error_;
};

}  // namespace

Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& file) {
  {
    TokenizerJson fast;
    if (fast_parse(text, fast)) return fast;
  }
  TokenizerJson out;
  Handler handler(out);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &handler);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("{}: invalid JSON: {}", file, e.what());
  }
  if (!ok) {
    return InvalidArgument("{}: {}", file,
                           handler.error().empty() ? "invalid JSON" : handler.error());
  }
  if (!out.doc.is_object()) return InvalidArgument("{}: the top level must be an object", file);
  return out;
}

}  // namespace bs
