// DFlash block drafter (z-lab, specs/dflash.md §1): a few Qwen3-style layers that draft a whole
// block [anchor, MASK x (B-1)] in one non-causal forward. Tapped target hidden states of the
// committed positions are fused by fc + hidden_norm and injected as extra K/V into every layer
// ("KV injection"); the embedding and LM head are the target's unless the checkpoint ships its own.
//
// Checkpoint format: the one users download (Qwen3-8B-DFlash-b16 layout, docs/DFLASH.md lists the
// accepted config spellings).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/hf_config.h"
#include "models/drafter.h"

namespace bs {

// DFlash fields of a drafter config.json, resolved and validated against nothing but itself.
struct DFlashConfig {
  io::TransformerConfig model;             // the drafter backbone (a Qwen3Config)
  int64_t block_size = 0;                  // B: anchor + B-1 mask rows; B-1 drafts per propose
  int64_t mask_token_id = -1;              // embedding row of the mask rows
  std::vector<int> target_layers;          // 0-based target layers tapped, in fc column order
  int64_t num_target_layers = 0;           // the config's num_target_layers; 0 when absent
  std::vector<AttentionMask> layer_masks;  // per drafter layer (causal / sliding window)
};

// Default taps when the config has no target_layer_ids (dflash.md §1.1): one drafter layer ->
// [N / 2]; else round(1 + i (N - 4) / (L - 1)) for i < L, rounding halves to even like Python.
std::vector<int> dflash_default_target_layers(int64_t num_target_layers, int64_t num_draft_layers);

// Parses a DFlash config.json document (`file` names it in errors). `num_target_layers` feeds the
// default target_layer_ids rule.
Result<DFlashConfig> parse_dflash_config(const nlohmann::json& config, const std::string& file,
                                         int64_t num_target_layers);

// Loads dir (config.json already parsed into `config`) against `target`: validates hidden size,
// vocabulary, tapped layers, mask id and the fc shape, with errors naming the field or tensor.
Result<std::unique_ptr<Drafter>> load_dflash(const std::string& dir, const nlohmann::json& config,
                                             const CausalLM& target, const DrafterOptions& options);

}  // namespace bs
