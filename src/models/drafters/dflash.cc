// DFlash drafter: config parsing, loading, observe (context K/V injection) and propose (one
// non-causal block forward). Math: specs/dflash.md §1.3; engine practice: serving.md §0, §1.3.
#include "models/drafters/dflash.h"

#include <fmt/format.h>

#include <cfenv>
#include <cmath>
#include <filesystem>
#include <limits>

#include "io/json_file.h"
#include "io/safetensors.h"
#include "models/blocks/context_kv.h"
#include "models/blocks/decoder_layer.h"
#include "models/blocks/draft_vocab.h"
#include "models/blocks/paged_kv.h"
#include "models/blocks/weights.h"
#include "models/rope.h"
#include "models/weight_budget.h"

namespace bs {
namespace {

using nlohmann::json;

// Rows of `seqs` blocks of B (one block per sequence of a propose_batch).
struct ProposeScratch : LayerActivations {
  int64_t seqs = 0;
  Tensor ids;         // I32 [seqs * B]
  Tensor logit_rows;  // I32 [seqs * (B-1)]: block rows whose logits are wanted
  // LayerActivations: [seqs * B, ...]
  Tensor last, last_n;  // [seqs * nd, H]: the gathered rows, normed (nd = max_drafts()) where
                        // the norm is not fused into the head
  Tensor logits;        // [seqs * nd, V] (F32 when the modules want f32_logits)
  Tensor draft_logits;  // [seqs * nd, draft_vocab]: the head's rows (restricted draft vocabulary)
  // Relatives (DFlashModules): the convolved sublayer input and the sublayer output [seqs * B, H]
  // (DFlash2); the greedy chain's rows F32 [>= seqs * nd, V] and drafts I32 (propose() only).
  Tensor conv_in, sub_out, chain_rows, chain_ids;
};

class DFlashDrafter final : public Drafter {
 public:
  DFlashDrafter(DFlashConfig config, Backend& backend, int64_t target_hidden, int64_t vocab,
                std::unique_ptr<DFlashModules> modules)
      : c_(std::move(config)),
        backend_(backend),
        target_hidden_(target_hidden),
        vocab_(vocab),
        modules_(std::move(modules)) {}

  Status load(const io::Checkpoint& ckpt, const CausalLM& target, bool fp8_weights) {
    const auto& m = c_.model;
    const int64_t h = m.hidden_size, hd = m.head_dim, q_dim = m.num_heads * hd,
                  kv_dim = m.num_kv_heads * hd, n_layers = m.num_layers;
    const int64_t fc_in = static_cast<int64_t>(c_.target_layers.size()) * target_hidden_;
    WeightLoader w(ckpt, backend_);
    BS_ASSIGN_OR_RETURN(ctx_.fc,
                        w.load("fc.weight", {h, fc_in},
                               fmt::format("[hidden_size, n_taps * target hidden]: n_taps = "
                                           "len(target_layer_ids) = {}, target hidden {}",
                                           c_.target_layers.size(), target_hidden_)));
    BS_ASSIGN_OR_RETURN(ctx_.hidden_norm, w.load("hidden_norm.weight", {h}));
    BS_ASSIGN_OR_RETURN(final_norm_, w.load("norm.weight", {h}));

    for (int64_t i = 0; i < n_layers; ++i) {
      BS_ASSIGN_OR_RETURN(DecoderLayer layer,
                          load_decoder_layer(w, m, i, {.qk_norm = true}, c_.layer_masks[i]));
      layers_.push_back(std::move(layer));
    }
    // One [L*2*kv_dim, H] matrix, rows K0 V0 K1 V1 ...: observe projects the context of every
    // layer with a single matmul (a copy of the k / v rows of each layer's fused projection).
    ctx_.kv_fused = backend_.empty({n_layers * 2 * kv_dim, h}, layers_[0].w_qkv.w.dtype());
    for (int64_t i = 0; i < n_layers; ++i) {
      const DecoderLayer& L = layers_[i];
      backend_.copy(ctx_.kv_fused.rows(2 * i * kv_dim, 2 * kv_dim),
                    L.w_qkv.w.rows(q_dim, 2 * kv_dim));
      ctx_.k_norms.push_back(L.k_norm);
    }

    BS_RETURN_IF_ERROR(load_draft_vocab_rows(ckpt, w));
    // Embedding and LM head: the drafter's own when it ships them, else the target's. With a
    // restricted draft vocabulary the head is a compact copy of the draft-vocabulary rows (an own
    // lm_head may already hold just those, in draft-id order).
    if (w.has("embed_tokens.weight")) {
      BS_ASSIGN_OR_RETURN(embed_, w.load("embed_tokens.weight", {vocab_, h}));
    } else {
      embed_ = target.embed_tokens();
    }
    const int64_t vd = draft_ids_.defined() ? draft_ids_.dim(0) : 0;
    bool compact = false;  // the head holds only the draft-vocabulary rows
    Tensor head;
    if (w.has("lm_head.weight")) {
      BS_ASSIGN_OR_RETURN(const std::string name, w.resolve({"lm_head.weight"}));
      BS_ASSIGN_OR_RETURN(const io::TensorInfo* t, ckpt.get(name));
      compact = vd > 0 && t->shape == std::vector<int64_t>{vd, h};
      BS_ASSIGN_OR_RETURN(head, w.load("lm_head.weight", {compact ? vd : vocab_, h},
                                       vd > 0 ? "[vocab_size or draft_vocab_size, hidden_size]"
                                              : "[vocab_size, hidden_size]"));
    } else {
      head = target.lm_head();
    }
    if (vd > 0 && !compact) {  // gather the draft-vocabulary rows [vd, h] (a copy)
      lm_head_.w = backend_.empty({vd, h}, head.dtype());
      backend_.embedding(lm_head_.w, draft_ids_, head);
    } else {
      lm_head_.w = head;
    }
    if (fp8_weights) {  // after ctx_.kv_fused has copied the K/V rows of the loaded w_qkv
      for (DecoderLayer& L : layers_) {
        for (DenseWeight* dw : {&L.w_qkv, &L.wo, &L.w_gate_up, &L.w_down}) dw->to_fp8(backend_);
      }
      lm_head_.to_fp8(backend_);  // a copy: the target keeps its own LM head
    }

    ctx_.rope = upload_rope(backend_, m.rope, hd, m.max_position_embeddings);
    ctx_.eps = ctx_.k_eps = static_cast<float>(m.rms_norm_eps);
    ctx_.kv_heads = m.num_kv_heads;
    ctx_.head_dim = hd;
    if (modules_) BS_RETURN_IF_ERROR(modules_->load(ckpt, backend_));
    return Status::Ok();
  }

  std::string family() const override { return modules_ ? modules_->family() : "dflash"; }
  int64_t block_size() const override { return c_.block_size; }
  // DFlash drops row 0 (the anchor echo); shifted rows (DSpark) read every row.
  int64_t max_drafts() const override { return c_.block_size - (shifted() ? 0 : 1); }
  bool draws_drafts() const override { return modules_ != nullptr; }
  bool has_confidence() const override { return modules_ && modules_->has_confidence(); }
  const std::vector<int>& target_layers() const override { return c_.target_layers; }

  KvPool make_kv_pool(int64_t num_blocks) override {
    return bs::make_kv_pool(backend_, c_.model.num_layers, c_.model.num_kv_heads, c_.model.head_dim,
                            num_blocks);
  }

  // The context K/V path (blocks/context_kv.h): hidden_norm(fc(taps)), every layer's K and V;
  // k_norm and RoPE at the absolute positions; one paged write per layer.
  Status observe(KvPool& kv, std::span<const int32_t> block_table, const Tensor& taps,
                 int64_t start_pos) override {
    const ObserveRequest req{.block_table = block_table, .taps = taps, .start_pos = start_pos};
    return observe_batch(kv, {&req, 1});
  }

  // Every request's rows through the context projection together (the work is row-wise: each
  // row lands in its own sequence's slot at its own position).
  Status observe_batch(KvPool& kv, std::span<const ObserveRequest> reqs) override {
    const int64_t width = static_cast<int64_t>(c_.target_layers.size()) * target_hidden_;
    BS_RETURN_IF_ERROR(check_pool(kv, "observe"));
    int64_t n = 0;
    for (const ObserveRequest& req : reqs) {
      if (!req.taps.defined()) return InvalidArgument("dflash observe: taps are undefined");
      if (req.taps.dim(0) == 0) continue;
      if (req.taps.ndim() != 2 || req.taps.dim(1) != width) {
        return InvalidArgument("dflash observe: taps have {} columns, expected {} ({} taps x {})",
                               req.taps.row_numel(), width, c_.target_layers.size(),
                               target_hidden_);
      }
      if (req.start_pos < 0) {
        return InvalidArgument("dflash observe: negative start_pos {}", req.start_pos);
      }
      BS_RETURN_IF_ERROR(check_block_table(kv, req.block_table, req.start_pos + req.taps.dim(0),
                                           "dflash observe"));
      n += req.taps.dim(0);
    }
    if (n == 0) return Status::Ok();
    obs_.ensure(backend_, ctx_, n);
    std::vector<PagedBatch::Seq> seqs;
    for (const ObserveRequest& req : reqs) {
      seqs.push_back(
          {.block_table = req.block_table, .start_pos = req.start_pos, .rows = req.taps.dim(0)});
    }
    obs_batch_.stage(backend_, kv, seqs, /*with_tables=*/false);
    auto write = [&](const Tensor& taps) {
      context_kv(backend_, ctx_, taps, obs_batch_.positions(), obs_batch_.slots(), obs_, kv);
    };

    if (reqs.size() == 1) {
      // Captured per (rows, scratch, taps buffer, pools): the ops read only uploaded tensors.
      const Tensor& taps = reqs[0].taps;
      const std::string key =
          fmt::format("dflash-observe:{}:{}:{}", obs_.generation, obs_batch_.key(kv),
                      static_cast<const void*>(taps.data()));
      backend_.run_captured(key, [&] { write(taps); });
      return Status::Ok();
    }
    // Several sequences: their taps side by side, then one uncaptured pass (the row count
    // changes from step to step, so graphs would rarely be replayed).
    write(stack_taps(backend_, reqs, width, &obs_taps_));
    return Status::Ok();
  }

  // Block [anchor, mask x (B-1)] at positions s .. s+B-1 through every layer, attending to the
  // cached context [0, s) and to the whole block; logits of rows 1 .. num_drafts.
  Status propose(KvPool& kv, const ProposeRequest& req, Tensor* logits) override {
    return propose_batch(kv, {&req, 1}, logits);
  }

  // The blocks of all requests through every layer together (projections over all rows, one
  // attention call per layer over each sequence's own context); a sequence's rows are computed
  // exactly as for its propose alone.
  Status propose_batch(KvPool& kv, std::span<const ProposeRequest> reqs, Tensor* logits) override {
    int64_t nd = 0;
    BS_RETURN_IF_ERROR(forward_blocks(kv, reqs, &nd));
    const int64_t S = static_cast<int64_t>(reqs.size());
    if (!modules_) {
      *logits = prop_.logits.rows(0, S * nd);
      return Status::Ok();
    }
    // Relatives: the rows of each request's greedy chain (scratch allocated on first use: the
    // engine's propose_draw does not need it).
    if (!prop_.chain_rows.defined() || prop_.chain_rows.dim(0) < S * nd) {
      prop_.chain_rows = backend_.empty({S * nd, vocab_}, DType::kF32);
      prop_.chain_ids = backend_.empty({S * nd}, DType::kI32);
    }
    for (int64_t r = 0; r < S; ++r) {
      const DraftDraw greedy{.ids = prop_.chain_ids.rows(r * nd, reqs[r].num_drafts)};
      modules_->draw(prop_.last_n.rows(r * nd, reqs[r].num_drafts), r * nd,
                     prop_.logits.rows(r * nd, reqs[r].num_drafts),
                     prop_.ids.rows(r * c_.block_size, 1), greedy,
                     prop_.chain_rows.rows(r * nd, reqs[r].num_drafts), nullptr);
    }
    *logits = prop_.chain_rows.rows(0, S * nd);
    return Status::Ok();
  }

  Status propose_draw(KvPool& kv, std::span<const ProposeRequest> reqs,
                      std::span<const DraftDraw> draws,
                      std::vector<std::vector<float>>* confidences) override {
    if (!modules_) return Drafter::propose_draw(kv, reqs, draws, confidences);
    if (draws.size() != reqs.size()) {
      return InvalidArgument("{} propose_draw: {} draws for {} requests", family(), draws.size(),
                             reqs.size());
    }
    if (confidences && !modules_->has_confidence()) {
      return InvalidArgument("{} drafter has no confidence head", family());
    }
    int64_t nd = 0;
    BS_RETURN_IF_ERROR(forward_blocks(kv, reqs, &nd));
    if (confidences) confidences->assign(reqs.size(), {});
    for (size_t r = 0; r < reqs.size(); ++r) {
      const int64_t k = reqs[r].num_drafts, row = static_cast<int64_t>(r) * nd;
      if (draws[r].ids.numel() != k) {
        return InvalidArgument("{} propose_draw: {} draft ids for {} drafts", family(),
                               draws[r].ids.numel(), k);
      }
      modules_->draw(prop_.last_n.rows(row, k), row, prop_.logits.rows(row, k),
                     prop_.ids.rows(static_cast<int64_t>(r) * c_.block_size, 1), draws[r], Tensor(),
                     confidences ? &(*confidences)[r] : nullptr);
    }
    return Status::Ok();
  }

 private:
  bool shifted() const { return modules_ && modules_->shifted_rows(); }

  // The checkpoint's draft vocabulary (d2t, blocks/draft_vocab.h) into draft_ids_.
  // DSpark and DFlash2 draw over the whole target vocabulary (the Markov bias and the candidate
  // codebooks are indexed by target ids, specs/dflash.md §5.4: DFlash2 needs the full vocabulary),
  // so a restricted one is refused for them.
  Status load_draft_vocab_rows(const io::Checkpoint& ckpt, WeightLoader& w) {
    if (modules_ && c_.draft_vocab_size != vocab_) {
      return Unimplemented(
          "{}: draft_vocab_size {} < vocab_size {}: a restricted draft vocabulary (tensor 'd2t') "
          "is not supported for {} drafters (they draw over the full target vocabulary)",
          ckpt.dir(), c_.draft_vocab_size, vocab_, modules_->family());
    }
    BS_ASSIGN_OR_RETURN(
        const std::vector<int32_t> ids,
        load_draft_vocab(ckpt.dir(), ckpt, w,
                         {.vocab_size = vocab_, .draft_vocab_size = c_.draft_vocab_size}));
    if (ids.empty()) return Status::Ok();
    draft_ids_ = backend_.empty({static_cast<int64_t>(ids.size())}, DType::kI32);
    backend_.copy_from_host(draft_ids_, ids.data());
    return Status::Ok();
  }

  // The block forward of every request (propose_batch's work up to the logits): p.last_n (with
  // modules; a plain DFlash head may take the norm fused) and p.logits rows
  // [r * nd, r * nd + num_drafts) are request r's; *nd_out = nd.
  Status forward_blocks(KvPool& kv, std::span<const ProposeRequest> reqs, int64_t* nd_out) {
    const int64_t B = c_.block_size, S = static_cast<int64_t>(reqs.size());
    if (S == 0) return InvalidArgument("dflash propose: no requests");
    BS_RETURN_IF_ERROR(check_pool(kv, "propose"));
    int64_t nd = 0;
    for (const ProposeRequest& req : reqs) {
      BS_RETURN_IF_ERROR(check_propose(kv, req, max_drafts(), vocab_, B, family() + " propose"));
      nd = std::max(nd, req.num_drafts);
    }
    ensure_propose(S);
    ProposeScratch& p = prop_;

    // The whole block runs even when fewer drafts are wanted: rows attend to each other
    // (non-causal), so dropping trailing mask rows would change the earlier rows' drafts.
    // Block r: positions anchor_pos .. anchor_pos + B - 1, attending to the cache up to its end.
    std::vector<int32_t> ids(S * B, static_cast<int32_t>(c_.mask_token_id)), rows(S * nd);
    std::vector<PagedBatch::Seq> seqs;
    for (int64_t r = 0; r < S; ++r) {
      const ProposeRequest& req = reqs[r];
      ids[r * B] = req.anchor;
      seqs.push_back({.block_table = req.block_table, .start_pos = req.anchor_pos, .rows = B});
      // DFlash: row 0 echoes the anchor, row j predicts position s + j. Shifted (DSpark): row j
      // predicts s + j + 1.
      const int64_t first = shifted() ? 0 : 1;
      for (int64_t j = 0; j < nd; ++j) rows[r * nd + j] = static_cast<int32_t>(r * B + first + j);
    }
    batch_.stage(backend_, kv, seqs);
    backend_.copy_from_host(p.ids.rows(0, S * B), ids.data());
    backend_.copy_from_host(p.logit_rows.rows(0, S * nd), rows.data());

    // The block forward depends on the call only through the uploaded tensors: a backend may
    // capture it once per batch size, draft count and table capacity and replay it.
    const std::string key = fmt::format("dflash:{}:{}:{}", prop_generation_, nd, batch_.key(kv));
    backend_.run_captured(key, [&] { block_forward(kv, S, nd); });
    *nd_out = nd;
    return Status::Ok();
  }

  // The blocks of S sequences through every layer (ids / positions / slots / tables / kv_len
  // uploaded), then the logits of rows 1 .. nd of every block into p.logits.
  void block_forward(KvPool& kv, int64_t S, int64_t nd) {
    const auto& m = c_.model;
    const ProposeScratch& p = prop_;
    const int64_t rows = S * c_.block_size, B = c_.block_size;
    const float eps = static_cast<float>(m.rms_norm_eps);
    const LayerActivations a = p.first_rows(rows);
    const Tensor x = a.x;
    backend_.embedding(x, p.ids.rows(0, rows), embed_);
    const float emb_scale = modules_ ? modules_->input_embedding_scale() : 1.0f;
    if (emb_scale != 1.0f) backend_.scale_softcap(x, x, emb_scale, 0.0f);
    // Block K/V go to the real slots of positions s.. and are overwritten by later observes.
    const PagedAttention paged = PagedAttention::of(batch_, ctx_.rope, m.rms_norm_eps, m.head_dim);
    // DFlash2 convolves the normed input and the sublayer output (DFlashModules).
    SublayerConvs convs{
        .prepare = [&](int64_t l, int sub, const Tensor& y,
                       const Tensor& in) { modules_->conv_prepare(l, sub, y, in, B); },
        .finish =
            [&](int64_t l, int sub, const Tensor& residual, const Tensor& out, const Tensor& xn,
                const Tensor& norm_w, float norm_eps) {
              modules_->conv_finish(l, sub, residual, out, B, xn, norm_w, norm_eps);
            }};
    const bool with_convs = modules_ && modules_->has_convs();
    if (with_convs) {
      convs.in = p.conv_in.rows(0, rows);
      convs.out = p.sub_out.rows(0, rows);
    }
    for (size_t li = 0; li < layers_.size(); ++li) {
      convs.input_normed = li > 0;
      convs.next_input_norm = li + 1 < layers_.size() ? layers_[li + 1].input_norm : Tensor{};
      decoder_layer(backend_, static_cast<int64_t>(li), layers_[li], a, paged, kv,
                    with_convs ? &convs : nullptr);
    }
    const Tensor last = p.last.rows(0, S * nd), last_n = p.last_n.rows(0, S * nd);
    backend_.embedding(last, p.logit_rows.rows(0, S * nd), x);  // row gather
    // The final norm and the head: one fused pair where the backend fuses it, unless a module
    // reads the normalized rows first (DFlash2's hidden projection).
    const auto head = [&](const Tensor& logits) {
      if (!modules_) return norm_linear(backend_, logits, last_n, last, final_norm_, eps, lm_head_);
      backend_.rms_norm(last_n, last, final_norm_, eps);
      modules_->before_head(last_n);
      lm_head_.apply(backend_, logits, last_n);
    };
    if (draft_ids_.defined()) {
      // Restricted draft vocabulary: the head over its rows only, scattered into -inf rows of the
      // target vocabulary (argmax and the sampled proposal q stay within it: lossless).
      const Tensor small = p.draft_logits.rows(0, S * nd);
      head(small);
      backend_.scatter_columns(p.logits.rows(0, S * nd), small, draft_ids_,
                               -std::numeric_limits<float>::infinity());
    } else {
      head(p.logits.rows(0, S * nd));
    }
  }

  Status check_pool(const KvPool& kv, const char* op) const {
    if (static_cast<int64_t>(kv.k.size()) != c_.model.num_layers) {
      return InvalidArgument("dflash {}: KV pool has {} layers, the drafter has {}", op,
                             kv.k.size(), c_.model.num_layers);
    }
    return Status::Ok();
  }

  // Propose scratch for `seqs` blocks. Growing it bumps prop_generation_ (captured proposes hold
  // the old buffers); it doubles.
  void ensure_propose(int64_t seqs) {
    const auto& m = c_.model;
    const int64_t B = c_.block_size;
    if (seqs > prop_.seqs) {
      const int64_t n = std::max(seqs, 2 * prop_.seqs), rows = n * B;
      prop_.seqs = 0;  // until every buffer exists (an AllocationError leaves a consistent state)
      ++prop_generation_;
      prop_.ids = backend_.empty({rows}, DType::kI32);
      const int64_t nd = max_drafts();
      prop_.logit_rows = backend_.empty({n * nd}, DType::kI32);
      prop_.allocate_layers(backend_, m, rows);
      prop_.last = backend_.empty({n * nd, m.hidden_size});
      prop_.last_n = backend_.empty({n * nd, m.hidden_size});
      prop_.logits = modules_ && modules_->f32_logits()
                         ? backend_.empty({n * nd, vocab_}, DType::kF32)
                         : backend_.empty({n * nd, vocab_});
      if (draft_ids_.defined()) prop_.draft_logits = backend_.empty({n * nd, draft_ids_.dim(0)});
      if (modules_ && modules_->has_convs()) {
        prop_.conv_in = backend_.empty({rows, m.hidden_size});
        prop_.sub_out = backend_.empty({rows, m.hidden_size});
        modules_->reserve_rows(rows);
      }
      prop_.seqs = n;
    }
  }

  DFlashConfig c_;
  Backend& backend_;
  int64_t target_hidden_;
  int64_t vocab_;
  std::unique_ptr<DFlashModules> modules_;  // DSpark / DFlash2 parts; null for DFlash
  ContextKv ctx_;                           // fc, hidden_norm, every layer's k/v projection
  std::vector<DecoderLayer> layers_;
  Tensor final_norm_;    // [H]
  Tensor embed_;         // [vocab, H]
  DenseWeight lm_head_;  // [vocab, H]; [draft_vocab, H] with a restricted draft vocabulary
  // Restricted draft vocabulary: I32 [draft_vocab], the target ids of the head's rows (draft ids
  // 0 ..); undefined when the head covers the whole vocabulary.
  Tensor draft_ids_;
  ContextKvScratch obs_;
  PagedBatch obs_batch_;  // positions and slots of the current observe
  Tensor obs_taps_;       // [>= rows, taps width]: the taps of a batched observe, side by side
  ProposeScratch prop_;
  PagedBatch batch_;             // positions, slots, tables, KV lengths of the current propose
  int64_t prop_generation_ = 0;  // bumped when the propose scratch is reallocated
};

// dflash_config when present (an object), else an empty object.
Result<json> dflash_section(const json& j, const std::string& file) {
  if (!io::has_field(j, "dflash_config")) return json::object();
  const json& d = j["dflash_config"];
  if (!d.is_object()) {
    return InvalidArgument("{}: field 'dflash_config' must be an object, got {}", file,
                           io::json_type_name(d));
  }
  return d;
}

}  // namespace

std::vector<int> dflash_default_target_layers(int64_t num_target_layers, int64_t num_draft_layers) {
  if (num_draft_layers <= 1) return {static_cast<int>(num_target_layers / 2)};
  std::vector<int> ids;
  const double span = static_cast<double>(num_target_layers - 4);
  const int saved = std::fegetround();
  std::fesetround(FE_TONEAREST);  // nearbyint rounds halves to even, as Python's round()
  for (int64_t i = 0; i < num_draft_layers; ++i) {
    const double v =
        1.0 + static_cast<double>(i) * span / static_cast<double>(num_draft_layers - 1);
    ids.push_back(static_cast<int>(std::nearbyint(v)));
  }
  std::fesetround(saved);
  return ids;
}

Result<DFlashConfig> parse_dflash_config(const json& j, const std::string& file,
                                         int64_t num_target_layers, DFlashFamily family) {
  if (!j.is_object()) {
    return InvalidArgument("{}: expected a JSON object, got {}", file, io::json_type_name(j));
  }
  DFlashConfig c;
  BS_ASSIGN_OR_RETURN(c.model, io::parse_transformer_config(j, file));
  BS_ASSIGN_OR_RETURN(json d, dflash_section(j, file));
  const std::string dfile = file + " (dflash_config)";
  const auto& m = c.model;

  // Features of DFlash-format relatives that this drafter does not implement.
  if (m.hidden_act != "silu") {
    return Unimplemented("{}: hidden_act '{}' is not supported (expected silu)", file,
                         m.hidden_act);
  }
  if (m.attention_bias || m.mlp_bias) {
    return Unimplemented("{}: attention_bias / mlp_bias are not supported for DFlash drafters",
                         file);
  }
  const bool dspark = family == DFlashFamily::kDSpark, dflash2 = family == DFlashFamily::kDFlash2;
  // sample_from_anchor: dflash_config first, then the top level (vLLM's speculator reads it there).
  const bool anchor_in_d = io::has_field(d, "sample_from_anchor");
  BS_ASSIGN_OR_RETURN(bool from_anchor, io::get_bool_or(anchor_in_d ? d : j, "sample_from_anchor",
                                                        anchor_in_d ? dfile : file, dspark));
  if (dspark && !from_anchor) {
    return Unimplemented(
        "{}: sample_from_anchor=false with projector_type 'dspark' (an unshifted DSpark layout) is "
        "not supported",
        anchor_in_d ? dfile : file);
  }
  if (from_anchor && !dspark) {
    return Unimplemented(
        "{}: sample_from_anchor=true (shifted DSpark layout, row k predicts s+k+1) is not "
        "supported by the DFlash drafter",
        anchor_in_d ? dfile : file);
  }
  // A field from dflash_config first, then the top level, and the file it was read from.
  auto src = [&](const char* key) -> const json& { return io::has_field(d, key) ? d : j; };
  auto where = [&](const char* key) -> const std::string& {
    return io::has_field(d, key) ? dfile : file;
  };
  BS_ASSIGN_OR_RETURN(bool use_aux,
                      io::get_bool_or(src("use_aux_hidden_state"), "use_aux_hidden_state",
                                      where("use_aux_hidden_state"), true));
  if (!use_aux) {
    return Unimplemented(
        "{}: use_aux_hidden_state=false (no fc over tapped layers) is not "
        "supported",
        where("use_aux_hidden_state"));
  }
  // Attention sinks (a learned per-head bias in the softmax) are not implemented. vLLM reads
  // add_swa_attention_sink_bias as attention_sink_bias when the latter is absent; trainers differ
  // on whether it adds sinks to the sliding-window layers only, so true is refused either way.
  for (const char* key : {"attention_sink_bias", "add_swa_attention_sink_bias"}) {
    BS_ASSIGN_OR_RETURN(bool sink, io::get_bool_or(src(key), key, where(key), false));
    if (sink) {
      return Unimplemented("{}: {} = true (attention sinks) is not supported", where(key), key);
    }
  }
  // RoPE: blockspec rotates halves (neox style). vLLM applies interleaved (GPT-J) RoPE when
  // is_neox_style is false, which would give different drafts, so false is refused (either place).
  for (const json* s : std::initializer_list<const json*>{&d, &j}) {
    const std::string& at = s == &d ? dfile : file;
    BS_ASSIGN_OR_RETURN(bool neox, io::get_bool_or(*s, "is_neox_style", at, true));
    if (!neox) {
      return Unimplemented(
          "{}: is_neox_style = false (interleaved GPT-J RoPE) is not supported (blockspec applies "
          "rotate-half / neox RoPE)",
          at);
    }
  }
  if (io::has_field(d, "projector_type")) {
    BS_ASSIGN_OR_RETURN(std::string proj, io::get_string(d, "projector_type", dfile));
    if (proj != (dspark ? "dspark" : "dflash")) {
      return Unimplemented("{}: projector_type '{}' is not supported (DFlash: absent or 'dflash')",
                           dfile, proj);
    }
  }
  BS_ASSIGN_OR_RETURN(int64_t markov_rank, io::get_int_or(d, "markov_rank", dfile, 0));
  if (markov_rank != 0 && !dspark) {
    return Unimplemented("{}: markov_rank {} (a DSpark Markov head) is not supported", dfile,
                         markov_rank);
  }
  for (const char* key : {"input_embedding_scale", "output_multiplier"}) {
    if (dflash2) break;  // DFlash2 applies both (dflash2.cc)
    for (const json* src : std::initializer_list<const json*>{&d, &j}) {
      BS_ASSIGN_OR_RETURN(double v, io::get_float_or(*src, key, file, 1.0));
      if (v != 1.0) return Unimplemented("{}: field '{}' = {} is not supported", file, key, v);
    }
  }
  // logit_scale (vLLM: LogitsProcessor(scale=logit_scale) for qwen3_dflash / qwen3_dspark, DSpark's
  // Markov bias added after it): not applied by any family here. Refused rather than ignored,
  // since the drafts would silently differ.
  for (const json* src : std::initializer_list<const json*>{&d, &j}) {
    BS_ASSIGN_OR_RETURN(double v,
                        io::get_float_or(*src, "logit_scale", src == &d ? dfile : file, 1.0));
    if (v != 1.0) {
      return Unimplemented("{}: field 'logit_scale' = {} is not supported (only 1)",
                           src == &d ? dfile : file, v);
    }
  }
  for (const json* src : std::initializer_list<const json*>{&d, &j}) {
    if (dflash2) break;
    if (io::has_field(*src, "final_logit_softcapping")) {
      return Unimplemented("{}: field 'final_logit_softcapping' is not supported", file);
    }
  }

  // block_size: newer checkpoints put it in dflash_config, the b16 releases at the top level.
  if (io::has_field(d, "block_size")) {
    BS_ASSIGN_OR_RETURN(c.block_size, io::get_int(d, "block_size", dfile));
  } else if (io::has_field(j, "block_size")) {
    BS_ASSIGN_OR_RETURN(c.block_size, io::get_int(j, "block_size", file));
  } else {
    return InvalidArgument(
        "{}: no block size (expected 'block_size' at the top level or in 'dflash_config')", file);
  }
  if (c.block_size < 2) {
    return InvalidArgument(
        "{}: field 'block_size' must be >= 2 (anchor + at least one mask row), "
        "got {}",
        file, c.block_size);
  }

  // The mask token: its embedding row fills the draft rows. Never guessed (dflash.md §8.1).
  if (io::has_field(d, "mask_token_id")) {
    BS_ASSIGN_OR_RETURN(c.mask_token_id, io::get_int(d, "mask_token_id", dfile));
  } else if (io::has_field(j, "mask_token_id")) {
    BS_ASSIGN_OR_RETURN(c.mask_token_id, io::get_int(j, "mask_token_id", file));
  } else {
    return InvalidArgument("{}: missing field 'dflash_config.mask_token_id'", file);
  }

  // Restricted draft vocabulary (EAGLE-3 / SpecForge convention, top level or in dflash_config);
  // the d2t tensor itself is read at load.
  c.draft_vocab_size = m.vocab_size;
  for (const json* src : std::initializer_list<const json*>{&d, &j}) {
    if (!io::has_field(*src, "draft_vocab_size")) continue;
    const std::string& where = src == &d ? dfile : file;
    BS_ASSIGN_OR_RETURN(c.draft_vocab_size, io::get_int(*src, "draft_vocab_size", where));
    if (c.draft_vocab_size < 1 || c.draft_vocab_size > m.vocab_size) {
      return InvalidArgument("{}: field 'draft_vocab_size' = {} must be in [1, vocab_size = {}]",
                             where, c.draft_vocab_size, m.vocab_size);
    }
    break;
  }

  if (io::has_field(d, "num_target_layers")) {
    BS_ASSIGN_OR_RETURN(c.num_target_layers, io::get_int(d, "num_target_layers", dfile));
  } else {
    BS_ASSIGN_OR_RETURN(c.num_target_layers, io::get_int_or(j, "num_target_layers", file, 0));
  }
  std::vector<int64_t> ids;
  if (io::has_field(d, "target_layer_ids")) {
    BS_ASSIGN_OR_RETURN(ids, io::get_int_list(d, "target_layer_ids", dfile));
  } else if (io::has_field(j, "target_layer_ids")) {
    BS_ASSIGN_OR_RETURN(ids, io::get_int_list(j, "target_layer_ids", file));
  } else {
    // Other trainers' names for the taps: their index conventions differ (0-based or not, with or
    // without the embedding output), so they are not guessed from.
    for (const char* alias : {"dspark_target_layer_ids", "eagle_aux_hidden_state_layer_ids"}) {
      if (io::has_field(src(alias), alias)) {
        return InvalidArgument(
            "{}: field '{}' is set but 'target_layer_ids' is absent; target_layer_ids is required "
            "(the alias's layer index convention differs between trainers, so it is not used)",
            where(alias), alias);
      }
    }
    const int64_t n = c.num_target_layers > 0 ? c.num_target_layers : num_target_layers;
    for (int id : dflash_default_target_layers(n, m.num_layers)) ids.push_back(id);
  }
  if (ids.empty()) return InvalidArgument("{}: 'target_layer_ids' is empty", dfile);
  for (int64_t id : ids) {
    if (id < 0) return InvalidArgument("{}: negative target layer id {}", dfile, id);
    c.target_layers.push_back(static_cast<int>(id));
  }

  // Per-layer attention (dflash.md §1.4): is_causal -> dflash_config.causal -> layer_types;
  // use_swa (dflash_config, else the top level) windows every layer.
  std::optional<bool> causal_override;
  if (io::has_field(j, "is_causal")) {
    BS_ASSIGN_OR_RETURN(bool v, io::get_bool(j, "is_causal", file));
    causal_override = v;
  } else if (io::has_field(d, "causal")) {
    BS_ASSIGN_OR_RETURN(bool v, io::get_bool(d, "causal", dfile));
    causal_override = v;
  }
  BS_ASSIGN_OR_RETURN(bool use_swa,
                      io::get_bool_or(src("use_swa"), "use_swa", where("use_swa"), false));
  int64_t swa_window = 0;
  if (use_swa) {
    if (io::has_field(src("swa_window_size"), "swa_window_size")) {
      BS_ASSIGN_OR_RETURN(swa_window, io::get_int(src("swa_window_size"), "swa_window_size",
                                                  where("swa_window_size")));
    } else if (io::has_field(j, "sliding_window")) {
      BS_ASSIGN_OR_RETURN(swa_window, io::get_int(j, "sliding_window", file));
    }
    if (swa_window <= 0) {
      return InvalidArgument("{}: use_swa is set but no positive swa_window_size / sliding_window",
                             where("use_swa"));
    }
  }
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string& type = m.layer_types[l];
    const bool sliding = type == "sliding_attention";
    if (!sliding && type != "full_attention") {
      return Unimplemented(
          "{}: layer_types[{}] = '{}' is not supported (full_attention or "
          "sliding_attention)",
          file, l, type);
    }
    AttentionMask mask;
    if (use_swa) {
      mask.causal = causal_override.value_or(false);
      mask.window = swa_window;
    } else {
      mask.causal = causal_override.value_or(sliding);
      mask.window = sliding ? m.sliding_window.value_or(0) : 0;
    }
    c.layer_masks.push_back(mask);
  }
  return c;
}

Result<std::unique_ptr<Drafter>> load_dflash(const std::string& dir, const json& config,
                                             const CausalLM& target,
                                             const DrafterOptions& options) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  BS_ASSIGN_OR_RETURN(DFlashConfig c,
                      parse_dflash_config(config, file, target.config().num_layers));
  return load_dflash_family(dir, std::move(c), target, options, nullptr);
}

Result<std::unique_ptr<Drafter>> load_dflash_family(const std::string& dir, DFlashConfig c,
                                                    const CausalLM& target,
                                                    const DrafterOptions& options,
                                                    std::unique_ptr<DFlashModules> modules) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  const auto& t = target.config();
  const auto& m = c.model;
  if (m.hidden_size != t.hidden_size) {
    return InvalidArgument(
        "{}: hidden_size {} differs from the target's hidden_size {} (DFlash drafters share the "
        "target's width)",
        file, m.hidden_size, t.hidden_size);
  }
  if (m.vocab_size != t.vocab_size) {
    return InvalidArgument("{}: vocab_size {} differs from the target's vocab_size {}", file,
                           m.vocab_size, t.vocab_size);
  }
  if (c.num_target_layers > 0 && c.num_target_layers != t.num_layers) {
    return InvalidArgument(
        "{}: num_target_layers {} differs from the target's num_hidden_layers {}", file,
        c.num_target_layers, t.num_layers);
  }
  for (int id : c.target_layers) {
    if (id >= t.num_layers) {
      return InvalidArgument(
          "{}: target_layer_ids contains {}, but the target has {} layers (ids are 0-based)", file,
          id, t.num_layers);
    }
  }
  if (c.mask_token_id < 0 || c.mask_token_id >= t.vocab_size) {
    return InvalidArgument("{}: mask_token_id {} is outside the target vocabulary [0, {})", file,
                           c.mask_token_id, t.vocab_size);
  }
  const std::string family = modules ? modules->family() : "dflash";
  // mask_embedding.pt (MiMo's DFlash checkpoints): vLLM's qwen3_dflash replaces
  // embed_tokens[mask_token_id] with it, for DFlash and DFlash2. It is a torch pickle, which
  // blockspec cannot read, and no safetensors form of it is published, so those families refuse
  // it rather than draft from a different mask row. DSpark ignores it, as vLLM's qwen3_dspark does.
  const std::filesystem::path mask_file = std::filesystem::path(dir) / "mask_embedding.pt";
  if (family != "dspark" && std::filesystem::exists(mask_file)) {
    return Unimplemented(
        "{}: a {} drafter with mask_embedding.pt is not supported: it replaces the embedding row "
        "of mask_token_id {}, so without it the mask rows would differ from training, and "
        "blockspec cannot read torch pickles (.pt)",
        mask_file.string(), family, c.mask_token_id);
  }
  BS_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(dir));
  BS_RETURN_IF_ERROR(check_checkpoint_fits("drafter " + dir, ckpt, target.backend()));
  auto drafter = std::make_unique<DFlashDrafter>(std::move(c), target.backend(), t.hidden_size,
                                                 t.vocab_size, std::move(modules));
  BS_RETURN_IF_ERROR(drafter->load(ckpt, target, options.fp8_weights)
                         .with_context(fmt::format("loading {} drafter {}", family, dir)));
  return std::unique_ptr<Drafter>(std::move(drafter));
}

}  // namespace bs
