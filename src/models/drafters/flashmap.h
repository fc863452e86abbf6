// FlashMap block drafter (seeds/000): a DiT over block slots that maps noise to draft tokens
// in one (or a few) flow-map jumps, cross-attending to target context features.
// Math and field mapping: specs/flashmap.md; decisions and checkpoint format: docs/FLASHMAP.md.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "models/drafter.h"

namespace bs {

// A loaded FlashMap drafter, with the hooks tests and tools need beyond the Drafter interface.
class FlashMapDrafter : public Drafter {
 public:
  // Jumps per draft (the checkpoint's num_steps unless DrafterOptions overrides it).
  virtual int num_steps() const = 0;
  // True when the one-jump step runs folded (eigenbasis noise, no vocabulary-sized tensor).
  virtual bool folded() const = 0;
  // Columns of one slot's starting noise: target_hidden_size when folded, else vocab_size().
  virtual int64_t noise_dim() const = 0;
  // The drafter's vocabulary rows (config vocab_size, <= the target's vocabulary).
  virtual int64_t vocab_size() const = 0;
  // Target ids the head drafts over (row j of the head is token ids[j]); empty when it covers
  // the whole target vocabulary. Every other logit is -inf.
  virtual std::vector<int32_t> draft_vocab() const = 0;
  // Test hook: the next propose starts from `noise` [block_size, noise_dim()] (standard normals,
  // still multiplied by the noise scale) instead of the seeded draw.
  virtual void inject_noise(std::vector<float> noise) = 0;
  // Test hook: the eigenbasis noise z [rows, target_hidden] whose folded read-out equals that of
  // vocabulary-space noise x0 [rows, vocab_size()] (U Λ^½ z = Eᵀ x0, 0 on dropped directions).
  virtual Result<std::vector<float>> eigen_noise_from_vocab(std::span<const float> x0) const = 0;
};

struct FlashMapLoadOptions {
  // false: run one-jump drafts with the exact vocabulary-sized algorithm instead of the fold
  // (tests compare the two).
  bool fold_one_jump = true;
};

// `config` is dir/config.json, already parsed.
Result<std::unique_ptr<Drafter>> load_flashmap(const std::string& dir, const nlohmann::json& config,
                                               const CausalLM& target,
                                               const DrafterOptions& options);

Result<std::unique_ptr<FlashMapDrafter>> load_flashmap_drafter(
    const std::string& dir, const nlohmann::json& config, const CausalLM& target,
    const DrafterOptions& options, const FlashMapLoadOptions& load_options = {});

}  // namespace bs
