// DFlash2: the DFlash drafter (dflash.cc) plus, as DFlashModules:
//
// Convolutions, per layer and sublayer, over the B rows of each block (zero before row 0):
//   D = x · Wprojᵀ as [rows, 2, K, G]            (one GEMM gives both dynamic kernels)
//   conv(x, D, base)[i, c] = Σ_t (base[t, c] + D[i, t, c / group]) · x[i - t, c]
//   prepare: x' = conv(x, D[:, 0], base[0])      finish: h += conv(out, D[:, 1], base[1])
//
// Selector walk, per request, fp32 scores (specs/dflash.md §5.4):
//   u = lm_head(h) × output_multiplier, soft-capped;  U, C = top-K(u)
//   z_p = hidden_projection · h_p                 (all rows at once)
//   S_p[k] = U_p[k] + Σ_i A[pred, i] · z_p[i] · Bc[C_p[k], i]   (pred = anchor, then d_{p-1})
//   S_p scattered into -inf over the vocabulary: argmax (greedy; exact ties of S go to the lower
//   token id) or a draw from filtered_probs (sampled; softmax(S_p / T) over the candidates at
//   plain temperature), which is q.
#include "models/drafters/dflash2.h"

#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <vector>

#include "io/json_file.h"
#include "models/drafters/dflash.h"
#include "models/drafters/draft_draws.h"

namespace bs {
namespace {

using nlohmann::json;

struct DFlash2Config {
  int64_t taps = 0;   // conv_kernel_size
  int64_t group = 0;  // conv_group_size (channels per dynamic-kernel group)
  int64_t rank = 0;   // selector_rank
  int64_t top_k = 16;
  float multiplier = 1.0f;
  float softcap = 0.0f;  // 0: none
  float embedding_scale = 1.0f;
};

class DFlash2Modules final : public DFlashModules {
 public:
  DFlash2Modules(DFlash2Config c, int64_t layers, int64_t hidden, int64_t vocab, int64_t block)
      : c_(c), layers_(layers), hidden_(hidden), vocab_(vocab), block_(block) {}

  std::string family() const override { return "dflash2"; }
  float input_embedding_scale() const override { return c_.embedding_scale; }
  bool has_convs() const override { return true; }
  // The unary values u and their top-K are fp32 (specs/dflash.md §5.4). BF16 LM-head rows (the
  // GPU's activation dtype) round close logits into exact ties, which topk then gives to the
  // lowest ids: a set of near-equal logits (e.g. the stories260K byte tokens, within 1e-3 of each
  // other) turns into candidates 2, 3, 7, 9, ... that the fp32 order would not pick.
  bool f32_logits() const override { return true; }

  Status load(const io::Checkpoint& ckpt, Backend& backend) override {
    backend_ = &backend;
    const int64_t H = hidden_, K = c_.taps, G = H / c_.group, R = c_.rank, V = vocab_;
    const std::string conv_why = fmt::format(
        "dflash_config.conv_kernel_size {}, conv_group_size {} (hidden {})", K, c_.group, H);
    for (int64_t l = 0; l < layers_; ++l) {
      for (const char* sub : {"attention_conv", "mlp_conv"}) {
        const std::string p = fmt::format("layers.{}.{}.", l, sub);
        Conv conv;
        BS_ASSIGN_OR_RETURN(
            conv.base, load_module_tensor(ckpt, backend, {p + "base_kernel"}, {2, K, H}, conv_why));
        conv.base = conv.base.view({2 * K, H});
        BS_ASSIGN_OR_RETURN(conv.proj,
                            load_module_tensor(ckpt, backend, {p + "kernel_projection.weight"},
                                               {2 * K * G, H}, conv_why));
        convs_.push_back(conv);
      }
    }
    if (c_.top_k > kMaxWalkCandidates || R > kMaxWalkRank) {
      return InvalidArgument(
          "{}: selector_top_k {} / selector_rank {}: the selector walk supports at most {} "
          "candidates and rank {}",
          ckpt.dir(), c_.top_k, R, kMaxWalkCandidates, kMaxWalkRank);
    }
    const std::string why = fmt::format("dflash_config.selector_rank = {}", R);
    BS_ASSIGN_OR_RETURN(pred_,
                        load_module_tensor(ckpt, backend,
                                           {"candidate_selector.predecessor_codebook",
                                            "candidate_selector.predecessor_codebook.weight"},
                                           {V, R}, why));
    BS_ASSIGN_OR_RETURN(succ_, load_module_tensor(ckpt, backend,
                                                  {"candidate_selector.successor_codebook",
                                                   "candidate_selector.successor_codebook.weight"},
                                                  {V, R}, why));
    BS_ASSIGN_OR_RETURN(
        hproj_, load_module_tensor(ckpt, backend, {"candidate_selector.hidden_projection.weight"},
                                   {R, H}, why));
    // Walk scratch for one request (draw runs request by request).
    const int64_t B = block_, T = c_.top_k;
    if (c_.multiplier != 1.0f || c_.softcap != 0.0f) u_ = backend.empty({B, V}, DType::kF32);
    vals_ = backend.empty({B, T}, DType::kF32);
    cands_ = backend.empty({B, T}, DType::kI32);
    rank_ = R;
    return Status::Ok();
  }

  void reserve_rows(int64_t rows) override {
    const int64_t width = 2 * c_.taps * (hidden_ / c_.group);
    if (!dyn_.defined() || dyn_.dim(0) < rows) dyn_ = backend_->empty({rows, width});
    if (!z_.defined() || z_.dim(0) < rows) z_ = backend_->empty({rows, rank_});
  }
  // z = hidden_projection · h for every drafted row, beside the LM head (draw joins it).
  void before_head(const Tensor& hidden) override {
    const Tensor z = z_.rows(0, hidden.dim(0));
    backend_->run_beside([&] { backend_->matmul(z, hidden, hproj_); });
  }
  void conv_prepare(int64_t layer, int sublayer, const Tensor& y, const Tensor& x,
                    int64_t block_rows) override {
    const Conv& conv = convs_[layer * 2 + sublayer];
    backend_->projected_conv(y, dyn_.rows(0, x.dim(0)), x, conv.proj, conv.base.rows(0, c_.taps),
                             c_.group, block_rows);
  }
  void conv_finish(int64_t layer, int sublayer, const Tensor& residual, const Tensor& out,
                   int64_t block_rows, const Tensor& xn, const Tensor& norm_w, float eps) override {
    const Conv& conv = convs_[layer * 2 + sublayer];
    const Tensor dyn = dyn_.rows(0, out.dim(0)), base = conv.base.rows(c_.taps, c_.taps);
    if (norm_w.defined()) {
      backend_->dynamic_conv_rms_norm(xn, residual, out, dyn, base, c_.group, block_rows, norm_w,
                                      eps);
    } else {
      backend_->dynamic_conv(residual, out, dyn, 1, base, c_.group, block_rows,
                             /*accumulate=*/true);
    }
  }

  void draw(const Tensor& hidden, int64_t first_row, const Tensor& logits, const Tensor& anchor_ids,
            const DraftDraw& d, const Tensor& rows_out, std::vector<float>* confidences) override {
    (void)confidences;  // no confidence head
    Backend& b = *backend_;
    const int64_t k = hidden.dim(0);
    // z_p = hidden_projection · h_p came with the block forward (before_head).
    const Tensor vals = vals_.rows(0, k), cands = cands_.rows(0, k), z = z_.rows(first_row, k);
    if (c_.multiplier == 1.0f && c_.softcap == 0.0f) {
      b.topk(vals, cands, logits);  // u = the logits themselves
    } else {
      const Tensor u = u_.rows(0, k);
      b.scale_softcap(u, logits, c_.multiplier, c_.softcap);
      b.topk(vals, cands, u);
    }
    b.join_beside();  // z
    // The anchor is read on the device (anchor_ids), so the draw queues no host copy.
    // The sequential part in one op: S_p[c] = U_p[c] + sum_i A[pred_p, i] Bc[C_p[c], i] z_p[i].
    b.candidate_walk(d.ids, rows_out, d.probs, anchor_ids, vals, cands, pred_, succ_, z, d.filter,
                     d.uniforms);
  }

 private:
  struct Conv {
    Tensor base;  // [2 * K, H]: rows 0..K-1 prepare, K..2K-1 finish
    Tensor proj;  // [2 * K * G, H]
  };
  DFlash2Config c_;
  int64_t layers_, hidden_, vocab_, block_;
  Backend* backend_ = nullptr;
  std::vector<Conv> convs_;  // [layer * 2 + sublayer]
  Tensor pred_, succ_;       // [V, R]
  Tensor hproj_;             // [R, H]
  Tensor dyn_;               // [rows, 2 * K * G]: the current sublayer's dynamic kernels
  Tensor u_;                 // F32 [B, V]: unary logits (scaled / soft-capped)
  Tensor vals_, cands_;      // F32 / I32 [B, T]
  Tensor z_;                 // [rows, R]: hidden_projection · h_p of the block forward's rows
  int64_t rank_ = 0;         // R
};

Result<DFlash2Config> parse_dflash2_fields(const json& j, const json& d, const std::string& file,
                                           int64_t hidden, int64_t vocab) {
  const std::string dfile = file + " (dflash_config)";
  DFlash2Config c;
  // dflash_config first, then the top level (z-lab's reference reads both, in that order).
  auto src = [&](const char* key) -> const json& { return io::has_field(d, key) ? d : j; };
  auto where = [&](const char* key) -> const std::string& {
    return io::has_field(d, key) ? dfile : file;
  };
  for (const char* key : {"conv_kernel_size", "conv_group_size", "selector_rank"}) {
    if (!io::has_field(src(key), key)) {
      return InvalidArgument(
          "{}: missing field '{}' (a DFlash2 drafter; looked in dflash_config and at the top "
          "level)",
          file, key);
    }
  }
  BS_ASSIGN_OR_RETURN(
      c.taps, io::get_int(src("conv_kernel_size"), "conv_kernel_size", where("conv_kernel_size")));
  BS_ASSIGN_OR_RETURN(
      c.group, io::get_int(src("conv_group_size"), "conv_group_size", where("conv_group_size")));
  BS_ASSIGN_OR_RETURN(c.rank,
                      io::get_int(src("selector_rank"), "selector_rank", where("selector_rank")));
  BS_ASSIGN_OR_RETURN(c.top_k, io::get_int_or(src("selector_top_k"), "selector_top_k",
                                              where("selector_top_k"), 16));
  if (c.taps < 1)
    return InvalidArgument("{}: conv_kernel_size must be >= 1, got {}", dfile, c.taps);
  if (c.group < 1 || hidden % c.group != 0) {
    return InvalidArgument("{}: conv_group_size {} must divide hidden_size {}", dfile, c.group,
                           hidden);
  }
  if (c.rank < 1) return InvalidArgument("{}: selector_rank must be >= 1, got {}", dfile, c.rank);
  if (c.top_k < 1 || c.top_k > vocab) {
    return InvalidArgument("{}: selector_top_k {} out of range [1, vocab_size {}]", dfile, c.top_k,
                           vocab);
  }
  auto number = [&](const char* key, double dflt) -> Result<double> {
    return io::get_float_or(io::has_field(d, key) ? d : j, key, file, dflt);
  };
  BS_ASSIGN_OR_RETURN(double mult, number("output_multiplier", 1.0));
  BS_ASSIGN_OR_RETURN(double cap, number("final_logit_softcapping", 0.0));
  BS_ASSIGN_OR_RETURN(double scale, number("input_embedding_scale", 1.0));
  if (!(mult > 0.0)) {
    return InvalidArgument("{}: output_multiplier must be > 0, got {}", file, mult);
  }
  if (cap < 0.0) {
    return InvalidArgument("{}: final_logit_softcapping must be >= 0, got {}", file, cap);
  }
  c.multiplier = static_cast<float>(mult);
  c.softcap = static_cast<float>(cap);
  c.embedding_scale = static_cast<float>(scale);
  return c;
}

}  // namespace

Result<std::unique_ptr<Drafter>> load_dflash2(const std::string& dir, const json& config,
                                              const CausalLM& target,
                                              const DrafterOptions& options) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  BS_ASSIGN_OR_RETURN(DFlashConfig c, parse_dflash_config(config, file, target.config().num_layers,
                                                          DFlashFamily::kDFlash2));
  const json empty = json::object();
  const json& d = io::has_field(config, "dflash_config") ? config["dflash_config"] : empty;
  BS_ASSIGN_OR_RETURN(DFlash2Config dc, parse_dflash2_fields(config, d, file, c.model.hidden_size,
                                                             c.model.vocab_size));
  auto modules = std::make_unique<DFlash2Modules>(dc, c.model.num_layers, c.model.hidden_size,
                                                  c.model.vocab_size, c.block_size);
  return load_dflash_family(dir, std::move(c), target, options, std::move(modules));
}

}  // namespace bs
