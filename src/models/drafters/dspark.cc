// DSpark: the DFlash drafter (dflash.cc) plus the Markov head and the confidence head, as
// DFlashModules. Per request (draw), with U_k = the LM-head row of block row k:
//   prev_0 = anchor; for k = 0 .. K-1:
//     e_k = W1[prev_k]                        [r]
//     z_k = U_k + W2 · e_k                    [V]  fp32 (W2 e_k: one [1, r] x [r, V] product)
//           (dspark_draft_topk = t: U_k + W2[ids] · e_k on the t largest U_k, -inf elsewhere)
//     d_k = argmax z_k (greedy) or a draw from filtered_probs(z_k) (sampled; that row is q_k)
//     prev_{k+1} = d_k
//   c_k = sigmoid(proj · [h_k ; e_k] + bias), a_k = c_0 ... c_k (when asked)
// Everything stays on the device, reading the anchor from the block's uploaded ids and writing the
// drafts straight into the draw's ids: the greedy full-vocabulary chain is one
// Backend::markov_chain (on the GPU pruned by the rows' norm bounds: z only for the ids that can
// win, docs/DFLASH.md), the sampled one (or one whose rows are wanted) a Backend::markov_row per
// row (bias GEMV, + U_k and the argmax fused), the top-t chain one Backend::candidate_walk.
#include "models/drafters/dspark.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

#include "io/json_file.h"
#include "models/blocks/weights.h"
#include "models/drafters/dflash.h"
#include "models/drafters/draft_draws.h"

namespace bs {
namespace {

using nlohmann::json;

struct DSparkConfig {
  int64_t markov_rank = 0;
  int64_t draft_topk = 0;  // 0: the bias covers the whole vocabulary
  bool confidence = false;
  // confidence_head_with_markov; nullopt when the config leaves it out: then the width of
  // confidence_head.proj.weight decides ([1, H + r]: true, [1, H]: false) at load.
  std::optional<bool> confidence_with_markov;
};

class DSparkModules final : public DFlashModules {
 public:
  DSparkModules(DSparkConfig c, int64_t hidden, int64_t vocab, int64_t block)
      : c_(c), hidden_(hidden), vocab_(vocab), block_(block) {}

  std::string family() const override { return "dspark"; }
  bool shifted_rows() const override { return true; }
  bool has_confidence() const override { return c_.confidence; }

  Status load(const io::Checkpoint& ckpt, Backend& backend) override {
    backend_ = &backend;
    const int64_t r = c_.markov_rank;
    if (c_.draft_topk > 0 && (c_.draft_topk > kMaxWalkCandidates || r > kMaxWalkRank)) {
      return InvalidArgument(
          "{}: dspark_draft_topk {} / markov_rank {}: the top-t Markov walk supports at most {} "
          "candidates and rank {}",
          ckpt.dir(), c_.draft_topk, r, kMaxWalkCandidates, kMaxWalkRank);
    }
    const auto w1 = {std::string("markov_head.markov_w1.weight"),
                     std::string("markov_head.markov_w1")};
    const auto w2 = {std::string("markov_head.markov_w2.weight"),
                     std::string("markov_head.markov_w2")};
    if (r > 0) {
      const std::string why = fmt::format("dflash_config.markov_rank = {}", r);
      BS_ASSIGN_OR_RETURN(w1_, load_module_tensor(ckpt, backend, w1, {vocab_, r}, why));
      BS_ASSIGN_OR_RETURN(w2_, load_module_tensor(ckpt, backend, w2, {vocab_, r}, why));
      if (c_.draft_topk == 0) {
        // The greedy chain's norm bounds (markov_norm_bounds), from the values the backend holds.
        const std::vector<float> n = markov_norm_bounds(backend.to_host_f32(w2_), vocab_, r);
        norms_ = backend.empty({vocab_}, DType::kF32);
        backend.copy_from_host(norms_, n.data());
      }
    } else if (has_module_tensor(ckpt, w1) || has_module_tensor(ckpt, w2)) {
      return InvalidArgument(
          "{}: the checkpoint has markov_head tensors but dflash_config.markov_rank is 0 or "
          "missing",
          ckpt.dir());
    }
    if (c_.confidence) {
      if (!c_.confidence_with_markov) {
        BS_ASSIGN_OR_RETURN(c_.confidence_with_markov, infer_confidence_with_markov(ckpt));
      }
      const bool with_markov = *c_.confidence_with_markov;
      const int64_t width = hidden_ + (with_markov ? r : 0);
      const std::string why =
          fmt::format("enable_confidence_head, confidence_head_with_markov = {}: [1, hidden {}{}]",
                      with_markov, hidden_, with_markov ? fmt::format(" + markov_rank {}", r) : "");
      BS_ASSIGN_OR_RETURN(
          Tensor proj,
          load_module_tensor(ckpt, backend, {"confidence_head.proj.weight"}, {1, width}, why));
      proj_h_ = backend.empty({1, hidden_}, proj.dtype());
      backend.slice_columns(proj_h_, proj, 0);
      if (with_markov && r > 0) {
        proj_e_ = backend.empty({1, r}, proj.dtype());
        backend.slice_columns(proj_e_, proj, hidden_);
      }
      if (has_module_tensor(ckpt, {"confidence_head.proj.bias"})) {
        BS_ASSIGN_OR_RETURN(Tensor bias,
                            load_module_tensor(ckpt, backend, {"confidence_head.proj.bias"}, {1},
                                               "the confidence head"));
        bias_ = backend.to_host_f32(bias)[0];
      }
    }
    // Scratch for one request's chain (draw runs request by request).
    const int64_t B = block_;
    rows_ = backend.empty({B, vocab_}, DType::kF32);
    if (r > 0) e_ = backend.empty({B, r});
    if (c_.draft_topk > 0) {
      top_vals_ = backend.empty({B, c_.draft_topk}, DType::kF32);
      top_ids_ = backend.empty({B, c_.draft_topk}, DType::kI32);
    }
    if (c_.confidence) conf_ = backend.empty({B, 1}, DType::kF32);
    return Status::Ok();
  }

  void draw(const Tensor& hidden, int64_t /*first_row*/, const Tensor& logits,
            const Tensor& anchor_ids, const DraftDraw& d, const Tensor& rows_out,
            std::vector<float>* confidences) override {
    Backend& b = *backend_;
    const int64_t k = hidden.dim(0), t = c_.draft_topk;
    const bool sampled = d.filter.temperature > 0.0f;
    // prev_0 = the anchor (anchor_ids, uploaded with the block), prev_j = d_{j-1} (d.ids).
    auto prev = [&](int64_t j) { return j == 0 ? anchor_ids : d.ids.rows(j - 1, 1); };
    if (t > 0) {
      // Top-t restricted: one walk over the rows' top-t candidates (bias W2[ids] · W1[prev]).
      b.topk(top_vals_.rows(0, k), top_ids_.rows(0, k), logits);
      b.candidate_walk(d.ids, rows_out, d.probs, anchor_ids, top_vals_.rows(0, k),
                       top_ids_.rows(0, k), w1_, w2_, Tensor(), d.filter, d.uniforms);
    } else if (c_.markov_rank > 0 && !sampled && !rows_out.defined()) {
      // Greedy, ids only: the whole chain in one op.
      b.markov_chain(d.ids, anchor_ids, logits, w1_, w2_, norms_);
    } else {
      // Full vocabulary: one fused launch per row (bias GEMV + U_j, with the argmax when greedy).
      const bool want_rows = rows_out.defined() || sampled;
      const Tensor rows = rows_out.defined() ? rows_out : rows_.rows(0, k);
      for (int64_t j = 0; j < k; ++j) {
        const Tensor z = want_rows ? rows.rows(j, 1) : Tensor();
        const Tensor next = d.ids.rows(j, 1);
        if (c_.markov_rank > 0) {
          b.markov_row(z, sampled ? Tensor() : next, logits.rows(j, 1), prev(j), w1_, w2_);
          if (sampled) draw_row(b, z, next, d, j);
        } else {
          b.scale_softcap(rows.rows(j, 1), logits.rows(j, 1), 1.0f, 0.0f);  // U_j as fp32
          draw_row(b, rows.rows(j, 1), next, d, j);
        }
      }
    }
    if (confidences) {
      if (proj_e_.defined()) {  // e_j = W1[prev_j]
        b.embedding(e_.rows(0, 1), anchor_ids, w1_);
        if (k > 1) b.embedding(e_.rows(1, k - 1), d.ids.rows(0, k - 1), w1_);
      }
      const Tensor conf = conf_.rows(0, k);
      b.matmul(conf, hidden, proj_h_);
      if (proj_e_.defined()) b.matmul(conf, e_.rows(0, k), proj_e_, nullptr, /*accumulate=*/true);
      const std::vector<float> logit = b.to_host_f32(conf);
      confidences->resize(static_cast<size_t>(k));
      double survive = 1.0;
      for (int64_t j = 0; j < k; ++j) {
        survive *= 1.0 / (1.0 + std::exp(-static_cast<double>(logit[j] + bias_)));
        (*confidences)[j] = static_cast<float>(survive);
      }
    }
  }

 private:
  // confidence_head_with_markov left out of the config (SpecForge, vLLM and speculators default
  // it to false; DeepSpec writes it whenever the head exists): the projection's width says which
  // it was trained as, [1, H + markov_rank] or [1, H].
  Result<bool> infer_confidence_with_markov(const io::Checkpoint& ckpt) const {
    const int64_t r = c_.markov_rank;
    BS_ASSIGN_OR_RETURN(
        const std::string name,
        resolve_tensor_name(ckpt, {"confidence_head.proj.weight"}, "enable_confidence_head"));
    BS_ASSIGN_OR_RETURN(const io::TensorInfo* t, ckpt.get(name));
    if (t->shape == std::vector<int64_t>{1, hidden_}) return false;
    if (r > 0 && t->shape == std::vector<int64_t>{1, hidden_ + r}) return true;
    return InvalidArgument(
        "{}: tensor '{}' has shape [{}], expected [1, hidden {}] or [1, hidden {} + markov_rank "
        "{}] (confidence_head_with_markov is absent, so the width decides it)",
        ckpt.dir(), name, fmt::join(t->shape, ", "), hidden_, hidden_, r);
  }

  DSparkConfig c_;
  int64_t hidden_, vocab_, block_;
  Backend* backend_ = nullptr;
  Tensor w1_, w2_;             // [V, r]
  Tensor norms_;               // F32 [V]: bounds of ||w2_[v]|| (full-vocabulary chain only)
  Tensor proj_h_, proj_e_;     // [1, H], [1, r]: the confidence projection's two column blocks
  float bias_ = 0.0f;          // the confidence projection's bias
  Tensor rows_;                // F32 [B, V]: z_j when the caller does not want them
  Tensor e_;                   // [B, r]: W1[prev_j]
  Tensor top_vals_, top_ids_;  // F32 / I32 [B, t]: the top-t of each U_j
  Tensor conf_;                // F32 [B, 1]: confidence logits
};

// A DSpark field, from dflash_config first, then the top level.
const json& field_source(const json& d, const json& j, const char* key) {
  return io::has_field(d, key) ? d : j;
}

}  // namespace

bool names_dspark(const json& config) {
  const auto dspark = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return s.find("dspark") != std::string::npos;
  };
  if (config.contains("architectures") && config["architectures"].is_array()) {
    for (const json& a : config["architectures"]) {
      if (a.is_string() && dspark(a.get<std::string>())) return true;
    }
  }
  return config.contains("model_type") && config["model_type"] == "dspark";
}

namespace {

Result<DSparkConfig> parse_dspark_fields(const json& j, const json& d, const std::string& file,
                                         int64_t vocab) {
  const std::string dfile = file + " (dflash_config)";
  DSparkConfig c;
  // What marks the config as DSpark's: projector_type "dspark" (SpecForge: dflash_config, checked
  // by parse_dflash_config; or the top level), else, with no projector_type anywhere, the class
  // name (DeepSpec's Qwen3DSparkModel writes every field at the top level and no projector_type)
  // or model_type "dspark".
  const json& proj_src = field_source(d, j, "projector_type");
  if (io::has_field(proj_src, "projector_type")) {
    BS_ASSIGN_OR_RETURN(std::string proj, io::get_string(proj_src, "projector_type", file));
    if (proj != "dspark") {
      return Unimplemented("{}: projector_type '{}' is not supported (DSpark: 'dspark')", file,
                           proj);
    }
  } else {
    if (!names_dspark(j)) {
      return InvalidArgument(
          "{}: a DSpark drafter needs projector_type 'dspark' (dflash_config or top level), an "
          "architectures entry naming DSpark, or model_type 'dspark'",
          file);
    }
  }
  for (const char* key : {"dspark_bonus_anchor", "attention_sink_bias"}) {
    BS_ASSIGN_OR_RETURN(bool on, io::get_bool_or(field_source(d, j, key), key, file, false));
    if (on) {
      return Unimplemented(
          "{}: {} = true (Nemotron's DSpark variant: DFlash layout, causal block, attention "
          "sinks) is not supported",
          file, key);
    }
  }
  BS_ASSIGN_OR_RETURN(std::string head_type,
                      io::get_string_or(field_source(d, j, "markov_head_type"), "markov_head_type",
                                        file, "vanilla"));
  if (head_type != "vanilla") {
    return Unimplemented(
        "{}: markov_head_type '{}' is not supported (served: 'vanilla'; the gated and RNN Markov "
        "heads are not)",
        file, head_type);
  }
  BS_ASSIGN_OR_RETURN(c.markov_rank,
                      io::get_int_or(field_source(d, j, "markov_rank"), "markov_rank", file, 0));
  if (c.markov_rank < 0) {
    return InvalidArgument("{}: markov_rank must be >= 0, got {}", dfile, c.markov_rank);
  }
  BS_ASSIGN_OR_RETURN(c.draft_topk, io::get_int_or(field_source(d, j, "dspark_draft_topk"),
                                                   "dspark_draft_topk", file, 0));
  if (c.draft_topk < 0 || c.draft_topk > vocab) {
    return InvalidArgument("{}: dspark_draft_topk {} out of range [0, vocab_size {}]", dfile,
                           c.draft_topk, vocab);
  }
  BS_ASSIGN_OR_RETURN(c.confidence, io::get_bool_or(field_source(d, j, "enable_confidence_head"),
                                                    "enable_confidence_head", file, false));
  if (io::has_field(field_source(d, j, "confidence_head_with_markov"),
                    "confidence_head_with_markov")) {
    BS_ASSIGN_OR_RETURN(c.confidence_with_markov,
                        io::get_bool(field_source(d, j, "confidence_head_with_markov"),
                                     "confidence_head_with_markov", file));
  } else if (c.markov_rank == 0) {
    c.confidence_with_markov = false;  // nothing to feed: no need to look at the tensor
  }
  if (c.confidence && c.confidence_with_markov.value_or(false) && c.markov_rank == 0) {
    return InvalidArgument(
        "{}: confidence_head_with_markov is true but markov_rank is 0 (no Markov embedding to "
        "feed the confidence head)",
        dfile);
  }
  return c;
}

}  // namespace

Result<std::unique_ptr<Drafter>> load_dspark(const std::string& dir, const json& config,
                                             const CausalLM& target,
                                             const DrafterOptions& options) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  BS_ASSIGN_OR_RETURN(DFlashConfig c, parse_dflash_config(config, file, target.config().num_layers,
                                                          DFlashFamily::kDSpark));
  const json empty = json::object();
  const json& d = io::has_field(config, "dflash_config") ? config["dflash_config"] : empty;
  BS_ASSIGN_OR_RETURN(DSparkConfig dc, parse_dspark_fields(config, d, file, c.model.vocab_size));
  auto modules =
      std::make_unique<DSparkModules>(dc, c.model.hidden_size, c.model.vocab_size, c.block_size);
  return load_dflash_family(dir, std::move(c), target, options, std::move(modules));
}

}  // namespace bs
