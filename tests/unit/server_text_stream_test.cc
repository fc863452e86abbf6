// server::TextStream: incremental detokenization cut at stop strings.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/text_stream.h"
#include "tokenizer/tokenizer.h"

namespace bs::server {
namespace {

const std::string kModel = std::string(BS_SOURCE_DIR) + "/models/stories260K";

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += n;
  }
  return true;
}

// Pushes the ids of `text` one by one; returns the chunks (finish() last).
std::vector<std::string> run(const Tokenizer& tok, const std::string& text,
                             std::vector<std::string> stop, bool* stopped,
                             TextStreamOptions options = {}) {
  TextStream stream(tok, std::move(stop), {}, options);
  std::vector<std::string> chunks;
  for (int32_t id : tok.encode(text, /*add_special_tokens=*/true)) {
    chunks.push_back(stream.push(id));
    if (stream.stopped()) break;
  }
  chunks.push_back(stream.finish());
  *stopped = stream.stopped();
  return chunks;
}

std::string join(const std::vector<std::string>& chunks) {
  std::string s;
  for (const auto& c : chunks) s += c;
  return s;
}

TEST(TextStream, WithoutStopStringsEqualsDecode) {
  auto tok = Tokenizer::load(kModel);
  ASSERT_TRUE(tok.ok());
  const std::string text = "Tom had a red ball. Caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80 end";
  bool stopped = true;
  const auto chunks = run(**tok, text, {}, &stopped);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(join(chunks), (*tok)->decode((*tok)->encode(text, true), true));
  for (const auto& c : chunks) EXPECT_TRUE(valid_utf8(c)) << c;
}

TEST(TextStream, CutsAtTheEarliestStopStringAcrossTokens) {
  auto tok = Tokenizer::load(kModel);
  ASSERT_TRUE(tok.ok());
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  bool stopped = false;
  // "e, th" spans several tokens; "little" comes later; "zebra" never.
  const auto chunks = run(**tok, text, {"zebra", "little", "e, th", ""}, &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(join(chunks), "Once upon a tim");
  // No chunk ever carried text of the stop string.
  for (const auto& c : chunks) EXPECT_EQ(c.find(','), std::string::npos) << c;
}

TEST(TextStream, HeldBackPrefixIsReleasedWhenItDoesNotMatch) {
  auto tok = Tokenizer::load(kModel);
  ASSERT_TRUE(tok.ok());
  const std::string text = "Lily and Lilo";
  bool stopped = true;
  const auto chunks = run(**tok, text, {"Lilac", "o!"}, &stopped);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(join(chunks), "Lily and Lilo");
}

// include_stop: the text ends with the matched stop string. min_tokens: stop strings are matched
// only once N tokens are out (vLLM's rule), so one in the text of the first N - 1 does not end it.
TEST(TextStream, IncludeStopAndMinTokens) {
  auto tok = Tokenizer::load(kModel);
  ASSERT_TRUE(tok.ok());
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  bool stopped = false;
  EXPECT_EQ(join(run(**tok, text, {"little"}, &stopped, {.include_stop = true})),
            "Once upon a time, there was a little");
  EXPECT_TRUE(stopped);
  // With min_tokens past the token whose text holds the first "a", the next "a" ends it.
  const std::vector<int32_t> ids = (*tok)->encode(text, true);
  const std::string first = join(run(**tok, text, {"a"}, &stopped));
  EXPECT_EQ(first, "Once upon ");
  size_t n = 0;  // the tokens whose text holds the first "a"
  while ((*tok)->decode({ids.begin(), ids.begin() + static_cast<long>(n)}, true).find('a') ==
         std::string::npos) {
    ++n;
  }
  const std::string later =
      join(run(**tok, text, {"a"}, &stopped, {.min_tokens = static_cast<int64_t>(n) + 1}));
  EXPECT_TRUE(stopped);
  EXPECT_GT(later.size(), first.size());
  EXPECT_EQ(later, text.substr(0, text.find('a', first.size() + 1)));
  EXPECT_EQ(join(run(**tok, text, {"a"}, &stopped, {.min_tokens = 1000})), text);
  EXPECT_FALSE(stopped);
}

// After a prompt, the reply's text and its tokens' logprob texts continue the prompt's text:
// " ball." and " b…", where a decode of the reply alone reads "ball." (SentencePiece's decoder
// strips one leading space of the whole text, not of the reply). vLLM returns " ball." too.
TEST(TextStream, ContinuesThePromptsText) {
  auto tok = Tokenizer::load(kModel);
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> prompt = (*tok)->encode("Tom had a red", true);
  const std::vector<int32_t> all = (*tok)->encode("Tom had a red ball. The end", true);
  ASSERT_EQ(std::vector<int32_t>(all.begin(), all.begin() + prompt.size()), prompt);
  TextStream stream(**tok, {". The"}, prompt);
  TokenTexts texts(**tok, prompt);
  std::string out, joined;
  for (size_t i = prompt.size(); i < all.size() && !stream.stopped(); ++i) {
    out += stream.push(all[i]);
    joined += texts.text(all[i]);
    texts.commit(all[i]);
  }
  out += stream.finish();
  EXPECT_EQ(out, " ball");
  EXPECT_EQ(joined.substr(0, 6), " ball.");
  // The first token's text and an alternative's keep their space.
  const TokenTexts first(**tok, prompt);
  EXPECT_EQ(first.text(all[prompt.size()]).front(), ' ');
  EXPECT_EQ(first.text(*(*tok)->token_to_id("▁little")), " little");
}

}  // namespace
}  // namespace bs::server
