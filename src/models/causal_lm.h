// A decoder-only target language model (Llama, Qwen3) running on a Backend over a paged KV
// cache. One forward processes n new tokens of one sequence whose first start_pos tokens are
// already cached, and can tap the residual stream after chosen layers for drafters.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/hf_config.h"
#include "models/kv_pool.h"

namespace bs {

struct ForwardRequest {
  std::span<const int32_t> tokens;       // [n] tokens at positions start_pos .. start_pos + n - 1
  int64_t start_pos = 0;                 // tokens already in the KV cache
  std::span<const int32_t> block_table;  // the sequence's KV blocks covering [0, start_pos + n)
  int64_t num_logits = 1;                // logits for the last num_logits rows (0: none)
  std::span<const int> tap_layers;       // residual stream after these layers (0-based)
  // I32 [n] on the model's backend, or undefined: the n tokens are already on the device (e.g.
  // drafts argmaxed there). The forward then copies them into its input on the device instead
  // of uploading `tokens` (ignored; n = device_tokens.numel()). Their ids are not checked on the
  // host: they must lie in [0, vocab).
  Tensor device_tokens;

  int64_t size() const {  // n
    return device_tokens.defined() ? device_tokens.numel() : static_cast<int64_t>(tokens.size());
  }
};

struct ForwardResult {
  Tensor logits;  // [num_logits, vocab]; a view of model scratch valid until the next forward
  Tensor taps;    // [n, tap_layers.size() * hidden], tap j at columns j*hidden; or undefined
};

struct BatchForwardResult {
  std::vector<ForwardResult> seqs;  // per request, in request order
  Tensor logits;  // [sum of num_logits, vocab]: every request's logit rows back to back
};

// Family-specific switches of the shared decoder (TargetSpec) (set by models/target/<family>.cc).
struct TargetSpec {
  std::string family;           // "llama", "qwen3"
  bool qk_norm = false;         // per-head RMSNorm on q and k before RoPE (Qwen3)
  bool attention_bias = false;  // q/k/v projection biases (o_proj bias too when set)
  bool mlp_bias = false;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const io::TransformerConfig& config() const = 0;
  virtual const TargetSpec& spec() const = 0;
  virtual Backend& backend() const = 0;
  // Allocates KV pools for num_blocks blocks of kKvBlockSize positions, for every layer.
  virtual KvPool make_kv_pool(int64_t num_blocks) = 0;
  virtual Status forward(const ForwardRequest& req, KvPool& kv, ForwardResult* out) = 0;
  // Several sequences in one pass (batched decoding): the rows of all requests go through the
  // projections and MLPs together, attention runs per sequence over its own block table. All
  // requests must tap the same layers. (*out)[i] belongs to reqs[i]; its tensors are views of
  // model scratch valid until the next forward. A row's result is that of forward() on its
  // sequence alone (bit for bit on the CPU; on CUDA while the batch has at most 16 rows, the
  // range where matmuls pin one algorithm).
  virtual Status forward_batch(std::span<const ForwardRequest> reqs, KvPool& kv,
                               BatchForwardResult* out) = 0;
  // Shared with drafters.
  virtual const Tensor& embed_tokens() const = 0;  // [vocab, hidden]
  virtual const Tensor& lm_head() const = 0;       // [vocab, hidden]
  // Bytes of weights held on the backend.
  virtual int64_t weight_bytes() const = 0;
};

}  // namespace bs
