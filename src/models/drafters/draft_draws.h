// Small pieces shared by the DFlash relatives' modules (dspark.cc, dflash2.cc): loading a module
// tensor whose shape comes from a config key, and drawing one draft from one logits row.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "models/drafter.h"

namespace bs {

// Loads the first present spelling of a drafter tensor (with or without the "model." prefix),
// requiring `shape`. A missing tensor is NotFound naming every spelling and `why` (the config key
// that asks for it); a wrong shape is InvalidArgument naming the tensor, both shapes and `why`.
Result<Tensor> load_module_tensor(const io::Checkpoint& ckpt, Backend& backend,
                                  std::initializer_list<std::string> spellings,
                                  std::vector<int64_t> shape, std::string_view why);

// True when any spelling of the tensor is present.
bool has_module_tensor(const io::Checkpoint& ckpt, std::initializer_list<std::string> spellings);

// The largest candidate walk (Backend::candidate_walk) the relatives accept: candidates per row
// (DFlash2's selector_top_k, DSpark's dspark_draft_topk) and rank (the CUDA walk keeps one row
// of scores and two rank vectors in shared memory).
inline constexpr int64_t kMaxWalkCandidates = 1024;
inline constexpr int64_t kMaxWalkRank = 4096;

// Draft j of a DraftDraw from its full-vocabulary logits row [1, V] into out (I32 [1]): the
// argmax when greedy, else a draw from filtered_probs(row, d.filter) with uniform j, the
// distribution left in d.probs row j (the rejection sampling's q).
void draw_row(Backend& backend, const Tensor& row, const Tensor& out, const DraftDraw& d,
              int64_t j);

}  // namespace bs
