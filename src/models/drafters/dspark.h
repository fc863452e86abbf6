// DSpark drafter (DeepSeek / PKU, specs/dflash.md §4): the DFlash backbone with shifted rows
// (the block [anchor, MASK x (B-1)] gives B drafts, row k predicting s+k+1), a rank-r Markov logit
// bias chained left to right, an optional top-k restricted bias and a confidence head.
//
// Checkpoint format: SpecForge (config dflash_config.projector_type "dspark", markov_rank,
// markov_head_type, enable_confidence_head, confidence_head_with_markov, dspark_draft_topk) and
// DeepSpec (architectures ["Qwen3DSparkModel"], the same keys at the top level, no projector_type);
// tensors markov_head.markov_w{1,2}[.weight],
// confidence_head.proj.{weight,bias}, with or without "model.". docs/DFLASH.md lists what is
// accepted and refused.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "models/drafter.h"

namespace bs {

// The config names DSpark as its class: an architectures entry containing "dspark" in any case
// (DeepSpec's "Qwen3DSparkModel", SpecForge's "DSparkDraftModel") or model_type "dspark".
bool names_dspark(const nlohmann::json& config);

Result<std::unique_ptr<Drafter>> load_dspark(const std::string& dir, const nlohmann::json& config,
                                             const CausalLM& target, const DrafterOptions& options);

}  // namespace bs
