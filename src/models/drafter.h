// A block drafter (DFlash, FlashMap, ...): proposes several tokens in one forward pass,
// conditioned on hidden states tapped from the target model.
//
// Two operations (design.md data flow):
//   observe  turns the tapped target hidden states of newly committed positions into context K/V
//            for every drafter layer, written once into the drafter's paged KV pool;
//   propose  drafts the tokens after the anchor (the last committed token, whose own target
//            features are not known yet) against the cached context.
//
// The drafter's KV pool is indexed by the *target sequence's* block table: position p of the
// drafter cache lives in the same block/slot as position p of the target cache, so the engine
// manages one block table per sequence. The engine reserves blocks covering every position a
// call may touch (propose may write up to anchor_pos + block_size - 1).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "models/causal_lm.h"
#include "models/kv_pool.h"

namespace bs {

// Run-time drafter knobs (CLI flags); families ignore what does not apply to them.
struct DrafterOptions {
  int flashmap_steps = 0;             // FlashMap jumps per draft; 0: the checkpoint's num_steps
  float flashmap_noise_scale = 1.0f;  // FlashMap noise scale; 0 makes drafts deterministic
  // DFlash: the layers' dense weights and an own copy of the LM head in FP8 E4M3 with one scale
  // per row (Backend::quantize_fp8_rows): half the bytes per draft step, slightly different
  // drafts (acceptance may change; output never does: verification is exact).
  bool fp8_weights = false;
};

struct ProposeRequest {
  int32_t anchor = 0;                    // last committed token
  int64_t anchor_pos = 0;                // its absolute position s; context = positions [0, s)
  std::span<const int32_t> block_table;  // target sequence's blocks, covering s + block_size
  int64_t num_drafts = 0;                // 1 .. max_drafts()
  uint64_t noise_seed = 0;               // per-request seed (stochastic drafters key noise on
                                         // (noise_seed, position))
};

// How a drafter that draws its own drafts (Drafter::draws_drafts) picks one request's drafts.
// DSpark's Markov chain and DFlash2's selector walk choose row k from a distribution that depends
// on the draft of row k - 1, so the engine cannot draw them from independent logits rows; it hands
// the drafter its sampler's parameters, the uniforms and the output buffers instead.
struct DraftDraw {
  // The sequence's sampler's parameters; temperature <= 0 (the default here): greedy (argmax).
  sampling::FilterParams filter{.temperature = 0.0f};
  Tensor uniforms;  // F32 [num_drafts] on the backend, one per draft (sampled)
  Tensor ids;       // out: I32 [num_drafts] on the backend, the drafts
  // out: F32 [num_drafts, vocab] on the backend, the distribution q each draft was drawn from
  // (sampled; undefined when greedy): the rejection sampling's q (lossless).
  Tensor probs;
};

// One sequence's observe (Drafter::observe_batch): its block table, its taps [n, cols] for
// positions [start_pos, start_pos + n).
struct ObserveRequest {
  std::span<const int32_t> block_table;
  Tensor taps;
  int64_t start_pos = 0;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string family() const = 0;  // "dflash", "flashmap"
  // Block size B of the checkpoint and the most drafts one propose can return.
  virtual int64_t block_size() const = 0;
  virtual int64_t max_drafts() const = 0;
  // Target layers whose residual output (HF hidden_states[id + 1]) the drafter needs, in the
  // column order observe() expects.
  virtual const std::vector<int>& target_layers() const = 0;
  virtual KvPool make_kv_pool(int64_t num_blocks) = 0;
  // Context positions [start_pos, start_pos + n): taps[n, target_layers().size() * H_target],
  // tap j at columns [j * H, (j + 1) * H).
  virtual Status observe(KvPool& kv, std::span<const int32_t> block_table, const Tensor& taps,
                         int64_t start_pos) = 0;
  // Draft logits over the target vocabulary for positions s+1 .. s+num_drafts:
  // *logits = [num_drafts, vocab] (a view of drafter scratch valid until the next call; rows of
  // a restricted draft vocabulary put -inf outside it).
  virtual Status propose(KvPool& kv, const ProposeRequest& req, Tensor* logits) = 0;
  // Proposals for several sequences in one pass (each request as in propose, with its own block
  // table): *logits = [reqs.size() * nd, vocab], nd = the largest num_drafts; rows
  // [i * nd, i * nd + reqs[i].num_drafts) are request i's and equal what propose gives it alone.
  // Drafters without a batched pass return Unimplemented (callers propose one at a time).
  virtual Status propose_batch(KvPool& kv, std::span<const ProposeRequest> reqs, Tensor* logits) {
    (void)kv;
    (void)reqs;
    (void)logits;
    return Unimplemented("{} drafter: no batched propose", family());
  }
  // True for drafters whose drafts depend on each other (DSpark, DFlash2): the engine then draws
  // through propose_draw, greedy and sampled alike; their propose() returns the logits rows of
  // the greedy chain (each row's argmax is its greedy draft).
  virtual bool draws_drafts() const { return false; }
  // True when the drafter has a confidence head (DSpark): propose_draw can report, per request,
  // the prefix survival a_j = c_1 ... c_j of its drafts (the chance that drafts 1..j are all
  // accepted).
  virtual bool has_confidence() const { return false; }
  // Drafts of every request, drawn as draws[i] says (draws[i].ids gets reqs[i].num_drafts ids);
  // when `confidences` is set, (*confidences)[i] = request i's a_1 .. a_k (read back to the
  // host: one synchronisation).
  virtual Status propose_draw(KvPool& kv, std::span<const ProposeRequest> reqs,
                              std::span<const DraftDraw> draws,
                              std::vector<std::vector<float>>* confidences) {
    (void)kv;
    (void)reqs;
    (void)draws;
    (void)confidences;
    return Unimplemented("{} drafter: no propose_draw", family());
  }
  // The observes of several sequences; the caches end up as after one observe per request. The
  // default is exactly that loop; DFlash (and its relatives) and FlashMap run all rows in one pass
  // (a batched prefill's prompts, a step's accepted positions).
  virtual Status observe_batch(KvPool& kv, std::span<const ObserveRequest> reqs) {
    for (const ObserveRequest& req : reqs) {
      BS_RETURN_IF_ERROR(observe(kv, req.block_table, req.taps, req.start_pos));
    }
    return Status::Ok();
  }
};

// Detects the drafter family from dir/config.json and loads it against `target` (shared
// embedding / LM head, validation of hidden size, vocab, tapped layers).
Result<std::unique_ptr<Drafter>> load_drafter(const std::string& dir, const CausalLM& target,
                                              const DrafterOptions& options);

}  // namespace bs
