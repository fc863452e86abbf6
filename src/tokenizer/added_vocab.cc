#include "tokenizer/added_vocab.h"

#include "tokenizer/unicode.h"

namespace bs {

namespace {

// Code point ending just before `pos` (valid UTF-8), and its start offset.
char32_t prev_code_point(std::string_view text, size_t pos, size_t& start) {
  start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t p = start;
  return unicode::next_code_point(text, p);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  nodes_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    int32_t node = 0;
    for (char ch : content) {
      const auto c = static_cast<unsigned char>(ch);
      int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(c, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    // On duplicate contents the later entry wins, like a map keyed by content.
    nodes_[node].token = static_cast<int32_t>(t);
    first_byte_[static_cast<unsigned char>(content[0])] = true;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char c) const {
  for (const auto& [byte, next] : nodes_[node].children) {
    if (byte == c) return next;
  }
  return -1;
}

// single_word: the match may not touch a word character on either side.
bool AddedTokenMatcher::boundary_ok(std::string_view text, size_t begin, size_t end) const {
  if (begin > 0) {
    size_t start;
    if (unicode::is_word_char(prev_code_point(text, begin, start))) return false;
  }
  if (end < text.size()) {
    size_t p = end;
    if (unicode::is_word_char(unicode::next_code_point(text, p))) return false;
  }
  return true;
}

std::vector<AddedTokenMatcher::Segment> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<Segment> out;
  size_t plain_begin = 0;  // start of the pending plain segment
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i that passes its single_word check.
    int32_t best = -1;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      const int32_t t = nodes_[node].token;
      if (t >= 0 && (!tokens_[t].single_word || boundary_ok(text, i, j + 1))) {
        best = t;
        best_end = j + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[best];
    size_t begin = i, end = best_end;
    if (tok.lstrip) {
      while (begin > plain_begin) {
        size_t start;
        if (!unicode::is_whitespace(prev_code_point(text, begin, start))) break;
        begin = start;
      }
    }
    if (tok.rstrip) {
      while (end < text.size()) {
        size_t p = end;
        if (!unicode::is_whitespace(unicode::next_code_point(text, p))) break;
        end = p;
      }
    }
    if (begin > plain_begin) out.push_back({plain_begin, begin, -1});
    out.push_back({begin, end, tok.id});
    plain_begin = i = end;
  }
  if (plain_begin < text.size()) out.push_back({plain_begin, text.size(), -1});
  return out;
}

}  // namespace bs
