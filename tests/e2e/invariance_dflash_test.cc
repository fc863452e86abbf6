// Greedy invariance: speculative decoding with a DFlash drafter produces exactly generate_plain's
// tokens, finish reason and callback sequence, on stories260K (random DFlash drafters from
// tools/goldens/make_dflash_goldens.py), on the tiny Qwen3/Llama targets when their test data
// exists, and with an "oracle" drafter that proposes plain's own continuation (with scheduled
// mistakes) so that long accepted runs, stop tokens inside them, max_tokens and the context window
// are all exercised.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "models/drafter.h"
#include "models/registry.h"

namespace bs {
namespace {

namespace fs = std::filesystem;

const std::string kData = BS_TEST_DATA;
const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";

struct GenRun {
  Status status;
  std::vector<int32_t> out;
  std::vector<int32_t> streamed;
  GenerateStats stats;
};

GenRun run_plain(CausalLM& target, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                 int64_t cancel_after = -1) {
  GenRun r;
  auto cb = [&](int32_t t) {
    r.streamed.push_back(t);
    return cancel_after < 0 || static_cast<int64_t>(r.streamed.size()) < cancel_after;
  };
  auto res = generate_plain(target, prompt, o, cb, &r.stats);
  r.status = res.ok() ? Status::Ok() : res.status();
  if (res.ok()) r.out = *res;
  return r;
}

GenRun run_spec(CausalLM& target, Drafter& drafter, const std::vector<int32_t>& prompt,
                const GenerateOptions& o, int64_t cancel_after = -1) {
  GenRun r;
  auto cb = [&](int32_t t) {
    r.streamed.push_back(t);
    return cancel_after < 0 || static_cast<int64_t>(r.streamed.size()) < cancel_after;
  };
  auto res = generate_speculative(target, drafter, prompt, o, cb, &r.stats);
  r.status = res.ok() ? Status::Ok() : res.status();
  if (res.ok()) r.out = *res;
  return r;
}

// Same tokens, finish reason and stream; sane speculative stats.
void expect_same(const GenRun& plain, const GenRun& spec, const std::string& what) {
  ASSERT_TRUE(plain.status.ok()) << what << ": " << plain.status.message();
  ASSERT_TRUE(spec.status.ok()) << what << ": " << spec.status.message();
  EXPECT_EQ(spec.out, plain.out) << what;
  EXPECT_EQ(spec.streamed, spec.out) << what;
  EXPECT_EQ(static_cast<int>(spec.stats.finish), static_cast<int>(plain.stats.finish)) << what;
  const GenerateStats& s = spec.stats;
  EXPECT_EQ(s.generated_tokens, static_cast<int64_t>(spec.out.size())) << what;
  EXPECT_LE(s.accepted, s.drafted) << what;
  int64_t offered = 0, accepted = 0;
  for (size_t i = 0; i < s.position_offered.size(); ++i) {
    offered += s.position_offered[i];
    accepted += s.position_accepted[i];
    EXPECT_LE(s.position_accepted[i], s.position_offered[i]);
    if (i > 0) {
      EXPECT_LE(s.position_accepted[i], s.position_accepted[i - 1]);
    }
  }
  EXPECT_EQ(offered, s.drafted) << what;
  EXPECT_EQ(accepted, s.accepted) << what;
  // Every committed token after the first comes from a verify step: a accepted + 1 each, except
  // that a stop token or cancellation may cut the last step short.
  if (!spec.out.empty() && spec.stats.finish != FinishReason::kStop &&
      spec.stats.finish != FinishReason::kCancelled) {
    EXPECT_EQ(s.accepted + s.steps, static_cast<int64_t>(spec.out.size()) - 1) << what;
  }
}

// Proposes the known continuation `seq` (prompt + plain output), wrong at scheduled offsets; also
// checks the engine's observe/propose contract: context grows contiguously, each position once,
// and propose's anchor sits right after it.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(Backend& backend, std::vector<int32_t> seq, int64_t block, int64_t vocab,
                int64_t hidden, int wrong_every)
      : backend_(backend),
        seq_(std::move(seq)),
        block_(block),
        vocab_(vocab),
        hidden_(hidden),
        wrong_every_(wrong_every) {}

  std::string family() const override { return "oracle"; }
  int64_t block_size() const override { return block_; }
  int64_t max_drafts() const override { return block_ - 1; }
  const std::vector<int>& target_layers() const override { return layers_; }
  KvPool make_kv_pool(int64_t num_blocks) override {
    observed_ = 0;
    KvPool p;
    p.num_blocks = num_blocks;
    return p;
  }
  Status observe(KvPool& kv, std::span<const int32_t> table, const Tensor& taps,
                 int64_t start_pos) override {
    if (start_pos != observed_) {
      return Internal("observe at {}, but {} positions were observed", start_pos, observed_);
    }
    if (taps.dim(1) != static_cast<int64_t>(layers_.size()) * hidden_) {
      return Internal("taps have {} columns", taps.dim(1));
    }
    const int64_t n = taps.dim(0);
    if (static_cast<int64_t>(table.size()) * kv.block_size < start_pos + n) {
      return Internal("observe: block table too short");
    }
    observed_ += n;
    return Status::Ok();
  }
  Status propose(KvPool& kv, const ProposeRequest& req, Tensor* logits) override {
    if (req.anchor_pos != observed_) {
      return Internal("propose at s={} with {} observed positions", req.anchor_pos, observed_);
    }
    if (req.anchor_pos < static_cast<int64_t>(seq_.size()) && seq_[req.anchor_pos] != req.anchor) {
      return Internal("anchor {} at {} is not the committed token", req.anchor, req.anchor_pos);
    }
    if (static_cast<int64_t>(req.block_table.size()) * kv.block_size < req.anchor_pos + block_) {
      return Internal("propose: block table does not cover s + B");
    }
    if (req.num_drafts < 1 || req.num_drafts > block_ - 1) return Internal("num_drafts");
    std::vector<float> host(static_cast<size_t>(req.num_drafts * vocab_), 0.0f);
    for (int64_t j = 0; j < req.num_drafts; ++j) {
      const int64_t pos = req.anchor_pos + 1 + j;
      int32_t tok = pos < static_cast<int64_t>(seq_.size()) ? seq_[pos] : 3;
      if (wrong_every_ > 0 && (pos * 7 + j) % wrong_every_ == 0) {
        tok = static_cast<int32_t>((tok + 1) % vocab_);
      }
      host[j * vocab_ + tok] = 10.0f;
    }
    buf_ = backend_.empty({req.num_drafts, vocab_});
    backend_.copy_from_host(buf_, host.data());
    *logits = buf_;
    return Status::Ok();
  }

 private:
  template <typename... Args>
  static Status Internal(fmt::format_string<Args...> f, Args&&... args) {
    return {StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...)};
  }
  Backend& backend_;
  std::vector<int32_t> seq_;
  int64_t block_, vocab_, hidden_;
  int wrong_every_;
  std::vector<int> layers_ = {0, 2};
  int64_t observed_ = 0;
  Tensor buf_;
};

std::vector<std::vector<int32_t>> stories_prompts() {
  std::mt19937 rng(7);
  std::vector<int32_t> random_prompt = {1};
  for (int i = 0; i < 29; ++i) random_prompt.push_back(static_cast<int32_t>(3 + rng() % 509));
  return {{1}, {1, 403, 407, 261, 378, 432}, random_prompt};
}

class Stories : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    auto t = load_target(kStories, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
  }
  std::unique_ptr<Drafter> dflash(const std::string& name, const DrafterOptions& options = {}) {
    auto d = load_drafter(kData + "/" + name, *target_, options);
    EXPECT_TRUE(d.ok()) << d.status().message();
    return d.ok() ? std::move(*d) : nullptr;
  }
  // The prompt through the target into `seq` (with `extra` positions reserved past it); returns
  // a copy of the drafter's taps (the forward's own live in scratch the next forward reuses).
  Tensor prefill_taps(const std::vector<int32_t>& prompt, SequenceKv& seq, int64_t extra,
                      const Drafter& drafter, KvPool& target_kv) {
    const auto P = static_cast<int64_t>(prompt.size());
    EXPECT_TRUE(seq.reserve(P + extra).ok());
    ForwardResult res;
    EXPECT_TRUE(target_
                    ->forward({.tokens = prompt,
                               .start_pos = 0,
                               .block_table = seq.block_table(),
                               .num_logits = 1,
                               .tap_layers = drafter.target_layers()},
                              target_kv, &res)
                    .ok());
    const Tensor taps = backend_->empty({res.taps.dim(0), res.taps.dim(1)}, res.taps.dtype());
    backend_->copy(taps, res.taps);
    return taps;
  }
  std::unique_ptr<OracleDrafter> oracle(const std::vector<int32_t>& prompt,
                                        const std::vector<int32_t>& continuation, int wrong_every,
                                        int64_t block = 8) {
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), continuation.begin(), continuation.end());
    return std::make_unique<OracleDrafter>(*backend_, seq, block, 512, 64, wrong_every);
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
};

TEST_F(Stories, RandomDFlashDraftersAreLossless) {
  for (const char* name : {"dflash-stories260K", "dflash-stories260K-swa"}) {
    auto drafter = dflash(name);
    ASSERT_TRUE(drafter);
    const auto prompts = stories_prompts();
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
      const auto& prompt = prompts[pi];
      for (int64_t max_tokens : {60, 200}) {
        if (max_tokens == 200 && pi != 1) continue;  // one long run per drafter
        GenerateOptions o;
        o.max_tokens = max_tokens;
        o.stop_ids = {2};
        const GenRun plain = run_plain(*target_, prompt, o);
        for (int64_t dt : {1, 3, 7}) {
          o.draft_tokens = std::min(dt, drafter->max_drafts());
          const GenRun spec = run_spec(*target_, *drafter, prompt, o);
          expect_same(plain, spec,
                      fmt::format("{} prompt {} max_tokens {} draft_tokens {}", name, prompt.size(),
                                  max_tokens, o.draft_tokens));
        }
      }
    }
  }
}

// FP8 drafter weights change what the drafter proposes, never what is generated.
TEST_F(Stories, Fp8DFlashDraftersAreLossless) {
  auto drafter = dflash("dflash-stories260K", {.fp8_weights = true});
  ASSERT_TRUE(drafter);
  for (const auto& prompt : stories_prompts()) {
    GenerateOptions o;
    o.max_tokens = 80;
    o.stop_ids = {2};
    const GenRun plain = run_plain(*target_, prompt, o);
    const GenRun spec = run_spec(*target_, *drafter, prompt, o);
    expect_same(plain, spec, fmt::format("fp8 drafter, prompt of {} tokens", prompt.size()));
  }
}

// propose_batch runs the blocks of several sequences through the drafter together; every
// sequence's draft logits must equal its own propose bit for bit (the CPU backend's rows are
// independent of the other rows), with different context lengths, draft counts and tables.
TEST_F(Stories, ProposeBatchEqualsProposeAlone) {
  for (const char* name : {"dflash-stories260K", "dflash-stories260K-swa"}) {
    auto drafter = dflash(name);
    ASSERT_TRUE(drafter);
    const int64_t B = drafter->block_size();
    const auto prompts = stories_prompts();
    const int64_t per_seq = 4, S = static_cast<int64_t>(prompts.size());
    KvPool target_kv = target_->make_kv_pool(S * per_seq);
    KvPool draft_kv = drafter->make_kv_pool(S * per_seq);
    BlockAllocator alloc(S * per_seq);
    std::vector<std::unique_ptr<SequenceKv>> seqs;
    std::vector<ProposeRequest> reqs;
    for (int64_t i = 0; i < S; ++i) {
      const auto& prompt = prompts[i];
      const auto P = static_cast<int64_t>(prompt.size());
      seqs.push_back(std::make_unique<SequenceKv>(alloc, kKvBlockSize));
      const Tensor taps = prefill_taps(prompt, *seqs[i], B, *drafter, target_kv);
      ASSERT_TRUE(drafter->observe(draft_kv, seqs[i]->block_table(), taps, 0).ok());
      reqs.push_back({.anchor = prompt.back(),
                      .anchor_pos = P,
                      .block_table = seqs[i]->block_table(),
                      .num_drafts = std::min<int64_t>(B - 1, 2 + 3 * i)});
    }
    std::vector<std::vector<float>> alone;
    for (const ProposeRequest& req : reqs) {
      Tensor logits;
      ASSERT_TRUE(drafter->propose(draft_kv, req, &logits).ok());
      alone.push_back(backend_->to_host_f32(logits));
    }
    Tensor batch_logits;
    ASSERT_TRUE(drafter->propose_batch(draft_kv, reqs, &batch_logits).ok());
    const std::vector<float> batch = backend_->to_host_f32(batch_logits);
    int64_t nd = 0;
    for (const ProposeRequest& req : reqs) nd = std::max(nd, req.num_drafts);
    const int64_t vocab = batch_logits.dim(1);
    ASSERT_EQ(batch_logits.dim(0), S * nd);
    for (int64_t i = 0; i < S; ++i) {
      ASSERT_EQ(static_cast<int64_t>(alone[i].size()), reqs[i].num_drafts * vocab);
      const std::vector<float> rows(batch.begin() + i * nd * vocab,
                                    batch.begin() + (i * nd + reqs[i].num_drafts) * vocab);
      EXPECT_EQ(rows, alone[i]) << name << " sequence " << i;
    }
    // A sequence proposed alone after the batch still gets its own drafts (scratch reuse).
    Tensor again;
    ASSERT_TRUE(drafter->propose(draft_kv, reqs[1], &again).ok());
    EXPECT_EQ(backend_->to_host_f32(again), alone[1]) << name;
  }
}

// observe_batch writes exactly the context K/V that one observe per sequence writes.
TEST_F(Stories, ObserveBatchWritesWhatObservesWrite) {
  for (const char* name : {"dflash-stories260K", "dflash-stories260K-swa"}) {
    auto drafter = dflash(name);
    ASSERT_TRUE(drafter);
    const auto prompts = stories_prompts();
    const int64_t per_seq = 4, S = static_cast<int64_t>(prompts.size());
    KvPool target_kv = target_->make_kv_pool(S * per_seq);
    KvPool alone_kv = drafter->make_kv_pool(S * per_seq);
    KvPool batch_kv = drafter->make_kv_pool(S * per_seq);
    BlockAllocator alloc(S * per_seq);
    std::vector<std::unique_ptr<SequenceKv>> seqs;
    std::vector<ObserveRequest> reqs;
    for (int64_t i = 0; i < S; ++i) {
      seqs.push_back(std::make_unique<SequenceKv>(alloc, kKvBlockSize));
      const Tensor all = prefill_taps(prompts[i], *seqs[i], 0, *drafter, target_kv);
      // Sequence i observes its rows from position i (any start works; rows differ per sequence).
      const Tensor taps = all.rows(0, all.dim(0) - i);
      ASSERT_TRUE(drafter->observe(alone_kv, seqs[i]->block_table(), taps, i).ok());
      reqs.push_back({.block_table = seqs[i]->block_table(), .taps = taps, .start_pos = i});
    }
    ASSERT_TRUE(drafter->observe_batch(batch_kv, reqs).ok());
    // Compare the slots the observes wrote (the rest of the pools holds whatever was there).
    for (size_t l = 0; l < alone_kv.k.size(); ++l) {
      for (const bool keys : {true, false}) {
        const std::vector<float> a = backend_->to_host_f32(keys ? alone_kv.k[l] : alone_kv.v[l]);
        const std::vector<float> b = backend_->to_host_f32(keys ? batch_kv.k[l] : batch_kv.v[l]);
        const int64_t row = alone_kv.k[l].numel() / (alone_kv.num_blocks * alone_kv.block_size);
        for (int64_t i = 0; i < S; ++i) {
          const auto table = seqs[i]->block_table();
          for (int64_t p = reqs[i].start_pos; p < reqs[i].start_pos + reqs[i].taps.dim(0); ++p) {
            const int64_t slot =
                table[p / alone_kv.block_size] * alone_kv.block_size + p % alone_kv.block_size;
            const std::vector<float> ra(a.begin() + slot * row, a.begin() + (slot + 1) * row);
            const std::vector<float> rb(b.begin() + slot * row, b.begin() + (slot + 1) * row);
            EXPECT_EQ(rb, ra) << name << " layer " << l << (keys ? " K" : " V") << " sequence " << i
                              << " position " << p;
          }
        }
      }
    }
  }
}

TEST_F(Stories, OracleDrafterLongAcceptedRuns) {
  for (const auto& prompt : stories_prompts()) {
    GenerateOptions o;
    o.max_tokens = 150;
    const GenRun plain = run_plain(*target_, prompt, o);
    ASSERT_TRUE(plain.status.ok());
    for (int wrong_every : {0, 3, 5, 11}) {
      for (int64_t dt : {1, 4, 7}) {
        auto d = oracle(prompt, plain.out, wrong_every);
        o.draft_tokens = dt;
        const GenRun spec = run_spec(*target_, *d, prompt, o);
        expect_same(plain, spec,
                    fmt::format("oracle prompt {} wrong_every {} draft_tokens {}", prompt.size(),
                                wrong_every, dt));
        if (wrong_every == 0) {
          EXPECT_EQ(spec.stats.accepted, spec.stats.drafted) << "a perfect drafter";
          EXPECT_GT(spec.stats.acceptance_length(), 0.9 * static_cast<double>(dt + 1));
        }
      }
    }
  }
}

TEST_F(Stories, StopTokenInsideAcceptedRun) {
  const std::vector<int32_t> prompt = {1, 403, 407};
  GenerateOptions o;
  o.max_tokens = 120;
  const GenRun free_run = run_plain(*target_, prompt, o);
  ASSERT_TRUE(free_run.status.ok());
  ASSERT_GE(free_run.out.size(), 40u);
  auto dflash_drafter = dflash("dflash-stories260K");
  ASSERT_TRUE(dflash_drafter);
  // Stop on tokens that first occur at various offsets of the free run.
  for (size_t idx : {0, 1, 2, 5, 9, 17, 30}) {
    o.stop_ids = {free_run.out[idx]};
    const GenRun plain = run_plain(*target_, prompt, o);
    ASSERT_EQ(plain.stats.finish, FinishReason::kStop);
    for (int wrong_every : {0, 4}) {
      for (int64_t dt : {2, 7}) {
        auto d = oracle(prompt, free_run.out, wrong_every);
        o.draft_tokens = dt;
        expect_same(plain, run_spec(*target_, *d, prompt, o),
                    fmt::format("stop idx {} wrong_every {} dt {}", idx, wrong_every, dt));
      }
    }
    o.draft_tokens = 7;
    expect_same(plain, run_spec(*target_, *dflash_drafter, prompt, o),
                fmt::format("dflash stop idx {}", idx));
  }
}

TEST_F(Stories, MaxTokensEdges) {
  const std::vector<int32_t> prompt = {1, 403};
  GenerateOptions o;
  o.max_tokens = 40;
  const GenRun free_run = run_plain(*target_, prompt, o);
  ASSERT_TRUE(free_run.status.ok());
  auto dflash_drafter = dflash("dflash-stories260K");
  ASSERT_TRUE(dflash_drafter);
  for (int64_t m = 0; m <= 20; ++m) {
    o.max_tokens = m;
    const GenRun plain = run_plain(*target_, prompt, o);
    for (int64_t dt : {1, 3, 7}) {
      o.draft_tokens = dt;
      auto d = oracle(prompt, free_run.out, 0);
      expect_same(plain, run_spec(*target_, *d, prompt, o),
                  fmt::format("oracle max_tokens {} dt {}", m, dt));
      expect_same(plain, run_spec(*target_, *dflash_drafter, prompt, o),
                  fmt::format("dflash max_tokens {} dt {}", m, dt));
    }
  }
}

TEST_F(Stories, ContextWindowEdges) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261};
  GenerateOptions o;
  o.max_tokens = 40;
  const GenRun free_run = run_plain(*target_, prompt, o);
  ASSERT_TRUE(free_run.status.ok());
  auto dflash_drafter = dflash("dflash-stories260K");
  ASSERT_TRUE(dflash_drafter);
  o.max_tokens = 100;
  for (int64_t room = 1; room <= 14; ++room) {
    o.max_context = static_cast<int64_t>(prompt.size()) + room;
    const GenRun plain = run_plain(*target_, prompt, o);
    ASSERT_EQ(plain.stats.finish, FinishReason::kContext);
    for (int64_t dt : {1, 7}) {
      o.draft_tokens = dt;
      auto d = oracle(prompt, free_run.out, room % 3 == 0 ? 4 : 0);
      expect_same(plain, run_spec(*target_, *d, prompt, o),
                  fmt::format("oracle room {} dt {}", room, dt));
      expect_same(plain, run_spec(*target_, *dflash_drafter, prompt, o),
                  fmt::format("dflash room {} dt {}", room, dt));
    }
  }
  // The stories target's own window (512 positions) with the default max_context.
  o.max_context = 0;
  o.max_tokens = 1000;
  const std::vector<int32_t> long_prompt(500, 261);
  const GenRun plain = run_plain(*target_, long_prompt, o);
  ASSERT_EQ(plain.stats.finish, FinishReason::kContext);
  o.draft_tokens = 7;
  expect_same(plain, run_spec(*target_, *dflash_drafter, long_prompt, o), "default window");
}

TEST_F(Stories, Cancellation) {
  const std::vector<int32_t> prompt = {1};
  GenerateOptions o;
  o.max_tokens = 60;
  const GenRun free_run = run_plain(*target_, prompt, o);
  for (int64_t cancel_after : {1, 2, 5, 13}) {
    const GenRun plain = run_plain(*target_, prompt, o, cancel_after);
    ASSERT_EQ(plain.stats.finish, FinishReason::kCancelled);
    o.draft_tokens = 7;
    auto d = oracle(prompt, free_run.out, 0);
    expect_same(plain, run_spec(*target_, *d, prompt, o, cancel_after),
                fmt::format("cancel after {}", cancel_after));
  }
}

TEST_F(Stories, TraceAndErrors) {
  auto drafter = dflash("dflash-stories260K");
  ASSERT_TRUE(drafter);
  const fs::path trace =
      fs::temp_directory_path() / ("bs_dflash_trace_" + std::to_string(getpid()) + ".jsonl");
  GenerateOptions o;
  o.max_tokens = 30;
  o.trace_path = trace.string();
  const GenRun spec = run_spec(*target_, *drafter, {1, 403}, o);
  ASSERT_TRUE(spec.status.ok()) << spec.status.message();
  std::ifstream in(trace);
  std::string line;
  int64_t lines = 0, accepted = 0, drafted = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("step").get<int64_t>(), lines);
    for (const char* key : {"anchor_pos", "anchor", "drafts", "accepted", "bonus", "draft_ms",
                            "verify_ms", "accept_ms", "commit_ms", "observe_ms"}) {
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
    }
    accepted += j.at("accepted").get<int64_t>();
    drafted += static_cast<int64_t>(j.at("drafts").size());
    ++lines;
  }
  fs::remove(trace);
  EXPECT_EQ(lines, spec.stats.steps);
  EXPECT_EQ(accepted, spec.stats.accepted);
  EXPECT_EQ(drafted, spec.stats.drafted);
  EXPECT_GT(spec.stats.verify_seconds, 0);
  EXPECT_GT(spec.stats.accept_seconds, 0);
  EXPECT_GT(spec.stats.commit_seconds, 0);
  EXPECT_GT(spec.stats.observe_seconds, 0);

  o.trace_path.clear();
  o.draft_tokens = 8;  // block 8: at most 7 drafts
  const GenRun bad = run_spec(*target_, *drafter, {1}, o);
  EXPECT_EQ(bad.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status.message().find("draft_tokens"), std::string::npos);
  o.draft_tokens = 0;
  o.trace_path = "/nonexistent-dir/trace.jsonl";
  EXPECT_FALSE(run_spec(*target_, *drafter, {1}, o).status.ok());
}

// The tiny Qwen3 / Llama targets of make_target_goldens.py with their random DFlash drafters.
class TinyTargets : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyTargets, GreedyInvariance) {
  const std::string target_dir = kData + "/" + GetParam();
  const std::string drafter_dir = kData + "/dflash-" + GetParam();
  if (!fs::exists(target_dir + "/config.json") || !fs::exists(drafter_dir + "/config.json")) {
    GTEST_SKIP() << "no test data " << target_dir << " / " << drafter_dir
                 << " (tools/goldens/make_target_goldens.py, make_dflash_goldens.py)";
  }
  auto backend = make_cpu_backend(2);
  auto target = load_target(target_dir, *backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto drafter = load_drafter(drafter_dir, **target, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  const int64_t vocab = (*target)->config().vocab_size;
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts = {{1}, {}};
  for (int i = 0; i < 17; ++i) prompts[1].push_back(static_cast<int32_t>(rng() % vocab));
  for (const auto& prompt : prompts) {
    GenerateOptions o;
    o.max_tokens = 80;
    o.stop_ids = {2};
    const GenRun plain = run_plain(**target, prompt, o);
    for (int64_t dt : {1, 3, 7}) {
      o.draft_tokens = std::min(dt, (*drafter)->max_drafts());
      expect_same(plain, run_spec(**target, **drafter, prompt, o),
                  fmt::format("{} prompt {} dt {}", GetParam(), prompt.size(), o.draft_tokens));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Data, TinyTargets, ::testing::Values("tiny-qwen3", "tiny-llama"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace bs
