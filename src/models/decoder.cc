// The decoder-only transformer of the Llama, Mistral, Qwen2 and Qwen3 families (its layers are
// models/blocks/decoder_layer.h), and the registry that picks a family from config.json.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/check.h"
#include "models/blocks/decoder_layer.h"
#include "models/blocks/paged_kv.h"
#include "models/blocks/weights.h"
#include "models/registry.h"
#include "models/rope.h"
#include "models/weight_budget.h"

namespace bs {
namespace {

// Activation buffers sized for up to `rows` tokens per forward.
struct Scratch : LayerActivations {
  int64_t rows = 0;
  int64_t generation = 0;  // bumped on every reallocation (keys of captured forwards)
  Tensor ids;              // I32 [rows]
  Tensor logit_rows;       // I32 [rows]: rows whose logits a batched forward wants
  Tensor gathered;         // [rows, hidden]: logit rows of a batch, gathered
  Tensor logits;           // [rows, vocab]
  Tensor taps;             // [rows, n_taps * hidden]
  int64_t tap_cols = 0;
};

class DecoderLM final : public CausalLM {
 public:
  DecoderLM(io::TransformerConfig config, TargetSpec spec, Backend& backend)
      : config_(std::move(config)), spec_(std::move(spec)), backend_(backend) {}

  Status load(const io::Checkpoint& ckpt) {
    const auto& c = config_;
    const int64_t h = c.hidden_size, hd = c.head_dim;
    int64_t file_bytes = 0;
    for (const auto& name : ckpt.names()) {
      if (const auto info = ckpt.get(name); info.ok()) file_bytes += (*info)->nbytes;
    }
    LoadProgress progress(ckpt.dir(), static_cast<int64_t>(ckpt.size()), file_bytes);
    WeightLoader w(ckpt, backend_, &progress);
    BS_ASSIGN_OR_RETURN(embed_, w.load("embed_tokens.weight", {c.vocab_size, h}));
    BS_ASSIGN_OR_RETURN(final_norm_, w.load("norm.weight", {h}));
    if (w.has("lm_head.weight")) {
      BS_ASSIGN_OR_RETURN(lm_head_, w.load("lm_head.weight", {c.vocab_size, h}));
    } else if (c.tie_word_embeddings) {
      lm_head_ = embed_;
    } else {
      return NotFound("tensor 'lm_head.weight' not found in {} and tie_word_embeddings is false",
                      ckpt.dir());
    }
    const DecoderLayerOptions options{.qk_norm = spec_.qk_norm,
                                      .attention_bias = spec_.attention_bias,
                                      .mlp_bias = spec_.mlp_bias};
    for (int64_t i = 0; i < c.num_layers; ++i) {
      // transformers' sliding_window_overlay (kv > q - window): `window` keys incl. the query's.
      const AttentionMask mask{
          .causal = true,
          .window = c.layer_types[i] == "sliding_attention" ? c.sliding_window.value_or(0) : 0};
      BS_ASSIGN_OR_RETURN(DecoderLayer layer, load_decoder_layer(w, c, i, options, mask));
      layers_.push_back(std::move(layer));
    }
    rope_ = upload_rope(backend_, c.rope, hd, c.max_position_embeddings);
    weight_bytes_ = file_bytes;
    return Status::Ok();
  }

  const io::TransformerConfig& config() const override { return config_; }
  const TargetSpec& spec() const override { return spec_; }
  Backend& backend() const override { return backend_; }
  const Tensor& embed_tokens() const override { return embed_; }
  const Tensor& lm_head() const override { return lm_head_; }
  int64_t weight_bytes() const override { return weight_bytes_; }

  KvPool make_kv_pool(int64_t num_blocks) override {
    return bs::make_kv_pool(backend_, config_.num_layers, config_.num_kv_heads, config_.head_dim,
                            num_blocks);
  }

  Status forward(const ForwardRequest& req, KvPool& kv, ForwardResult* out) override {
    BatchForwardResult result;
    BS_RETURN_IF_ERROR(forward_batch({&req, 1}, kv, &result));
    *out = result.seqs[0];
    return Status::Ok();
  }

  Status forward_batch(std::span<const ForwardRequest> reqs, KvPool& kv,
                       BatchForwardResult* out) override {
    const auto& c = config_;
    if (reqs.empty()) return InvalidArgument("forward: no sequences");
    int64_t rows = 0, logit_rows = 0;
    for (size_t r = 0; r < reqs.size(); ++r) {
      BS_RETURN_IF_ERROR(validate(reqs[r], kv)
                             .with_context(reqs.size() > 1
                                               ? fmt::format("sequence {} of the batch", r)
                                               : std::string()));
      if (!std::equal(reqs[r].tap_layers.begin(), reqs[r].tap_layers.end(),
                      reqs[0].tap_layers.begin(), reqs[0].tap_layers.end())) {
        return InvalidArgument("forward: the sequences of a batch must tap the same layers");
      }
      rows += reqs[r].size();
      logit_rows += reqs[r].num_logits;
    }
    const int64_t num_seqs = static_cast<int64_t>(reqs.size());
    const int64_t tap_cols = static_cast<int64_t>(reqs[0].tap_layers.size()) * c.hidden_size;
    ensure_scratch(rows, tap_cols);

    // Host-side index tensors for this step, uploaded before the captured layer stack: rows of
    // all sequences back to back (positions, slots, tables and KV lengths: the paged batch); the
    // ids and the rows whose logits are wanted (the last num_logits rows of each sequence).
    // Tokens already on the device are copied into the ids on the device after the upload (a
    // zero stands in for them in the host ids), outside the captured stack like the uploads.
    batch_seqs_.clear();
    ids_host_.clear();
    logit_rows_host_.clear();
    std::string shape;  // logits per sequence, part of the capture key
    bool host_ids = false;
    for (const ForwardRequest& req : reqs) {
      const int64_t n = req.size(), first = ids_host_.size();
      const bool on_device = req.device_tokens.defined();
      host_ids |= !on_device;
      for (int64_t i = 0; i < n; ++i) ids_host_.push_back(on_device ? 0 : req.tokens[i]);
      for (int64_t i = n - req.num_logits; i < n; ++i) {
        logit_rows_host_.push_back(static_cast<int32_t>(first + i));
      }
      batch_seqs_.push_back(
          {.block_table = req.block_table, .start_pos = req.start_pos, .rows = n});
      shape += fmt::format("{},", req.num_logits);
    }
    batch_.stage(backend_, kv, batch_seqs_);
    if (host_ids) backend_.copy_from_host(s_.ids.rows(0, rows), ids_host_.data());
    for (int64_t r = 0, row = 0; r < num_seqs;) {
      const Tensor& first = reqs[r].device_tokens;
      int64_t n = reqs[r].size(), next = r + 1;
      if (first.defined()) {
        // Sequences whose tokens lie back to back on the device (rows of one buffer: the
        // Scheduler's overlapped step takes each row's token from the last step's ids) go in
        // one copy (a non-owning view of them, used only here).
        const auto* end = static_cast<const char*>(first.data()) + first.nbytes();
        while (next < num_seqs && reqs[next].device_tokens.defined() &&
               reqs[next].device_tokens.data() == end) {
          end += reqs[next].device_tokens.nbytes();
          n += reqs[next++].size();
        }
        backend_.copy(s_.ids.rows(row, n),
                      next == r + 1
                          ? first
                          : Tensor(nullptr, first.data(), DType::kI32, first.device(), {n}));
      }
      row += n;
      r = next;
    }
    if (num_seqs > 1 && logit_rows > 0) {
      backend_.copy_from_host(s_.logit_rows.rows(0, logit_rows), logit_rows_host_.data());
    }

    // Everything below depends on the step only through the uploaded tensors, so a backend may
    // capture it once per (sequence shapes, taps, cache capacity, KV pools) and replay it.
    std::string key =
        fmt::format("decoder:{}:{}:{}:{}", s_.generation, batch_.key(kv), shape, tap_cols);
    for (int layer : reqs[0].tap_layers) key += fmt::format(",{}", layer);
    backend_.run_captured(key, [&] { layers(reqs, rows, logit_rows, kv); });

    out->seqs.assign(reqs.size(), ForwardResult{});
    out->logits = logit_rows > 0 ? s_.logits.rows(0, logit_rows) : Tensor();
    int64_t row = 0, logit_row = 0;
    for (size_t r = 0; r < reqs.size(); ++r) {
      const int64_t n = reqs[r].size();
      out->seqs[r].taps = tap_cols ? s_.taps.rows(row, n) : Tensor();
      out->seqs[r].logits =
          reqs[r].num_logits > 0 ? s_.logits.rows(logit_row, reqs[r].num_logits) : Tensor();
      row += n;
      logit_row += reqs[r].num_logits;
    }
    return Status::Ok();
  }

 private:
  Status validate(const ForwardRequest& req, const KvPool& kv) const {
    const auto& c = config_;
    const int64_t n = req.size();
    if (n == 0) return InvalidArgument("forward: no tokens");
    if (req.device_tokens.defined() &&
        (req.device_tokens.dtype() != DType::kI32 || req.device_tokens.ndim() != 1 ||
         req.device_tokens.device() != backend_.device())) {
      return InvalidArgument("forward: device_tokens must be an I32 [n] tensor on the {} backend",
                             backend_.name());
    }
    if (req.num_logits < 0 || req.num_logits > n) {
      return InvalidArgument("forward: num_logits {} out of range [0, {}]", req.num_logits, n);
    }
    for (int32_t t : req.device_tokens.defined() ? std::span<const int32_t>() : req.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return InvalidArgument("token id {} out of range [0, {})", t, c.vocab_size);
      }
    }
    for (int layer : req.tap_layers) {
      if (layer < 0 || layer >= c.num_layers) {
        return InvalidArgument("tap layer {} out of range [0, {})", layer, c.num_layers);
      }
    }
    return check_block_table(kv, req.block_table, req.start_pos + n, "forward");
  }

  // The layer stack of one forward over the uploaded rows of all sequences (ids in scratch,
  // positions / slots / block tables / kv lengths in the paged batch): projections and MLPs run
  // over all rows at once, attention per sequence over its own cache (in one batched call when the
  // sequences have equally many rows); writes logits and taps to scratch.
  void layers(std::span<const ForwardRequest> reqs, int64_t rows, int64_t logit_rows, KvPool& kv) {
    const auto& c = config_;
    const int64_t tap_cols = static_cast<int64_t>(reqs[0].tap_layers.size()) * c.hidden_size;
    const Tensor x = s_.x.rows(0, rows), xn = s_.xn.rows(0, rows);
    backend_.embedding(x, s_.ids.rows(0, rows), embed_);
    const Tensor taps = tap_cols ? s_.taps.rows(0, rows) : Tensor();
    // Equally many rows per sequence (one sequence, batched decode, or verify blocks of one
    // size): one attention call for the whole batch, each row bit-identical to its per-sequence
    // call; else one call per sequence. The whole table row of each sequence: the attention
    // reads only the blocks covering its kv length (read on the device).
    const PagedAttention paged =
        PagedAttention::of(batch_, rope_, c.rms_norm_eps, c.head_dim, /*fused=*/true);
    const LayerActivations a = s_.first_rows(rows);
    for (int64_t li = 0; li < c.num_layers; ++li) {
      decoder_layer(backend_, li, layers_[li], a, paged, kv);
      for (size_t t = 0; t < reqs[0].tap_layers.size(); ++t) {
        if (reqs[0].tap_layers[t] == li) {
          backend_.copy_columns(taps, static_cast<int64_t>(t) * c.hidden_size, x);
        }
      }
    }
    if (logit_rows > 0) {
      // One sequence: its last rows are contiguous; several: gather them first.
      Tensor last;
      if (reqs.size() == 1) {
        last = x.rows(rows - logit_rows, logit_rows);
      } else {
        last = s_.gathered.rows(0, logit_rows);
        backend_.embedding(last, s_.logit_rows.rows(0, logit_rows), x);
      }
      backend_.norm_matmul(s_.logits.rows(0, logit_rows), xn.rows(0, logit_rows), last, final_norm_,
                           c.rms_norm_eps, lm_head_);
    }
  }

  void ensure_scratch(int64_t rows, int64_t tap_cols) {
    const auto& c = config_;
    // The sizes are recorded after their buffers exist: an allocation failure (AllocationError)
    // leaves scratch that still matches them, so the next forward works.
    if (rows > s_.rows) {
      const int64_t r = std::max<int64_t>(rows, 16);
      ++s_.generation;
      s_.rows = 0;
      s_.tap_cols = 0;
      s_.ids = backend_.empty({r}, DType::kI32);
      s_.logit_rows = backend_.empty({r}, DType::kI32);
      s_.allocate_layers(backend_, c, r);
      s_.gathered = backend_.empty({r, c.hidden_size});
      s_.logits = backend_.empty({r, c.vocab_size});
      s_.rows = r;
    }
    if (tap_cols > 0 && (tap_cols != s_.tap_cols || s_.taps.dim(0) < s_.rows)) {
      ++s_.generation;
      s_.tap_cols = 0;
      s_.taps = backend_.empty({s_.rows, tap_cols});
      s_.tap_cols = tap_cols;
    }
  }

  io::TransformerConfig config_;
  TargetSpec spec_;
  Backend& backend_;
  Tensor embed_, lm_head_, final_norm_;  // [vocab, hidden] x2, [hidden]
  std::vector<DecoderLayer> layers_;
  Rope rope_;
  int64_t weight_bytes_ = 0;
  Scratch s_;
  // Staging for the index uploads: [rows] ids, [logit rows].
  std::vector<int32_t> ids_host_, logit_rows_host_;
  PagedBatch batch_;  // positions, slots, block tables, KV lengths of the current forward
  std::vector<PagedBatch::Seq> batch_seqs_;
};

}  // namespace

Result<std::unique_ptr<CausalLM>> load_target(const std::string& dir, Backend& backend) {
  if (!std::filesystem::is_directory(dir)) {
    return NotFound("model directory '{}' does not exist", dir);
  }
  BS_ASSIGN_OR_RETURN(io::TransformerConfig config, io::load_transformer_config(dir));
  TargetSpec spec;
  if (config.architecture == "LlamaForCausalLM" || config.architecture == "MistralForCausalLM") {
    spec = llama_spec(config);
  } else if (config.architecture == "Qwen3ForCausalLM") {
    spec = qwen3_spec(config);
  } else if (config.architecture == "Qwen2ForCausalLM") {
    spec = qwen2_spec(config);
  } else {
    return Unimplemented(
        "{}/config.json: unsupported architecture '{}' (supported: LlamaForCausalLM, "
        "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
        dir, config.architecture);
  }
  if (config.hidden_act != "silu") {
    return Unimplemented("{}/config.json: hidden_act '{}' is not supported (expected silu)", dir,
                         config.hidden_act);
  }
  BS_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(dir));
  // Refused before loading when the weights cannot fit, rather than killed half-way.
  BS_RETURN_IF_ERROR(check_checkpoint_fits(dir, ckpt, backend));
  auto model = std::make_unique<DecoderLM>(std::move(config), std::move(spec), backend);
  BS_RETURN_IF_ERROR(model->load(ckpt).with_context("loading " + dir));
  return std::unique_ptr<CausalLM>(std::move(model));
}

}  // namespace bs
