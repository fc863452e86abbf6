// DFlash2 drafter (z-lab / Inco AI, specs/dflash.md §5): the DFlash backbone and layout plus
// grouped dynamic causal 2-tap convolutions around both sublayers of every layer and a top-K
// candidate selector walk over the draft rows.
//
// Checkpoint format: z-lab / vLLM (dflash_config block_size, conv_kernel_size, conv_group_size,
// selector_rank, selector_top_k, optional output_multiplier, final_logit_softcapping,
// input_embedding_scale; tensors layers.{i}.{attention,mlp}_conv.{base_kernel,
// kernel_projection.weight}, candidate_selector.{predecessor,successor}_codebook[.weight],
// candidate_selector.hidden_projection.weight). docs/DFLASH.md lists what is accepted.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "models/drafter.h"

namespace bs {

Result<std::unique_ptr<Drafter>> load_dflash2(const std::string& dir, const nlohmann::json& config,
                                              const CausalLM& target,
                                              const DrafterOptions& options);

}  // namespace bs
