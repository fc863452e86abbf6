// FlashMap drafter (seeds/000, specs/flashmap.md §3): config and checkpoint validation, load-time
// folds, observe (context K/V) and propose (anchor K/V, then one or several DiT jumps from seeded
// noise). Decisions on the seed's unknowns live in flashmap_conventions.h; docs/FLASHMAP.md.
#include "models/drafters/flashmap.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "io/json_file.h"
#include "io/safetensors.h"
#include "models/blocks/context_kv.h"
#include "models/blocks/draft_vocab.h"
#include "models/blocks/paged_kv.h"
#include "models/blocks/weights.h"
#include "models/drafters/flashmap_conventions.h"
#include "models/drafters/flashmap_fold.h"
#include "models/kv_pool.h"
#include "models/rope.h"
#include "models/weight_budget.h"

namespace bs {
namespace {

using nlohmann::json;

// ------------------------------------------------------------------------------------------------
// Config
// ------------------------------------------------------------------------------------------------

struct FlashMapConfig {
  int64_t hidden = 0;                           // D: hidden_size (DiT width)
  int64_t target_hidden = 0;                    // Ht: target_hidden_size
  int64_t layers = 0;                           // num_hidden_layers
  int64_t heads = 0;                            // num_attention_heads (MHA, kv heads = heads)
  int64_t head_dim = 0;                         // head_dim, default hidden / heads
  int64_t intermediate = 0;                     // intermediate_size (MLP)
  int64_t cond_dim = 0;                         // C: timestep_embed_dim
  int64_t freq_dim = 0;                         // Fq: timestep_frequency_dim, default C
  double time_scale = 1;                        // times are multiplied by it before embedding
  std::vector<std::vector<double>> time_grids;  // entry N-1: the N+1 times of N jumps
  int64_t num_steps = 1;                        // the checkpoint's jumps
  bool noise_gate_per_jump = false;  // noise_gate == "jump": g_n = noise_gate * (t_n+1 - t_n)
  double adaln_eps = 1e-6, qk_norm_eps = 1e-6, rms_norm_eps = 1e-6;
  int64_t block_size = 0;              // B: slots drafted per propose
  std::vector<int64_t> aux_layer_ids;  // eagle_aux_hidden_state_layer_ids (vLLM: input of layer)
  int64_t vocab_size = 0;
  int64_t draft_vocab_size = 0;  // == vocab_size when unrestricted
  double rope_theta = 1e4;
};

Result<FlashMapConfig> parse_config(const json& j, const std::string& file) {
  FlashMapConfig c;
  BS_ASSIGN_OR_RETURN(c.hidden, io::get_int(j, "hidden_size", file));
  BS_ASSIGN_OR_RETURN(c.target_hidden, io::get_int(j, "target_hidden_size", file));
  BS_ASSIGN_OR_RETURN(c.layers, io::get_int(j, "num_hidden_layers", file));
  BS_ASSIGN_OR_RETURN(c.heads, io::get_int(j, "num_attention_heads", file));
  BS_ASSIGN_OR_RETURN(c.intermediate, io::get_int(j, "intermediate_size", file));
  BS_ASSIGN_OR_RETURN(c.cond_dim, io::get_int(j, "timestep_embed_dim", file));
  BS_ASSIGN_OR_RETURN(c.block_size, io::get_int(j, "block_size", file));
  BS_ASSIGN_OR_RETURN(c.vocab_size, io::get_int(j, "vocab_size", file));
  BS_ASSIGN_OR_RETURN(c.num_steps, io::get_int(j, "num_steps", file));
  BS_ASSIGN_OR_RETURN(c.time_scale, io::get_float(j, "time_scale", file));
  BS_ASSIGN_OR_RETURN(c.adaln_eps, io::get_float(j, "adaln_eps", file));
  BS_ASSIGN_OR_RETURN(c.qk_norm_eps, io::get_float(j, "qk_norm_eps", file));
  BS_ASSIGN_OR_RETURN(c.rms_norm_eps, io::get_float(j, "rms_norm_eps", file));
  BS_ASSIGN_OR_RETURN(c.aux_layer_ids,
                      io::get_int_list(j, "eagle_aux_hidden_state_layer_ids", file));
  for (const char* field :
       {"hidden_size", "target_hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "timestep_embed_dim", "block_size", "vocab_size", "num_steps"}) {
    if (j.at(field).get<double>() <= 0) {
      return InvalidArgument("{}: field '{}' must be positive, got {}", file, field,
                             j.at(field).dump());
    }
  }
  // Optional sizes ("or" defaults as the seed reads them: absent, null or 0 mean the default).
  BS_ASSIGN_OR_RETURN(c.head_dim, io::get_int_or(j, "head_dim", file, 0));
  if (c.head_dim == 0) {
    if (c.hidden % c.heads != 0) {
      return InvalidArgument(
          "{}: hidden_size {} is not a multiple of num_attention_heads {} and "
          "head_dim is not given",
          file, c.hidden, c.heads);
    }
    c.head_dim = c.hidden / c.heads;
  }
  if (c.head_dim < 0 || c.head_dim % 2 != 0) {
    return InvalidArgument("{}: head_dim {} must be positive and even (RoPE)", file, c.head_dim);
  }
  BS_ASSIGN_OR_RETURN(c.freq_dim, io::get_int_or(j, "timestep_frequency_dim", file, 0));
  if (c.freq_dim == 0) c.freq_dim = c.cond_dim;
  if (c.freq_dim < 0) {
    return InvalidArgument("{}: timestep_frequency_dim {} must be positive", file, c.freq_dim);
  }
  BS_ASSIGN_OR_RETURN(c.draft_vocab_size, io::get_int_or(j, "draft_vocab_size", file, 0));
  if (c.draft_vocab_size == 0) c.draft_vocab_size = c.vocab_size;
  if (c.draft_vocab_size < 0 || c.draft_vocab_size > c.vocab_size) {
    return InvalidArgument("{}: draft_vocab_size {} must be in [1, vocab_size = {}]", file,
                           c.draft_vocab_size, c.vocab_size);
  }
  for (const auto& [field, value] :
       {std::pair{"adaln_eps", c.adaln_eps}, std::pair{"qk_norm_eps", c.qk_norm_eps},
        std::pair{"rms_norm_eps", c.rms_norm_eps}, std::pair{"time_scale", c.time_scale}}) {
    if (!std::isfinite(value) || value < 0) {
      return InvalidArgument("{}: field '{}' must be a finite non-negative number, got {}", file,
                             field, value);
    }
  }
  if (c.aux_layer_ids.empty()) {
    return InvalidArgument("{}: eagle_aux_hidden_state_layer_ids is empty", file);
  }
  // noise_gate: the mode string. The seed reads it unconditionally: "jump" scales the gate by the
  // jump length, any other value keeps it constant.
  if (!j.contains("noise_gate")) {
    return NotFound(
        "{}: field 'noise_gate' (the noise gate mode, \"jump\" or \"constant\") is "
        "missing",
        file);
  }
  c.noise_gate_per_jump = j["noise_gate"].is_string() && j["noise_gate"] == "jump";
  // time_grids: a list of lists of numbers.
  if (!j.contains("time_grids") || !j["time_grids"].is_array()) {
    return InvalidArgument(
        "{}: field 'time_grids' must be a list of time lists (entry N-1 holds "
        "the N+1 times of N jumps)",
        file);
  }
  for (size_t i = 0; i < j["time_grids"].size(); ++i) {
    const json& g = j["time_grids"][i];
    if (!g.is_array()) {
      return InvalidArgument("{}: time_grids[{}] must be a list of numbers, got {}", file, i,
                             io::json_type_name(g));
    }
    std::vector<double> times;
    for (const json& t : g) {
      if (!t.is_number()) {
        return InvalidArgument("{}: time_grids[{}] holds a {}, expected numbers", file, i,
                               io::json_type_name(t));
      }
      times.push_back(t.get<double>());
    }
    c.time_grids.push_back(std::move(times));
  }
  // RoPE base: rope_parameters.rope_theta, else rope_theta, else 1e4.
  if (io::has_field(j, "rope_parameters") && j["rope_parameters"].is_object() &&
      io::has_field(j["rope_parameters"], "rope_theta")) {
    BS_ASSIGN_OR_RETURN(c.rope_theta, io::get_float(j["rope_parameters"], "rope_theta",
                                                    file + " (rope_parameters)"));
  } else {
    BS_ASSIGN_OR_RETURN(c.rope_theta, io::get_float_or(j, "rope_theta", file, 1e4));
  }
  if (!(c.rope_theta > 0)) return InvalidArgument("{}: rope_theta must be positive", file);
  return c;
}

// The grid of N jumps: N+1 increasing times in [0, 1], every start time < 1.
Result<std::vector<double>> jump_grid(const FlashMapConfig& c, int64_t steps,
                                      const std::string& file) {
  if (steps < 1 || steps > static_cast<int64_t>(c.time_grids.size())) {
    return InvalidArgument(
        "{}: time_grids has {} entries, so {} jump(s) have no time grid "
        "(entry {} is needed)",
        file, c.time_grids.size(), steps, steps - 1);
  }
  const std::vector<double>& g = c.time_grids[steps - 1];
  if (static_cast<int64_t>(g.size()) != steps + 1) {
    return InvalidArgument("{}: time_grids[{}] has {} times, {} jump(s) need {}", file, steps - 1,
                           g.size(), steps, steps + 1);
  }
  for (int64_t i = 0; i <= steps; ++i) {
    if (!(g[i] >= 0.0 && g[i] <= 1.0) || (i > 0 && !(g[i] > g[i - 1])) ||
        (i < steps && !(g[i] < 1.0))) {
      return InvalidArgument("{}: time_grids[{}] = {} must increase strictly within [0, 1]", file,
                             steps - 1, json(g).dump());
    }
  }
  return g;
}

// ------------------------------------------------------------------------------------------------
// The drafter
// ------------------------------------------------------------------------------------------------

struct DitLayer {
  Tensor self_qkv;                    // [3*A, D]: q, k, v projections stacked (A = heads*hd)
  Tensor self_o;                      // [D, A]
  Tensor self_q_norm, self_k_norm;    // [hd]
  Tensor cross_q;                     // [A, D]
  Tensor cross_o;                     // [D, A]
  Tensor cross_q_norm, cross_k_norm;  // [hd]
  Tensor fc1, fc1_b;                  // [I, D], [I]
  Tensor fc2, fc2_b;                  // [D, I], [D]
};

// Everything that depends only on one jump's times, precomputed at load.
struct Jump {
  double t0 = 0, t1 = 1;  // start and end time
  float noise_gate = 1;   // g_n
  float evidence = 0;     // t0 / max(1 - t0, 1e-3)²: posterior = softmax(evidence * state)
  Tensor mods;            // [(3L+1)*3, D]: rows (3*s + {0,1,2}) = scale, shift, gate of
                          // sub-block s = 3*layer + {self, cross, mlp}; s = 3L: final AdaLN
  Tensor noise_norm;      // [Ht] noise_norm weight * g_n (exact path)
};

enum Sub { kSelf = 0, kCross = 1, kMlp = 2 };

class FlashMapDrafterImpl final : public FlashMapDrafter {
 public:
  FlashMapDrafterImpl(FlashMapConfig c, const CausalLM& target, Backend& backend)
      : c_(std::move(c)),
        backend_(backend),
        embed_(target.embed_tokens()),
        lm_head_(target.lm_head()),
        target_vocab_(target.config().vocab_size) {}

  Status load(const std::string& dir, const io::Checkpoint& ckpt, const DrafterOptions& options,
              const FlashMapLoadOptions& load_options, int64_t steps,
              const std::vector<double>& grid);

  // ---- Drafter ----
  std::string family() const override { return "flashmap"; }
  int64_t block_size() const override { return c_.block_size; }
  int64_t max_drafts() const override { return c_.block_size; }
  const std::vector<int>& target_layers() const override { return target_layers_; }
  KvPool make_kv_pool(int64_t num_blocks) override;
  Status observe(KvPool& kv, std::span<const int32_t> block_table, const Tensor& taps,
                 int64_t start_pos) override;
  // Every request's rows through the context projection together (the work is row-wise).
  Status observe_batch(KvPool& kv, std::span<const ObserveRequest> reqs) override;
  Status propose(KvPool& kv, const ProposeRequest& req, Tensor* logits) override;
  Status propose_batch(KvPool& kv, std::span<const ProposeRequest> reqs, Tensor* logits) override;

  // ---- FlashMapDrafter ----
  int num_steps() const override { return static_cast<int>(jumps_.size()); }
  bool folded() const override { return folded_; }
  int64_t noise_dim() const override { return folded_ ? c_.target_hidden : c_.vocab_size; }
  int64_t vocab_size() const override { return c_.vocab_size; }
  std::vector<int32_t> draft_vocab() const override { return draft_vocab_; }
  void inject_noise(std::vector<float> noise) override { injected_ = std::move(noise); }
  Result<std::vector<float>> eigen_noise_from_vocab(std::span<const float> x0) const override;

 private:
  int64_t attn_dim() const { return c_.heads * c_.head_dim; }
  Tensor mod(const Jump& j, int64_t sub, int part) const { return j.mods.rows(3 * sub + part, 1); }
  Tensor host_ids(const std::vector<int32_t>& v) {
    Tensor t = backend_.empty({static_cast<int64_t>(v.size())}, DType::kI32);
    backend_.copy_from_host(t, v.data());
    return t;
  }

  Status load_weights(WeightLoader& r);
  Status load_draft_vocab(const std::string& dir, const io::Checkpoint& ckpt, WeightLoader& r);
  Status fold_jumps(WeightLoader& r, const std::vector<double>& grid);
  Status fold_noise(WeightLoader& r);
  Status fold_head(WeightLoader& r);  // after the draft vocabulary and the jumps
  Result<SymmetricEigen> embedding_eigenbasis() const;

  // The DiT on h [B, D] (modified in place) for one jump; writes the final AdaLN output to out.
  // The DiT on h [S*B, D] (S blocks, modified in place) for one jump; writes the final AdaLN
  // output to out. Cross-attention reads the staged tables with device lengths, or (one block,
  // host length) table row 0 in row chunks.
  void dit(const Tensor& h, const Jump& j, const Tensor& out, KvPool& kv, KvLength kv_len,
           int64_t S);
  // propose's device work after the uploads for S blocks: anchor rows, noise, jumps, head
  // logits of nd rows per block.
  Status propose_block(KvPool& kv, KvLength kv_len, int64_t nd, int64_t S);
  // Propose scratch for S blocks (grows; bumps prop_generation_).
  void ensure_propose(int64_t S);
  // Starting noise [S*B, cols] for the slots at p+1.. of each block (seed seeds_[r]) into `out`.
  Status draw_noise(const Tensor& out, uint32_t stream);

  FlashMapConfig c_;
  FlashMapConventions conv_;
  Backend& backend_;
  Tensor embed_;    // [V_target, Ht] the target's embedding (shared)
  Tensor lm_head_;  // [V_target, Ht] the target's LM head (shared)
  int64_t target_vocab_ = 0;
  std::vector<int> target_layers_;  // eagle_aux ids - 1
  float noise_scale_ = 1;

  // Weights.
  ContextKv ctx_;  // fc, hidden_norm, every layer's cross k/v projection and k_norm
  Tensor anchor_proj_, anchor_proj_b_;  // [D, Ht], [D]
  Tensor anchor_norm_;                  // [D]
  Tensor state_norm_;                   // [Ht]
  Tensor x_embed_, x_embed_b_;          // [D, Ht], [D]
  std::vector<DitLayer> layers_;

  // Folds.
  std::vector<Jump> jumps_;
  bool folded_ = true;
  Tensor first_hidden_;               // [D] x_embed(state_norm(uniform @ E)): t = 0 constant
  Tensor noise_embed_;                // [D, Ht] W_x diag(w_noise) U Λ^½
  Tensor noise_eig_;                  // [Ht] λ / Ht (0 on dropped directions)
  Tensor head_w_, head_b_;            // [V', D], [V']: lm_head[draft vocab] · head
  Tensor jump_head_w_, jump_head_b_;  // [V, D], [V]: full-vocabulary fold (several jumps)
  Tensor draft_ids_;                  // I32 [V'] target ids of head rows; undefined: identity
  std::vector<int32_t> draft_vocab_;

  // Propose scratch (S blocks of B rows).
  int64_t prop_seqs_ = 0, prop_generation_ = 0;
  std::vector<uint64_t> seeds_;  // noise seed of each block of the current propose
  Tensor batch_logits_;          // [S * nd, V_target]: proposes run one block at a time
  struct {
    Tensor ids;             // I32 [S]: anchors
    Tensor logit_rows;      // I32 [S * B]: the first nd rows of each block
    Tensor gathered;        // [S * B, D]: those rows of out
    Tensor slot_pos;        // I32 [B]: p+1 .. p+B
    Tensor anchor_emb;      // [1, Ht]
    Tensor anchor_row;      // [1, D]
    Tensor h, out, n, tmp;  // [B, D]
    Tensor qkv;             // [B, 3*A]
    Tensor q, k, v, attn;   // [B, A]
    Tensor mid;             // [B, I]
    Tensor z;               // F32 [B, Ht] eigenbasis noise (folded)
    Tensor noise_proj;      // [B, D]
    Tensor pair;            // F32 [2B, V]: posterior rows, then state rows
    Tensor pair_emb;        // [2B, Ht]
    Tensor delta;           // F32 [B, V]
    Tensor head_logits;     // [B, V'] (draft vocabulary)
    Tensor logits;          // [B, V_target]
  } p_;
  ContextKvScratch o_;       // observe (grows)
  ContextKvScratch anchor_;  // propose's anchor row
  PagedBatch obs_batch_;     // positions and slots of the current observe
  Tensor obs_taps_;          // a batched observe's taps, back to back (grows)
  PagedBatch anchor_batch_;  // the anchor's position, slot, block table and p + 1
  std::optional<std::vector<float>> injected_;
};

Status FlashMapDrafterImpl::load(const std::string& dir, const io::Checkpoint& ckpt,
                                 const DrafterOptions& options,
                                 const FlashMapLoadOptions& load_options, int64_t steps,
                                 const std::vector<double>& grid) {
  for (int64_t id : c_.aux_layer_ids) target_layers_.push_back(static_cast<int>(id - 1));
  noise_scale_ = options.flashmap_noise_scale;
  // Names: the seed's, optionally under a "model." prefix (both spellings exist in exports).
  WeightLoader r(ckpt, backend_);
  BS_RETURN_IF_ERROR(load_weights(r));
  BS_RETURN_IF_ERROR(load_draft_vocab(dir, ckpt, r));
  BS_RETURN_IF_ERROR(fold_jumps(r, grid));
  BS_RETURN_IF_ERROR(fold_head(r));
  folded_ = steps == 1 && load_options.fold_one_jump && grid[0] == 0.0;
  if (folded_) BS_RETURN_IF_ERROR(fold_noise(r));
  // Leftover tensors are an error (as in the seed): a misspelt or foreign weight would otherwise
  // be silently ignored. The target's own embedding / LM head and t2d are skipped.
  for (const std::string& name : ckpt.names()) {
    if (r.used().count(name)) continue;
    const std::string bare = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
    if (bare == "embed_tokens.weight" || bare == "lm_head.weight" || bare == "t2d") continue;
    return InvalidArgument("{}: unexpected FlashMap weight '{}'", ckpt.dir(), name);
  }
  ensure_propose(1);
  return Status::Ok();
}

Status FlashMapDrafterImpl::load_weights(WeightLoader& r) {
  const int64_t D = c_.hidden, Ht = c_.target_hidden, A = attn_dim(), hd = c_.head_dim,
                I = c_.intermediate;
  const int64_t n_aux = static_cast<int64_t>(c_.aux_layer_ids.size());
  BS_ASSIGN_OR_RETURN(ctx_.fc, r.load("fc.weight", {D, n_aux * Ht}));
  BS_ASSIGN_OR_RETURN(ctx_.hidden_norm, r.load("hidden_norm.weight", {D}));
  BS_ASSIGN_OR_RETURN(anchor_proj_, r.load("anchor_proj.weight", {D, Ht}));
  BS_ASSIGN_OR_RETURN(anchor_proj_b_, r.load("anchor_proj.bias", {D}));
  BS_ASSIGN_OR_RETURN(anchor_norm_, r.load("anchor_norm.weight", {D}));
  BS_ASSIGN_OR_RETURN(state_norm_, r.load("state_norm.weight", {Ht}));
  BS_ASSIGN_OR_RETURN(x_embed_, r.load("x_embed.weight", {D, Ht}));
  BS_ASSIGN_OR_RETURN(x_embed_b_, r.load("x_embed.bias", {D}));
  std::vector<std::string> ctx_kv;  // per layer cross k_proj, v_proj: one [L*2*A, D] weight
  layers_.resize(c_.layers);
  for (int64_t i = 0; i < c_.layers; ++i) {
    DitLayer& L = layers_[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    BS_ASSIGN_OR_RETURN(
        L.self_qkv, r.load_stacked({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                                   {{A, D}, {A, D}, {A, D}}));
    BS_ASSIGN_OR_RETURN(L.self_o, r.load(p + "self_attn.o_proj.weight", {D, A}));
    BS_ASSIGN_OR_RETURN(L.self_q_norm, r.load(p + "self_attn.q_norm.weight", {hd}));
    BS_ASSIGN_OR_RETURN(L.self_k_norm, r.load(p + "self_attn.k_norm.weight", {hd}));
    BS_ASSIGN_OR_RETURN(L.cross_q, r.load(p + "cross_attn.q_proj.weight", {A, D}));
    ctx_kv.push_back(p + "cross_attn.k_proj.weight");
    ctx_kv.push_back(p + "cross_attn.v_proj.weight");
    BS_ASSIGN_OR_RETURN(L.cross_o, r.load(p + "cross_attn.o_proj.weight", {D, A}));
    BS_ASSIGN_OR_RETURN(L.cross_q_norm, r.load(p + "cross_attn.q_norm.weight", {hd}));
    BS_ASSIGN_OR_RETURN(L.cross_k_norm, r.load(p + "cross_attn.k_norm.weight", {hd}));
    ctx_.k_norms.push_back(L.cross_k_norm);
    BS_ASSIGN_OR_RETURN(L.fc1, r.load(p + "mlp.fc1.weight", {I, D}));
    BS_ASSIGN_OR_RETURN(L.fc1_b, r.load(p + "mlp.fc1.bias", {I}));
    BS_ASSIGN_OR_RETURN(L.fc2, r.load(p + "mlp.fc2.weight", {D, I}));
    BS_ASSIGN_OR_RETURN(L.fc2_b, r.load(p + "mlp.fc2.bias", {D}));
  }
  BS_ASSIGN_OR_RETURN(ctx_.kv_fused, r.load_stacked(ctx_kv, std::vector<std::vector<int64_t>>(
                                                                ctx_kv.size(), {A, D})));
  ctx_.rope = upload_rope(backend_, io::RopeConfig{.theta = c_.rope_theta}, c_.head_dim, 0);
  ctx_.eps = static_cast<float>(c_.rms_norm_eps);
  ctx_.k_eps = static_cast<float>(c_.qk_norm_eps);
  ctx_.kv_heads = c_.heads;
  ctx_.head_dim = c_.head_dim;
  return Status::Ok();
}

Status FlashMapDrafterImpl::load_draft_vocab(const std::string& dir, const io::Checkpoint& ckpt,
                                             WeightLoader& r) {
  const int64_t V = c_.vocab_size;
  BS_ASSIGN_OR_RETURN(draft_vocab_, bs::load_draft_vocab(dir, ckpt, r,
                                                         {.vocab_size = V,
                                                          .draft_vocab_size = c_.draft_vocab_size,
                                                          .release_file = true}));
  if (draft_vocab_.empty()) {
    if (V == target_vocab_) return Status::Ok();  // the head covers every target id
    for (int64_t j = 0; j < V; ++j) {
      draft_vocab_.push_back(static_cast<int32_t>(j));  // vocab_size < target rows: pad with -inf
    }
  }
  draft_ids_ = host_ids(draft_vocab_);
  return Status::Ok();
}

Status FlashMapDrafterImpl::fold_head(WeightLoader& r) {
  // The DiT head folded into the target's LM head (no nonlinearity between them):
  // W_f = lm_head[rows] · W_head [V', D]; b_f = lm_head[rows] · b_head [V'].
  const int64_t V = c_.vocab_size, Ht = c_.target_hidden, D = c_.hidden;
  BS_ASSIGN_OR_RETURN(const Tensor head_w, r.load("head.weight", {Ht, D}));
  BS_ASSIGN_OR_RETURN(const Tensor head_b, r.load("head.bias", {Ht}));
  auto fold = [&](const Tensor& lm_rows, Tensor* w, Tensor* b) {
    const int64_t n = lm_rows.dim(0);
    *w = backend_.empty({n, D});
    *b = backend_.empty({n});
    backend_.gemm(*w, lm_rows, head_w, false, false);
    backend_.matmul(b->view({n, 1}), lm_rows, head_b.view({1, Ht}));
  };
  const Tensor full_rows = lm_head_.rows(0, V);
  if (draft_ids_.defined() && static_cast<int64_t>(draft_vocab_.size()) < V) {
    Tensor rows = backend_.empty({static_cast<int64_t>(draft_vocab_.size()), Ht});
    backend_.embedding(rows, draft_ids_, lm_head_);
    fold(rows, &head_w_, &head_b_);
    // Between jumps the state mixes in a full-vocabulary distribution.
    if (jumps_.size() > 1) fold(full_rows, &jump_head_w_, &jump_head_b_);
  } else {
    fold(full_rows, &head_w_, &head_b_);
    jump_head_w_ = head_w_;
    jump_head_b_ = head_b_;
  }
  return Status::Ok();
}

Status FlashMapDrafterImpl::fold_jumps(WeightLoader& r, const std::vector<double>& grid) {
  const int64_t C = c_.cond_dim, Fq = c_.freq_dim, D = c_.hidden, L = c_.layers;
  // Time embedders and AdaLN projections (only needed here: they fold into per-jump constants).
  struct Embedder {
    Tensor w1, b1, w2, b2;
  };
  std::map<std::string, Embedder> emb;
  for (const char* name : {"time_embed", "jump_embed"}) {
    Embedder& e = emb[name];
    const std::string p = std::string(name) + ".";
    BS_ASSIGN_OR_RETURN(e.w1, r.load(p + "linear_1.weight", {C, Fq}));
    BS_ASSIGN_OR_RETURN(e.b1, r.load(p + "linear_1.bias", {C}));
    BS_ASSIGN_OR_RETURN(e.w2, r.load(p + "linear_2.weight", {C, C}));
    BS_ASSIGN_OR_RETURN(e.b2, r.load(p + "linear_2.bias", {C}));
  }
  std::vector<std::pair<Tensor, Tensor>> adaln;  // 3L+1 (weight [3D, C], bias [3D])
  for (int64_t i = 0; i <= L; ++i) {
    for (const char* sub : {"self_attn_adaln", "cross_attn_adaln", "mlp_adaln"}) {
      const std::string p =
          i < L ? "layers." + std::to_string(i) + "." + sub + ".linear" : "final_adaln.linear";
      std::pair<Tensor, Tensor> w;
      BS_ASSIGN_OR_RETURN(w.first, r.load(p + ".weight", {3 * D, C}));
      BS_ASSIGN_OR_RETURN(w.second, r.load(p + ".bias", {3 * D}));
      adaln.push_back(std::move(w));
      if (i == L) break;
    }
  }
  BS_ASSIGN_OR_RETURN(std::vector<float> gate, r.host("noise_gate", {1}));
  BS_ASSIGN_OR_RETURN(std::vector<float> noise_norm,
                      r.host("noise_norm.weight", {c_.target_hidden}));

  Tensor feat = backend_.empty({1, Fq}, DType::kF32), hid = backend_.empty({1, C}),
         cond = backend_.empty({1, C}), part = backend_.empty({1, C});
  // TimestepEmbedding(t) = linear_2(SiLU(linear_1(features(t)))), into `out` [1, C].
  auto embed_time = [&](const Embedder& e, double t, const Tensor& out) {
    const std::vector<float> f = conv_.timestep_features(t, Fq);
    backend_.copy_from_host(feat, f.data());
    backend_.matmul(hid, feat, e.w1, &e.b1);
    backend_.silu(hid, hid);
    backend_.matmul(out, hid, e.w2, &e.b2);
  };
  const int64_t steps = static_cast<int64_t>(grid.size()) - 1;
  for (int64_t n = 0; n < steps; ++n) {
    Jump j;
    j.t0 = grid[n];
    j.t1 = grid[n + 1];
    j.evidence = static_cast<float>(j.t0 / std::pow(std::max(1.0 - j.t0, 1e-3), 2.0));
    j.noise_gate = static_cast<float>(c_.noise_gate_per_jump ? gate[0] * (j.t1 - j.t0) : gate[0]);
    // cond = time_embed(t0 * scale) + jump_embed(t1 * scale) (the END time, not t1 - t0); the
    // AdaLN input is SiLU(cond).
    embed_time(emb["time_embed"], j.t0 * c_.time_scale, cond);
    embed_time(emb["jump_embed"], j.t1 * c_.time_scale, part);
    backend_.add(cond, cond, part);
    backend_.silu(cond, cond);
    j.mods = backend_.empty({(3 * L + 1) * 3, D});
    for (int64_t s = 0; s <= 3 * L; ++s) {
      backend_.matmul(j.mods.rows(3 * s, 3).view({1, 3 * D}), cond, adaln[s].first,
                      &adaln[s].second);
    }
    std::vector<float> scaled(noise_norm);
    for (float& w : scaled) w *= j.noise_gate;
    j.noise_norm = upload(backend_, DType::kF32, scaled.data(), {c_.target_hidden});
    jumps_.push_back(std::move(j));
  }
  return Status::Ok();
}

Result<SymmetricEigen> FlashMapDrafterImpl::embedding_eigenbasis() const {
  // EᵀE [Ht, Ht] over the drafter's vocabulary rows, then its canonical eigenbasis.
  const int64_t Ht = c_.target_hidden;
  Tensor gram = backend_.empty({Ht, Ht}, DType::kF32);
  const Tensor e = embed_.rows(0, c_.vocab_size);
  backend_.gemm(gram, e, e, /*trans_a=*/true, /*trans_b=*/false);
  const std::vector<float> g = backend_.to_host_f32(gram);
  std::vector<double> a(g.size());
  for (int64_t i = 0; i < Ht; ++i) {
    for (int64_t k = 0; k < Ht; ++k) {
      a[i * Ht + k] = 0.5 * (static_cast<double>(g[i * Ht + k]) + g[k * Ht + i]);  // symmetrise
    }
  }
  return symmetric_eigen(std::move(a), Ht);
}

Status FlashMapDrafterImpl::fold_noise(WeightLoader& r) {
  const int64_t Ht = c_.target_hidden, D = c_.hidden, V = c_.vocab_size;
  // t = 0 constant: the uniform posterior's embedding through state_norm and x_embed.
  {
    std::vector<float> uniform(static_cast<size_t>(V), 1.0f / static_cast<float>(V));
    Tensor u = backend_.empty({1, V}, DType::kF32), pe = backend_.empty({1, Ht});
    backend_.copy_from_host(u, uniform.data());
    backend_.gemm(pe, u, embed_.rows(0, V), false, false);
    backend_.rms_norm(pe, pe, state_norm_, static_cast<float>(c_.rms_norm_eps));
    first_hidden_ = backend_.empty({1, D});
    backend_.matmul(first_hidden_, pe, x_embed_, &x_embed_b_);
    first_hidden_ = first_hidden_.view({D});
  }
  // Noise read-out in the eigenbasis: Eᵀx0 ~ U Λ^½ z, so x_embed's linear part of
  // noise_norm(Eᵀx0) is (W_x diag(w_noise) U Λ^½) z times the scalar rsqrt(Σ (λ_i/Ht) z_i² + eps).
  BS_ASSIGN_OR_RETURN(SymmetricEigen eig, embedding_eigenbasis());
  BS_ASSIGN_OR_RETURN(std::vector<float> wx, r.host("x_embed.weight", {D, Ht}));
  BS_ASSIGN_OR_RETURN(std::vector<float> wn, r.host("noise_norm.weight", {Ht}));
  const double floor = conv_.eigen_floor * std::max(eig.values[0], 0.0);
  std::vector<double> root(static_cast<size_t>(Ht));
  std::vector<float> eig_w(static_cast<size_t>(Ht));
  for (int64_t e = 0; e < Ht; ++e) {
    const double lam = eig.values[e] > floor ? eig.values[e] : 0.0;
    root[e] = std::sqrt(lam);
    eig_w[e] = static_cast<float>(lam / static_cast<double>(Ht));
  }
  // M = diag(w_noise) U Λ^½ [Ht, Ht], then noise_embed = W_x M [D, Ht].
  std::vector<double> m(static_cast<size_t>(Ht * Ht));
  for (int64_t h = 0; h < Ht; ++h) {
    for (int64_t e = 0; e < Ht; ++e) m[h * Ht + e] = wn[h] * eig.vectors[h * Ht + e] * root[e];
  }
  const std::vector<double> wx64(wx.begin(), wx.end());
  const std::vector<double> ne64 = matmul_f64(wx64, m, D, Ht, Ht);
  const std::vector<float> ne(ne64.begin(), ne64.end());
  noise_embed_ = upload(backend_, DType::kF32, ne.data(), {D, Ht});
  noise_eig_ = upload(backend_, DType::kF32, eig_w.data(), {Ht});
  return Status::Ok();
}

Result<std::vector<float>> FlashMapDrafterImpl::eigen_noise_from_vocab(
    std::span<const float> x0) const {
  const int64_t V = c_.vocab_size, Ht = c_.target_hidden;
  if (x0.size() % V != 0) {
    return InvalidArgument("eigen_noise_from_vocab: {} values are not rows of vocab_size {}",
                           x0.size(), V);
  }
  const int64_t rows = static_cast<int64_t>(x0.size()) / V;
  BS_ASSIGN_OR_RETURN(SymmetricEigen eig, embedding_eigenbasis());
  const std::vector<float> e = backend_.to_host_f32(embed_.rows(0, V));
  const double floor = conv_.eigen_floor * std::max(eig.values[0], 0.0);
  std::vector<float> z(static_cast<size_t>(rows * Ht), 0.0f);
  std::vector<double> s(static_cast<size_t>(Ht));
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(s.begin(), s.end(), 0.0);  // s = Eᵀ x0
    for (int64_t v = 0; v < V; ++v) {
      const double x = x0[r * V + v];
      for (int64_t h = 0; h < Ht; ++h) s[h] += x * e[v * Ht + h];
    }
    for (int64_t c = 0; c < Ht; ++c) {
      if (!(eig.values[c] > floor)) continue;
      double proj = 0;
      for (int64_t h = 0; h < Ht; ++h) proj += s[h] * eig.vectors[h * Ht + c];
      z[r * Ht + c] = static_cast<float>(proj / std::sqrt(eig.values[c]));
    }
  }
  return z;
}

KvPool FlashMapDrafterImpl::make_kv_pool(int64_t num_blocks) {
  return bs::make_kv_pool(backend_, c_.layers, c_.heads, c_.head_dim, num_blocks);
}

namespace {

// The checks of one observe request: taps [n, cols], start_pos >= 0, a block table covering it.
Status check_observe(const KvPool& kv, const ObserveRequest& req, int64_t cols,
                     int64_t tapped_layers, int64_t target_hidden) {
  if (req.taps.ndim() != 2 || req.taps.dim(1) != cols) {
    return InvalidArgument(
        "flashmap observe: taps must be [n, {}] ({} tapped layers x {}), got "
        "{} columns",
        cols, tapped_layers, target_hidden, req.taps.row_numel());
  }
  if (req.taps.dim(0) == 0) return Status::Ok();
  if (req.start_pos < 0) {
    return InvalidArgument("flashmap observe: start_pos {} < 0", req.start_pos);
  }
  return check_block_table(kv, req.block_table, req.start_pos + req.taps.dim(0),
                           "flashmap observe");
}

}  // namespace

Status FlashMapDrafterImpl::observe(KvPool& kv, std::span<const int32_t> block_table,
                                    const Tensor& taps, int64_t start_pos) {
  const int64_t n = taps.dim(0);
  const int64_t layers = static_cast<int64_t>(c_.aux_layer_ids.size());
  const ObserveRequest req{.block_table = block_table, .taps = taps, .start_pos = start_pos};
  BS_RETURN_IF_ERROR(check_observe(kv, req, layers * c_.target_hidden, layers, c_.target_hidden));
  if (n == 0) return Status::Ok();
  o_.ensure(backend_, ctx_, n);
  const PagedBatch::Seq seq{.block_table = block_table, .start_pos = start_pos, .rows = n};
  obs_batch_.stage(backend_, kv, {&seq, 1}, /*with_tables=*/false);
  // Captured per (rows, scratch, taps buffer, pools): the ops read only uploaded tensors.
  const std::string key = fmt::format("flashmap-observe:{}:{}:{}", o_.generation,
                                      obs_batch_.key(kv), static_cast<const void*>(taps.data()));
  backend_.run_captured(key, [&] {
    context_kv(backend_, ctx_, taps, obs_batch_.positions(), obs_batch_.slots(), o_, kv);
  });
  return Status::Ok();
}

Status FlashMapDrafterImpl::observe_batch(KvPool& kv, std::span<const ObserveRequest> reqs) {
  if (reqs.size() == 1) {
    return observe(kv, reqs[0].block_table, reqs[0].taps, reqs[0].start_pos);
  }
  const int64_t layers = static_cast<int64_t>(c_.aux_layer_ids.size());
  const int64_t cols = layers * c_.target_hidden;
  std::vector<PagedBatch::Seq> seqs;
  int64_t n = 0;
  for (const ObserveRequest& req : reqs) {
    BS_RETURN_IF_ERROR(check_observe(kv, req, cols, layers, c_.target_hidden));
    if (req.taps.dim(0) == 0) continue;
    seqs.push_back(
        {.block_table = req.block_table, .start_pos = req.start_pos, .rows = req.taps.dim(0)});
    n += req.taps.dim(0);
  }
  if (n == 0) return Status::Ok();
  o_.ensure(backend_, ctx_, n);
  obs_batch_.stage(backend_, kv, seqs, /*with_tables=*/false);
  // One uncaptured pass over the taps side by side (the row count changes from step to step).
  const Tensor taps = stack_taps(backend_, reqs, cols, &obs_taps_);
  context_kv(backend_, ctx_, taps, obs_batch_.positions(), obs_batch_.slots(), o_, kv);
  return Status::Ok();
}

void FlashMapDrafterImpl::dit(const Tensor& h, const Jump& j, const Tensor& out, KvPool& kv,
                              KvLength kv_len, int64_t S) {
  const int64_t B = c_.block_size, R = S * B, D = c_.hidden, A = attn_dim(), H = c_.heads,
                hd = c_.head_dim;
  const float ln_eps = static_cast<float>(c_.adaln_eps),
              qk_eps = static_cast<float>(c_.qk_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Tensor pos = p_.slot_pos.rows(0, R), n = p_.n.rows(0, R), tmp = p_.tmp.rows(0, R),
               qkv = p_.qkv.rows(0, R), q = p_.q.rows(0, R), k = p_.k.rows(0, R),
               v = p_.v.rows(0, R), attn = p_.attn.rows(0, R), mid = p_.mid.rows(0, R);
  auto heads = [&](const Tensor& t) { return t.view({R, H, hd}); };
  // n = LN(h) * (1 + scale) + shift of sub-block s.
  auto modulated = [&](int64_t s) {
    backend_.layer_norm(n, h, D, Tensor(), Tensor(), ln_eps);
    backend_.modulate(n, n, mod(j, s, 1), mod(j, s, 0));
  };
  for (int64_t l = 0; l < c_.layers; ++l) {
    const DitLayer& L = layers_[l];
    // Block self-attention over the B slots (q/k RMSNorm + RoPE at the slot positions).
    modulated(3 * l + kSelf);
    backend_.matmul(qkv, n, L.self_qkv);
    backend_.slice_columns(q, qkv, 0);
    backend_.slice_columns(k, qkv, A);
    backend_.slice_columns(v, qkv, 2 * A);
    backend_.rms_norm(q, q, L.self_q_norm, qk_eps);
    backend_.rms_norm(k, k, L.self_k_norm, qk_eps);
    backend_.rope(heads(q), pos, ctx_.rope.inv_freq, 1.0f);
    backend_.rope(heads(k), pos, ctx_.rope.inv_freq, 1.0f);
    for (int64_t r0 = 0; r0 < R; r0 += B) {  // each block attends to its own B slots
      backend_.attention(heads(attn).rows(r0, B), heads(q).rows(r0, B), heads(k).rows(r0, B),
                         heads(v).rows(r0, B),
                         AttentionMask{.causal = conv_.block_causal, .window = 0}, scale);
    }
    backend_.matmul(tmp, attn, L.self_o);
    backend_.gated_add(h, tmp, mod(j, 3 * l + kSelf, 2));
    // Cross-attention over each block's cached context positions 0..p (non-causal): one batched
    // call with device lengths; the paged op takes at most kv_len query rows per call, so a short
    // context (one block, host length) goes in row chunks.
    modulated(3 * l + kCross);
    backend_.matmul(q, n, L.cross_q);
    backend_.rms_norm(q, q, L.cross_q_norm, qk_eps);
    backend_.rope(heads(q), pos, ctx_.rope.inv_freq, 1.0f);
    const AttentionMask context{.causal = false, .window = 0};
    if (kv_len.device) {
      backend_.paged_attention_batch(heads(attn), heads(q), kv.k[l], kv.v[l],
                                     anchor_batch_.tables(), anchor_batch_.kv_lens(),
                                     anchor_batch_.max_kv_len(), context, scale);
    } else {
      for (int64_t r0 = 0; r0 < B; r0 += kv_len.max) {
        const int64_t rows = std::min(kv_len.max, B - r0);
        backend_.paged_attention(heads(attn).rows(r0, rows), heads(q).rows(r0, rows), kv.k[l],
                                 kv.v[l], anchor_batch_.table(0), kv_len, context, scale);
      }
    }
    backend_.matmul(tmp, attn, L.cross_o);
    backend_.gated_add(h, tmp, mod(j, 3 * l + kCross, 2));
    // GELU (erf) MLP with biases.
    modulated(3 * l + kMlp);
    backend_.matmul(mid, n, L.fc1, &L.fc1_b);
    backend_.gelu(mid, mid, /*tanh_approx=*/false);
    backend_.matmul(tmp, mid, L.fc2, &L.fc2_b);
    backend_.gated_add(h, tmp, mod(j, 3 * l + kMlp, 2));
  }
  // Final AdaLN (scale and shift only).
  backend_.layer_norm(out, h, D, Tensor(), Tensor(), ln_eps);
  backend_.modulate(out, out, mod(j, 3 * c_.layers, 1), mod(j, 3 * c_.layers, 0));
}

void FlashMapDrafterImpl::ensure_propose(int64_t S) {
  if (S <= prop_seqs_) return;
  const int64_t n = std::max(S, 2 * prop_seqs_), R = n * c_.block_size, D = c_.hidden,
                A = attn_dim(), Ht = c_.target_hidden;
  prop_seqs_ = 0;  // until every buffer exists (an AllocationError leaves a consistent state)
  ++prop_generation_;
  p_.ids = backend_.empty({n}, DType::kI32);
  p_.logit_rows = backend_.empty({R}, DType::kI32);
  p_.slot_pos = backend_.empty({R}, DType::kI32);
  p_.anchor_emb = backend_.empty({n, Ht});
  p_.anchor_row = backend_.empty({n, D});
  anchor_.ensure(backend_, ctx_, n);
  for (Tensor* t : {&p_.h, &p_.out, &p_.n, &p_.tmp, &p_.noise_proj, &p_.gathered}) {
    *t = backend_.empty({R, D});
  }
  p_.qkv = backend_.empty({R, 3 * A});
  for (Tensor* t : {&p_.q, &p_.k, &p_.v, &p_.attn}) *t = backend_.empty({R, A});
  p_.mid = backend_.empty({R, c_.intermediate});
  // The noise, the vocabulary-sized state and δ are fp32 on every backend (as in the seed); GEMMs
  // read them at the backend's operand precision.
  p_.z = backend_.empty({R, Ht}, DType::kF32);
  if (!folded_) {
    p_.pair = backend_.empty({2 * R, c_.vocab_size}, DType::kF32);
    p_.pair_emb = backend_.empty({2 * R, Ht});
    if (jumps_.size() > 1) p_.delta = backend_.empty({R, c_.vocab_size}, DType::kF32);
  }
  p_.head_logits = backend_.empty({R, head_w_.dim(0)});
  p_.logits = backend_.empty({R, target_vocab_});
  prop_seqs_ = n;
}

Status FlashMapDrafterImpl::draw_noise(const Tensor& out, uint32_t stream) {
  if (!injected_) {
    const int64_t B = c_.block_size;
    for (size_t r = 0; r < seeds_.size(); ++r) {
      const int64_t r0 = static_cast<int64_t>(r) * B;
      backend_.seeded_normal(out.rows(r0, B), p_.slot_pos.rows(r0, B), seeds_[r], stream,
                             noise_scale_);
    }
    return Status::Ok();
  }
  std::vector<float> noise = std::move(*injected_);
  injected_.reset();
  if (static_cast<int64_t>(noise.size()) != out.numel()) {
    return InvalidArgument("flashmap: injected noise has {} values, expected [{}, {}]",
                           noise.size(), out.dim(0), out.row_numel());
  }
  for (float& x : noise) x *= noise_scale_;
  backend_.copy_from_host(out, noise.data());
  return Status::Ok();
}

Status FlashMapDrafterImpl::propose(KvPool& kv, const ProposeRequest& req, Tensor* logits) {
  return propose_batch(kv, {&req, 1}, logits);
}

// S blocks through the DiT together (row-wise work over all S*B rows; block self-attention and
// the noise per block; cross-attention in one batched call); block r's logits are exactly what
// its propose alone gives.
Status FlashMapDrafterImpl::propose_batch(KvPool& kv, std::span<const ProposeRequest> reqs,
                                          Tensor* logits) {
  const int64_t B = c_.block_size, S = static_cast<int64_t>(reqs.size());
  if (S == 0) return InvalidArgument("flashmap propose: no requests");
  int64_t nd = 0;
  bool short_context = false;  // a context shorter than the block: row chunks sized on the host
  for (const ProposeRequest& req : reqs) {
    BS_RETURN_IF_ERROR(check_propose(kv, req, B, target_vocab_, 1, "flashmap propose"));
    nd = std::max(nd, req.num_drafts);
    short_context |= req.anchor_pos + 1 < B;
  }
  if (S > 1 && (injected_ || short_context)) {
    // Short contexts and injected noise (an upload) take the one-block path, block by block.
    if (!batch_logits_.defined() || batch_logits_.dim(0) < S * nd) {
      batch_logits_ = backend_.empty({S * nd, target_vocab_});
    }
    for (int64_t r = 0; r < S; ++r) {
      Tensor one;
      BS_RETURN_IF_ERROR(propose_batch(kv, reqs.subspan(r, 1), &one));
      backend_.copy(batch_logits_.rows(r * nd, reqs[r].num_drafts), one);
    }
    *logits = batch_logits_.rows(0, S * nd);
    return Status::Ok();
  }
  ensure_propose(S);
  // Block r: the anchor row at p (its position, slot and table; the block attends to [0, p]),
  // noise slots at p + offset .., logits of its first nd rows.
  std::vector<PagedBatch::Seq> seqs;
  std::vector<int32_t> anchors, slot_pos, rows;
  seeds_.clear();
  for (int64_t r = 0; r < S; ++r) {
    const ProposeRequest& req = reqs[r];
    seqs.push_back({.block_table = req.block_table, .start_pos = req.anchor_pos, .rows = 1});
    anchors.push_back(req.anchor);
    for (int64_t k = 0; k < B; ++k) {
      slot_pos.push_back(static_cast<int32_t>(req.anchor_pos + conv_.noise_position_offset + k));
    }
    for (int64_t k = 0; k < nd; ++k) rows.push_back(static_cast<int32_t>(r * B + k));
    seeds_.push_back(req.noise_seed);
  }
  anchor_batch_.stage(backend_, kv, seqs);
  backend_.copy_from_host(p_.ids.rows(0, S), anchors.data());
  backend_.copy_from_host(p_.slot_pos.rows(0, S * B), slot_pos.data());
  if (S > 1) backend_.copy_from_host(p_.logit_rows.rows(0, S * nd), rows.data());

  // The blocks' device work depends on the call only through the uploaded tensors (the whole
  // tables, the device context lengths) and the noise seeds: captured per batch, draft count,
  // staged buffers, pools and seeds. Injected noise and short contexts run uncaptured.
  if (injected_ || short_context) {
    BS_RETURN_IF_ERROR(propose_block(kv, KvLength(reqs[0].anchor_pos + 1), nd, 1));
  } else {
    const Tensor device_kv_lens = anchor_batch_.kv_lens();
    const KvLength device_len(anchor_batch_.max_kv_len(), &device_kv_lens);
    const std::string key = fmt::format("flashmap:{}:{}:{}:{}", prop_generation_, nd,
                                        anchor_batch_.key(kv), fmt::join(seeds_, ","));
    Status status = Status::Ok();
    backend_.run_captured(key, [&] { status = propose_block(kv, device_len, nd, S); });
    BS_RETURN_IF_ERROR(status);
  }
  *logits = p_.logits.rows(0, S * nd);
  return Status::Ok();
}

Status FlashMapDrafterImpl::propose_block(KvPool& kv, KvLength kv_len, int64_t nd, int64_t S) {
  const int64_t R = S * c_.block_size;
  const Tensor anchor_emb = p_.anchor_emb.rows(0, S), anchor_row = p_.anchor_row.rows(0, S);
  const Tensor h = p_.h.rows(0, R), out = p_.out.rows(0, R), z = p_.z.rows(0, R);
  // Anchor row at p: anchor_norm(anchor_proj(E[x_p])), its K/V through the fused weight. It stands
  // in for the anchor's unknown target features until observe overwrites the slot.
  backend_.embedding(anchor_emb, p_.ids.rows(0, S), embed_);
  backend_.matmul(anchor_row, anchor_emb, anchor_proj_, &anchor_proj_b_);
  backend_.rms_norm(anchor_row, anchor_row, anchor_norm_, static_cast<float>(c_.rms_norm_eps));
  write_context_kv(backend_, ctx_, anchor_row, anchor_batch_.positions(), anchor_batch_.slots(),
                   anchor_, kv);

  if (folded_) {
    // One jump, folded: hidden = first_hidden + g_0 rsqrt(Σ eig z² + eps) (z · noise_embedᵀ).
    const Tensor noise_proj = p_.noise_proj.rows(0, R);
    BS_RETURN_IF_ERROR(draw_noise(z, conv_.eigen_noise_stream));
    backend_.matmul(noise_proj, z, noise_embed_);
    backend_.noise_combine(h, first_hidden_, noise_proj, z, noise_eig_, jumps_[0].noise_gate,
                           static_cast<float>(c_.rms_norm_eps));
    dit(h, jumps_[0], out, kv, kv_len, S);
  } else {
    // The exact algorithm with a vocabulary-sized fp32 state (specs/flashmap.md §3.7).
    const Tensor pair = p_.pair.rows(0, 2 * R), pair_emb = p_.pair_emb.rows(0, 2 * R);
    const Tensor post = pair.rows(0, R), state = pair.rows(R, R);
    const Tensor post_emb = pair_emb.rows(0, R), state_emb = pair_emb.rows(R, R);
    const Tensor delta = p_.delta.defined() ? p_.delta.rows(0, R) : Tensor();
    BS_RETURN_IF_ERROR(draw_noise(state, conv_.state_noise_stream));
    const Tensor e = embed_.rows(0, c_.vocab_size);
    for (size_t n = 0; n < jumps_.size(); ++n) {
      const Jump& j = jumps_[n];
      backend_.softmax(post, state, j.evidence);
      backend_.gemm(pair_emb, pair, e, false, false);  // [post; state] @ E
      backend_.rms_norm(post_emb, post_emb, state_norm_, static_cast<float>(c_.rms_norm_eps));
      backend_.rms_norm(state_emb, state_emb, j.noise_norm, static_cast<float>(c_.rms_norm_eps));
      backend_.add(post_emb, post_emb, state_emb);
      backend_.matmul(h, post_emb, x_embed_, &x_embed_b_);
      dit(h, j, out, kv, kv_len, S);
      if (n + 1 < jumps_.size()) {
        // state <- X_{t0,t1}(state) = ((1 - t1) state + (t1 - t0) δ) / (1 - t0).
        backend_.matmul(delta, out, jump_head_w_, &jump_head_b_);
        backend_.softmax(delta, delta, 1.0f);
        backend_.axpby(state, static_cast<float>((1.0 - j.t1) / (1.0 - j.t0)), state,
                       static_cast<float>((j.t1 - j.t0) / (1.0 - j.t0)), delta);
      }
    }
  }

  // Logits of the first nd slots of each block through the folded head (several blocks: those
  // rows gathered first); -inf outside the draft vocabulary.
  Tensor out_rows = out.rows(0, nd);
  if (S > 1) {
    out_rows = p_.gathered.rows(0, S * nd);
    backend_.embedding(out_rows, p_.logit_rows.rows(0, S * nd), out);
  }
  const Tensor result = p_.logits.rows(0, S * nd);
  if (draft_ids_.defined()) {
    const Tensor small = p_.head_logits.rows(0, S * nd);
    backend_.matmul(small, out_rows, head_w_, &head_b_);
    backend_.scatter_columns(result, small, draft_ids_, -std::numeric_limits<float>::infinity());
  } else {
    backend_.matmul(result, out_rows, head_w_, &head_b_);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<FlashMapDrafter>> load_flashmap_drafter(
    const std::string& dir, const nlohmann::json& config, const CausalLM& target,
    const DrafterOptions& options, const FlashMapLoadOptions& load_options) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  BS_ASSIGN_OR_RETURN(FlashMapConfig c, parse_config(config, file));
  const auto& tc = target.config();
  if (c.target_hidden != tc.hidden_size) {
    return InvalidArgument("{}: target_hidden_size {} does not match the target's hidden_size {}",
                           file, c.target_hidden, tc.hidden_size);
  }
  if (c.vocab_size > tc.vocab_size) {
    return InvalidArgument("{}: vocab_size {} exceeds the target's vocabulary of {} tokens", file,
                           c.vocab_size, tc.vocab_size);
  }
  for (int64_t id : c.aux_layer_ids) {
    if (id < 1 || id > tc.num_layers) {
      return InvalidArgument(
          "{}: eagle_aux_hidden_state_layer_ids holds {}, expected layer ids in "
          "[1, {}] (id = input of target layer id = output of layer id - 1; "
          "0, the embedding output, is not tapped)",
          file, id, tc.num_layers);
    }
  }
  if (options.flashmap_steps < 0) {
    return InvalidArgument("flashmap_steps {} must be >= 0 (0: the checkpoint's num_steps {})",
                           options.flashmap_steps, c.num_steps);
  }
  if (!std::isfinite(options.flashmap_noise_scale) || options.flashmap_noise_scale < 0) {
    return InvalidArgument("flashmap_noise_scale {} must be finite and >= 0",
                           options.flashmap_noise_scale);
  }
  const int64_t steps = options.flashmap_steps > 0 ? options.flashmap_steps : c.num_steps;
  BS_ASSIGN_OR_RETURN(std::vector<double> grid, jump_grid(c, steps, file));
  BS_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(dir));
  BS_RETURN_IF_ERROR(check_checkpoint_fits("drafter " + dir, ckpt, target.backend()));
  auto drafter = std::make_unique<FlashMapDrafterImpl>(std::move(c), target, target.backend());
  BS_RETURN_IF_ERROR(
      drafter->load(dir, ckpt, options, load_options, steps, grid).with_context("loading " + dir));
  return std::unique_ptr<FlashMapDrafter>(std::move(drafter));
}

Result<std::unique_ptr<Drafter>> load_flashmap(const std::string& dir, const nlohmann::json& config,
                                               const CausalLM& target,
                                               const DrafterOptions& options) {
  BS_ASSIGN_OR_RETURN(std::unique_ptr<FlashMapDrafter> d,
                      load_flashmap_drafter(dir, config, target, options));
  return std::unique_ptr<Drafter>(std::move(d));
}

}  // namespace bs
