// Generation: plain autoregressive decoding and lossless speculative decoding with a block
// drafter, of one sequence or of several in lockstep. Both stop at the same place for the same
// inputs: a stop token (which is included in the output), max_tokens, or the context window.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/logprobs.h"
#include "engine/sampler.h"
#include "engine/verify_budget.h"
#include "models/causal_lm.h"
#include "models/drafter.h"

namespace bs {

// Prompt tokens per prefill forward unless told otherwise (generate_* and the Scheduler / serve's
// --max-num-batched-tokens): a prefill's memory is bounded by this many rows whatever the prompt
// (docs/RELIABILITY.md). 2,048 rows keep the GEMMs of an 8B model large enough to run at
// tensor-core speed, like vLLM's default max_num_batched_tokens for chunked prefill.
inline constexpr int64_t kDefaultPrefillChunk = 2048;

struct GenerateOptions {
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // usually the tokenizer's EOS ids
  int64_t max_context = 0;        // 0: the target's max_position_embeddings
  int64_t draft_tokens = 0;       // drafts verified per step (1..max_drafts); 0: max_drafts
  // Drafters with a confidence head (DSpark): verify only the drafts whose prefix survival a_j
  // (the head's estimate that drafts 1..j are all accepted) is >= this; 0: off. Never changes the
  // output (the cut depends on drafts 1..j-1 only: lossless, docs/DFLASH.md).
  double draft_confidence_min = 0;
  // Verify-length scheduling (engine/verify_budget.h, docs/DFLASH.md): kAuto lets the batch's
  // step choose how many of this sequence's drafts to verify (DSpark's Algorithm 1: by the
  // drafts' prefix survival, 1 for drafters without a confidence head, and a step-time model
  // measured once per run) after the draft_confidence_min cut. Greedy output is unchanged token
  // for token, sampled output keeps its distribution (a seeded sampled request's tokens then
  // depend on what shares its steps). kOff: every draft is verified.
  VerifyBudget verify_budget = VerifyBudget::kOff;
  std::string trace_path;  // JSON line per speculative step, when set
  // Log-probabilities of the committed tokens (engine/logprobs.h), handed to the
  // LogprobsCallback: -1 off (no logits row is read back for them), 0..kMaxTopLogprobs: the
  // token's own logprob and that many top alternatives. Never changes the tokens.
  int logprobs = -1;
  // generate_plain / generate_speculative: prompt tokens per prefill forward (chunked prefill, so
  // that a prefill's activations and scratch are bounded by the chunk, not by the prompt; the
  // output is the same). 0: the whole prompt in one forward. (The Scheduler has its own budget,
  // SchedulerOptions::max_prefill_tokens.)
  int64_t prefill_chunk = kDefaultPrefillChunk;
};

enum class FinishReason { kStop, kLength, kContext, kCancelled };

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // after prefill until the end
  FinishReason finish = FinishReason::kLength;
  // Speculative decoding only.
  int64_t steps = 0;                       // verify passes
  int64_t drafted = 0;                     // drafts verified
  int64_t accepted = 0;                    // drafts accepted
  std::vector<int64_t> position_offered;   // [k]: steps that verified a draft at offset k
  std::vector<int64_t> position_accepted;  // [k]: steps that accepted the draft at offset k
  // Host wall time per phase of the speculative step (detail::SpeculativeStep; docs/
  // ARCHITECTURE.md, "Step timing"), each the whole batch's phase in a batched step. A step waits
  // for the device once, at its read-back (the accept phase): on an asynchronous device (CUDA)
  // the other phases are the time to issue their work and accept_seconds holds the device time
  // of the whole step; on the CPU backend each is the phase's compute time. blockspec bench
  // times the device work of each alone.
  double draft_seconds = 0;    // propose: the drafts (argmax or a draw), cuts and verify budget
  double verify_seconds = 0;   // verify: the target's forward over every block
  double accept_seconds = 0;   // accept: acceptance on the device, until the step's read-back
  double commit_seconds = 0;   // commit: tokens to the callbacks, logprobs, KV rollback
  double observe_seconds = 0;  // observe: drafter context update (prompt included)
  // Acceptance length tau: committed tokens per verify step (accepted + bonus).
  double acceptance_length() const {
    return steps ? static_cast<double>(accepted + steps) / static_cast<double>(steps) : 0.0;
  }
};

// Called with each committed token as soon as it is final; return false to stop early.
using TokenCallback = std::function<bool(int32_t)>;
// Called with each committed token's log-probabilities (options.logprobs >= 0) just before the
// TokenCallback of that token.
using LogprobsCallback = std::function<void(const TokenLogprobs&)>;

Result<std::vector<int32_t>> generate_plain(CausalLM& target, std::span<const int32_t> prompt,
                                            const GenerateOptions& options,
                                            const TokenCallback& on_token, GenerateStats* stats,
                                            const LogprobsCallback& on_logprobs = nullptr);

Result<std::vector<int32_t>> generate_speculative(CausalLM& target, Drafter& drafter,
                                                  std::span<const int32_t> prompt,
                                                  const GenerateOptions& options,
                                                  const TokenCallback& on_token,
                                                  GenerateStats* stats,
                                                  const LogprobsCallback& on_logprobs = nullptr);

// Plain decoding of several prompts in lockstep (a Scheduler, engine/scheduler.h, admitting them
// all at once): the prompts prefill together (forward_batch, as many as fit the prefill chunk;
// a longer one in chunks of its own), then every step runs one batched target
// forward (CausalLM::forward_batch) over the sequences still generating. Each output is what
// generate_plain gives for that prompt alone with the same options (same stops; sampling draws
// from a sampler seeded as generate_plain's). (*stats)[i] describes prompt i; the timing fields
// are those of the whole batch.
Result<std::vector<std::vector<int32_t>>> generate_plain_batch(
    CausalLM& target, std::span<const std::vector<int32_t>> prompts, const GenerateOptions& options,
    std::vector<GenerateStats>* stats);

// Speculative decoding of several prompts in lockstep (a Scheduler admitting them all at once).
// Each output (tokens, finish reason,
// generated count, steps / drafted / accepted and per-position counts in (*stats)[i]) is what
// generate_speculative gives for that prompt alone with the same options: greedy bit for bit on
// the CPU, sampled from per-sequence samplers seeded as generate_speculative's. Prompts prefill
// together as generate_plain_batch's (the drafter observing all their taps in one pass); then
// each step every sequence still generating proposes its own drafts and one
// CausalLM::forward_batch verifies all blocks (of per-sequence sizes: k shrinks near max_tokens
// and the context end). prefill / decode seconds are those of the whole batch, verify_seconds
// adds the batch's verify time to every sequence in that step. There is no token callback, and
// options.trace_path is refused (InvalidArgument): trace one sequence with
// generate_speculative. Errors about one prompt name its index ("prompt 2: ...").
Result<std::vector<std::vector<int32_t>>> generate_speculative_batch(
    CausalLM& target, Drafter& drafter, std::span<const std::vector<int32_t>> prompts,
    const GenerateOptions& options, std::vector<GenerateStats>* stats);

// Shared checks: non-empty prompt, prompt shorter than the context window, ids in vocab.
Status validate_prompt(const CausalLM& target, std::span<const int32_t> prompt,
                       int64_t max_context);

}  // namespace bs
