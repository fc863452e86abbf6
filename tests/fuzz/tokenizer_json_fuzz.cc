// Fuzzes tokenizer.json loading (model, normalizer, pre-tokenizer, decoder, post-processor, added
// tokens) and, when it loads, encoding and decoding a few fixed texts with it.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tok = bs::Tokenizer::from_json(bs::fuzz::as_text(data, size), "tokenizer.json",
                                      "/nonexistent/blockspec-fuzz");
  if (!tok.ok()) return 0;
  static const char* const kTexts[] = {"",
                                       "Hello world",
                                       " a  b\tc\n\nd ",
                                       "日本語 é ü 🙂",
                                       "<s>x</s><|im_end|>",
                                       "\xff\xfe invalid"};
  for (const char* text : kTexts) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = (*tok)->encode(text, special);
      (void)(*tok)->decode(ids, special);
    }
  }
  const std::vector<int32_t> odd{-1, 0, 1, 2, 3, 255, 256, 65535, 1 << 30};
  (void)(*tok)->decode(odd, false);
  for (int32_t id : odd) {
    (void)(*tok)->id_to_token(id);
    (void)(*tok)->is_special(id);
  }
  return 0;
}
