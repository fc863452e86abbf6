// tokenizer.json "model" of type BPE: vocab, merges ranked by position, byte_fallback, unk
// (fuse_unk), ignore_merges, continuing_subword_prefix / end_of_word_suffix. Encoding a word is a
// heap-ordered merge over a linked list of symbols; results are cached per word.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_util.h"
#include "tokenizer/token_table.h"
#include "tokenizer/tokenizer_json.h"

namespace bs {

class BpeModel {
 public:
  // Reusable buffers for encode_word (one per encode call; not shared between threads).
  struct Scratch {
    struct Symbol {
      int32_t id;
      int32_t prev;
      int32_t next;
    };
    struct Candidate {
      uint32_t rank;
      int32_t pos;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
    std::vector<uint8_t> dead;
    std::string mapped;
    std::vector<int32_t> ids;
  };

  // Takes the captured vocab and merges out of `tj`; `at` is the path of the "model" object.
  static Result<BpeModel> build(TokenizerJson& tj, const json_util::JsonPath& at);

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of one pre-token (valid UTF-8). With `raw_bytes` the word holds raw bytes
  // that the ByteLevel pre-tokenizer has not mapped yet; the model maps them itself.
  void encode_word(std::string_view word, bool raw_bytes, Scratch& scratch,
                   std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of `id`, or nullopt when the vocab has no such id.
  std::optional<std::string_view> id_to_token(int32_t id) const;
  // Highest id in the vocab (-1 when empty).
  int32_t max_id() const { return vocab_.id_limit() - 1; }
  size_t merge_count() const { return merge_count_; }

 private:
  BpeModel();
  struct MergeTable;
  struct WordCache;

  void word_symbols(std::string_view word, bool raw_bytes, Scratch& scratch) const;
  void merge_word(Scratch& scratch) const;

  TokenTable vocab_;
  std::vector<int32_t> char_ids_;  // single code point < kDirectChars → id (or -1)
  int32_t byte_ids_[256];          // <0xNN> tokens (byte_fallback), -1 if absent
  int32_t byte_char_ids_[256];     // byte-level character of each byte, -1 if absent
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<WordCache> cache_;
  size_t merge_count_ = 0;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
};

}  // namespace bs
