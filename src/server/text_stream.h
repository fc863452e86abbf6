// Streamed completion text: token ids in, final UTF-8 text out, cut at the first stop string.
//
//   TextStream text(tokenizer, {"\n\n", "The end"});
//   for (id : committed) { out += text.push(id); if (text.stopped()) break; }
//   out += text.finish();
//
// Text that could still turn into a stop string is held back until it cannot; everything after
// a matched stop string is dropped, and the stop string too unless options.include_stop (vLLM's
// include_stop_str_in_output). Special tokens read as nothing unless options.skip_special_tokens
// is false (vLLM's field; e.g. "</s>" then ends the text with its content). Chunks never split a
// UTF-8 character (the StreamDecoder holds incomplete bytes; held-back text starts where a stop
// string starts).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace bs::server {

struct TextStreamOptions {
  bool include_stop = false;
  bool skip_special_tokens = true;
  // vLLM's min_tokens: stop strings are looked for only once this many tokens are out (a match
  // then ends in the text of that token or a later one).
  int64_t min_tokens = 0;
};

class TextStream {
 public:
  // Empty stop strings are ignored. `tokenizer` must outlive this. `context`: the tokens before
  // the stream (the prompt), decoded and dropped, so that the stream's text continues theirs
  // (e.g. a word's leading space kept where a decode from the start would strip it; see
  // StreamDecoder).
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop,
             std::span<const int32_t> context = {}, TextStreamOptions options = {});

  // The text that is final after token `id` (possibly empty). Nothing after stopped().
  std::string push(int32_t id);
  // True once a stop string has matched.
  bool stopped() const { return stopped_; }
  // The held-back rest at the end of generation (empty after a stop).
  std::string finish();

 private:
  // Moves text from pending_ to the returned string: up to a stop string, or all but the
  // longest suffix that begins some stop string.
  std::string release();

  StreamDecoder decoder_;
  std::vector<std::string> stop_;
  bool include_stop_ = false;
  int64_t min_tokens_ = 0;
  int64_t pushed_ = 0;   // tokens pushed
  std::string pending_;  // decoded, not yet released
  bool stopped_ = false;
};

// Token strings for logprobs: the text a token adds after the tokens committed before it (the
// prompt, then the reply so far; a word's leading space kept, as decoding in context gives it),
// for the committed token and for its alternatives alike. Special tokens read as their content
// (e.g. "</s>"); a token that ends inside a UTF-8 character reads with U+FFFD for the incomplete
// bytes.
class TokenTexts {
 public:
  // `context`: the tokens committed first (the prompt).
  explicit TokenTexts(const Tokenizer& tokenizer, std::span<const int32_t> context = {});

  // The text of `id` after the committed tokens (the context is unchanged).
  std::string text(int32_t id) const;
  // Appends `id` to the context.
  void commit(int32_t id);

 private:
  StreamDecoder decoder_;
};

}  // namespace bs::server
