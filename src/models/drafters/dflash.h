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
#include "io/safetensors.h"
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
  // Tokens the drafter's LM head covers: < vocab_size when the checkpoint ships a restricted draft
  // vocabulary (tensor d2t, blocks/draft_vocab.h); == vocab_size otherwise.
  int64_t draft_vocab_size = 0;
};

// Which DFlash-format family a config is parsed for: DSpark and DFlash2 accept the fields that the
// plain DFlash drafter refuses (shifted rows / Markov rank; embedding scale / logit multiplier /
// soft-cap); their own fields are parsed by dspark.cc / dflash2.cc.
enum class DFlashFamily { kDFlash, kDSpark, kDFlash2 };

// What DSpark and DFlash2 add to the DFlash drafter (models/drafters/dspark.cc, dflash2.cc). The
// backbone (observe, the block forward, the paged caches) runs unchanged; the modules hook in at
//   - the block layout: shifted rows (DSpark: row k predicts s+k+1, so B rows give B drafts) and
//     the block embedding scale (DFlash2's input_embedding_scale);
//   - both sublayers of every layer (DFlash2's grouped dynamic convolutions):
//       x = norm(h); conv_prepare(x) -> x'; out = sublayer(x'); h += conv_finish(out)
//   - after the final norm: the draws (DSpark's Markov chain and confidence head, DFlash2's
//     candidate selector walk), which make the family a Drafter::draws_drafts() drafter.
class DFlashModules {
 public:
  virtual ~DFlashModules() = default;
  virtual std::string family() const = 0;
  // Loads the family's tensors (after the backbone's) with the backend the drafter runs on.
  virtual Status load(const io::Checkpoint& ckpt, Backend& backend) = 0;
  virtual bool shifted_rows() const { return false; }
  virtual float input_embedding_scale() const { return 1.0f; }

  // Sublayer convolutions over `rows` block rows (a multiple of `block_rows`), sublayer 0 =
  // attention, 1 = MLP. conv_prepare writes the sublayer input y [rows, H] from the normed x and
  // keeps what conv_finish needs; conv_finish adds the convolved sublayer output to `residual`
  // and, with norm_w defined, writes xn = rms_norm(residual) · norm_w (the norm after it).
  // Scratch for `rows` rows is reserved by reserve_rows (a call that grows it must be followed by
  // a new capture key: the drafter bumps its propose generation).
  virtual bool has_convs() const { return false; }
  virtual void reserve_rows(int64_t rows) { (void)rows; }
  virtual void conv_prepare(int64_t layer, int sublayer, const Tensor& y, const Tensor& x,
                            int64_t block_rows) {
    (void)layer, (void)sublayer, (void)y, (void)x, (void)block_rows;
  }
  virtual void conv_finish(int64_t layer, int sublayer, const Tensor& residual, const Tensor& out,
                           int64_t block_rows, const Tensor& xn, const Tensor& norm_w, float eps) {
    (void)layer, (void)sublayer, (void)residual, (void)out, (void)block_rows, (void)xn,
        (void)norm_w, (void)eps;
  }

  // The block forward's final-normed rows [S·nd, H] (request r's at r·nd) before the LM head,
  // inside the captured forward: draw work that needs no logits may start here, beside the LM
  // head (Backend::run_beside; draw() joins it).
  virtual void before_head(const Tensor& hidden) { (void)hidden; }

  virtual bool has_confidence() const { return false; }
  // Whether draw() needs the LM-head rows in F32 (else the backend's activation dtype, BF16 on
  // the GPU): a family that takes a top-k over them keeps the fp32 order of close logits.
  virtual bool f32_logits() const { return false; }
  // Draws one request's k drafts from its rows: hidden [k, H] (final-normed, rows first_row.. of
  // before_head's), logits [k, V] (their LM-head rows). `rows_out` (F32 [k, V], may be undefined)
  // gets the full-vocabulary logits each draft was chosen from; `confidences` (may be null) the
  // prefix survival a_1..a_k (read back). anchor_ids: I32 [1] on the backend holding the request's
  // anchor (the block's first id, already uploaded), so a draw reads it on the device.
  virtual void draw(const Tensor& hidden, int64_t first_row, const Tensor& logits,
                    const Tensor& anchor_ids, const DraftDraw& d, const Tensor& rows_out,
                    std::vector<float>* confidences) = 0;
};

// Default taps when the config has no target_layer_ids (dflash.md §1.1): one drafter layer ->
// [N / 2]; else round(1 + i (N - 4) / (L - 1)) for i < L, rounding halves to even like Python.
std::vector<int> dflash_default_target_layers(int64_t num_target_layers, int64_t num_draft_layers);

// Parses a DFlash config.json document (`file` names it in errors). `num_target_layers` feeds the
// default target_layer_ids rule.
Result<DFlashConfig> parse_dflash_config(const nlohmann::json& config, const std::string& file,
                                         int64_t num_target_layers,
                                         DFlashFamily family = DFlashFamily::kDFlash);

// Loads dir (config.json already parsed into `config`) against `target`: validates hidden size,
// vocabulary, tapped layers, mask id and the fc shape, with errors naming the field or tensor.
Result<std::unique_ptr<Drafter>> load_dflash(const std::string& dir, const nlohmann::json& config,
                                             const CausalLM& target, const DrafterOptions& options);

// The shared loader of the family: validates `c` against the target (errors naming the field),
// loads the backbone and then `modules` (null: plain DFlash).
Result<std::unique_ptr<Drafter>> load_dflash_family(const std::string& dir, DFlashConfig c,
                                                    const CausalLM& target,
                                                    const DrafterOptions& options,
                                                    std::unique_ptr<DFlashModules> modules);

}  // namespace bs
