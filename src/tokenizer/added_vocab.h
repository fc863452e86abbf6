// Added tokens (tokenizer.json "added_tokens"): matched in the text before the model runs,
// leftmost-longest, honouring single_word / lstrip / rstrip. Tokens with normalized = false are
// matched in the raw text, the others in the normalized text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bs {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  // A piece of the text: either plain text or one added token (id >= 0). For a token, [begin, end)
  // also covers the whitespace absorbed by lstrip / rstrip.
  struct Segment {
    size_t begin, end;
    int32_t id;
  };

  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  bool empty() const { return nodes_.size() <= 1; }
  // Splits valid UTF-8 text into plain segments and tokens; empty plain segments are dropped.
  std::vector<Segment> split(std::string_view text) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_ when a token ends here
  };
  int32_t child(int32_t node, unsigned char c) const;
  bool boundary_ok(std::string_view text, size_t begin, size_t end) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace bs
