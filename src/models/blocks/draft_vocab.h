// Model block: a drafter's restricted draft vocabulary (specs/serving.md §1.8). A drafter whose
// head covers only draft_vocab_size < vocab_size tokens ships it as EAGLE-3 / SpecForge offsets,
// tensor `d2t` (I64 [draft_vocab_size]): draft id j stands for target id j + d2t[j]; or (FlashMap
// release folders) as dir/draft_vocab.safetensors with `ids` (target ids, most frequent first).
// FlashMap and DFlash read it through here; `t2d` (bool [vocab]) is redundant and ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/blocks/weights.h"

namespace bs {

struct DraftVocabSource {
  int64_t vocab_size = 0;        // ids must lie in [0, vocab_size)
  int64_t draft_vocab_size = 0;  // the config's value (== vocab_size when unrestricted)
  // Also accept dir/draft_vocab.safetensors when the checkpoint has no d2t (FlashMap releases).
  bool release_file = false;
};

// The target ids of draft ids 0 .. draft_vocab_size - 1 (in draft-id order), or an empty vector
// when the vocabulary is not restricted. A `d2t` of length vocab_size that is all zeros (what
// trainers save when they did not restrict the vocabulary) counts as unrestricted. Errors name the
// tensor or config key: a d2t with an unrestricted draft_vocab_size, the wrong length or dtype; a
// restricted draft_vocab_size without a vocabulary; ids outside [0, vocab_size) or repeated. The
// d2t tensor read is recorded as used in `r`.
Result<std::vector<int32_t>> load_draft_vocab(const std::string& dir, const io::Checkpoint& ckpt,
                                              WeightLoader& r, const DraftVocabSource& src);

// An integer checkpoint tensor (I64 or I32) as int64 values; another dtype is an error naming the
// tensor and `where`.
Result<std::vector<int64_t>> read_int_tensor(const io::TensorInfo& t, const std::string& where);

}  // namespace bs
