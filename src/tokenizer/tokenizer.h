// Hugging Face tokenizer.json tokenizer (BPE: byte-level as in Qwen2/3 and Llama-3, or
// SentencePiece-style with byte fallback as in Llama-2 / stories260K) and a streaming detokenizer.
//
//   BS_ASSIGN_OR_RETURN(auto tok, Tokenizer::load("models/qwen3"));
//   std::vector<int32_t> ids = tok->encode("Hello world", /*add_special_tokens=*/false);
//   std::string text = tok->decode(ids);
//
// Encoding: added tokens are matched in the raw text (longest first), the rest is normalized,
// pre-tokenized and BPE-merged; decoding is the inverse through the tokenizer.json decoder.
// All const methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/token_table.h"

namespace bs {

class Tokenizer {
 public:
  // `dir` holds tokenizer.json and optionally tokenizer_config.json; config.json and
  // generation_config.json are read for bos/eos only when tokenizer_config.json lacks them.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& dir);
  // The same from tokenizer.json's text (`path` names it in errors); the configs are read from
  // `dir` (none when it has none).
  static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view text,
                                                      const std::string& path,
                                                      const std::string& dir);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special_tokens: apply the post-processor template / add_bos_token (BOS prepended per the
  // tokenizer config). Invalid UTF-8 in `text` is replaced with U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Unknown ids are skipped. Invalid byte sequences become U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t bos_id() const { return bos_id_; }  // -1 when none
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool add_bos() const { return add_bos_; }
  int64_t vocab_size() const { return vocab_size_; }  // highest id + 1 (vocab and added tokens)
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of `id` (added-token content or model token), nullopt when unknown.
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

 private:
  friend class StreamDecoder;
  Tokenizer(BpeModel model, Normalizer normalizer, PreTokenizer pre_tokenizer, DecoderSpec decoder);

  Status init_added_tokens(const json_util::Json& doc, const json_util::JsonPath& at);
  Status init_special_config(const std::string& dir, const SpecialTokenFrame& frame);
  void build_pieces();
  // Decodes one id into `state` (respecting skip_special_tokens), appending final text to out.
  void decode_one(int32_t id, bool skip_special_tokens, DecodeState& state, std::string& out) const;

  BpeModel model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  DecoderSpec decoder_;
  std::vector<AddedToken> added_tokens_;
  AddedTokenMatcher raw_matcher_;         // added tokens with normalized = false
  AddedTokenMatcher normalized_matcher_;  // added tokens with normalized = true
  TokenTable added_ids_;
  std::vector<DecodePiece> pieces_;  // per id
  std::vector<uint8_t> known_;       // per id: 1 when the id has a token
  std::vector<uint8_t> special_;     // per id
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  bool add_bos_ = false;
  bool clean_up_spaces_ = false;
  int64_t vocab_size_ = 0;
};

// Incremental detokenizer for streaming: push ids one at a time and get the text that is now
// final. Never emits part of a UTF-8 character (incomplete byte-fallback / byte-level sequences
// are held back) and strips like a full decode: the concatenation of all pushes and flush()
// equals decode(all ids), and every returned chunk is valid UTF-8.
//
// With a context (e.g. the prompt), the pushes continue the context's text, as vLLM's
// incremental detokenizer does: they return decode(context + pushed) minus decode(context). A
// decoder's whole-text rules then apply to the whole text, not to the continuation alone, e.g.
// SentencePiece's Strip of one leading space: after "Tom had a red", "▁ball" reads " ball", not
// "ball". Text the context still held back (an incomplete UTF-8 character, a space awaiting
// clean-up) is the context's: dropped when the continuation repeats it unchanged, released with
// the continuation when the continuation changes it (e.g. completes the character).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false,
                         std::span<const int32_t> context = {});

  std::string push(int32_t id);
  // Ends the stream (held-back incomplete bytes become U+FFFD); the decoder then starts afresh,
  // without context.
  std::string flush();
  // Appends `ids` to the context: their text, and whatever pushed text is still held back,
  // becomes context (decoded and dropped).
  void add_context(std::span<const int32_t> ids);

 private:
  // Drops from the front of `out` the context's held-back text that it repeats.
  void drop_context_text(std::string& out);

  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  DecodeState state_;
  std::string context_held_;  // the context's text that state_ still holds back
};

}  // namespace bs
