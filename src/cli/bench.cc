// `blockspec bench`: step times of the pieces of (speculative) decoding, medians after warm-up,
// timed with CUDA events on the GPU and std::chrono on the CPU:
//   decode    one token through the target + argmax + read back (plain decoding's step);
//   verify    B tokens through the target with the drafter's taps + argmax of B rows (B = the
//             anchor and every draft: DFlash's block_size, FlashMap's block_size + 1);
//   draft     one drafter proposal + argmax on the device (a greedy engine step reads no drafts
//             back: they go to the verify on the device);
//   context   the drafter's context update (observe) for B committed positions;
// plus the copy bandwidth of the device, the bytes a decode step must stream, end-to-end
// plain / speculative generation rates, and with --kernels each op alone at the model's shapes.
// --batch N times N sequences in lockstep instead: the batched decode and verify steps and
// batched plain / speculative generation (with --kernels also each op of the batched decode step).
// On CUDA, --gemv all (default) times every few-row matmul mode. Also registers
// `blockspec synth` (synth.cc). Results and method: docs/BENCHMARKS.md.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/validators.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "models/drafter.h"
#include "models/registry.h"
#ifdef BLOCKSPEC_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace bs::cli {

// synth.cc
void register_synth(CLI::App& app);
bool run_synth_if_parsed(int* rc);
// bench_serve.cc
void register_bench_serve(CLI::App& app);
bool run_bench_serve_if_parsed(int* rc);

namespace {

struct BenchArgs {
  std::string model;
  std::string drafter;
  std::string device = "auto";
  int batch = 1;
  int iters = 50;
  int warmup = 5;
  int64_t context = 512;
  int64_t gen_tokens = 256;
  int64_t prompt_tokens = 0;  // the end-to-end runs' prompts; 0: min(32, context)
  int64_t copy_mb = 0;
  int threads = 0;
  std::string gemv = "all";
  bool kernels = false;
  bool drafter_fp8 = false;
  double draft_confidence_min = 0;
  VerifyBudget verify_budget = VerifyBudget::kOff;
  int flashmap_steps = 0;
  float flashmap_noise_scale = 1.0f;
};

BenchArgs g_args;
CLI::App* g_cmd = nullptr;

class Timer {
 public:
  virtual ~Timer() = default;
  virtual void start() = 0;
  virtual double stop_ms() = 0;
};

class WallTimer final : public Timer {
 public:
  explicit WallTimer(Backend& be) : be_(be) {}
  void start() override {
    be_.synchronize();
    t0_ = std::chrono::steady_clock::now();
  }
  double stop_ms() override {
    be_.synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_)
        .count();
  }

 private:
  Backend& be_;
  std::chrono::steady_clock::time_point t0_;
};

#ifdef BLOCKSPEC_HAS_CUDA
class CudaTimer final : public Timer {
 public:
  explicit CudaTimer(Backend& be) : t_(be) {}
  void start() override { t_.start(); }
  double stop_ms() override { return t_.stop_ms(); }

 private:
  cuda::EventTimer t_;
};
#endif

std::unique_ptr<Timer> make_timer(Backend& be) {
#ifdef BLOCKSPEC_HAS_CUDA
  if (be.device() == Device::kCuda) return std::make_unique<CudaTimer>(be);
#endif
  return std::make_unique<WallTimer>(be);
}

struct Stats {
  double median = 0, p10 = 0, p90 = 0;
  int n = 0;
};

// Runs f() warmup times, then iters timed times; f returns false on error.
template <typename F>
Result<Stats> time_it(Timer& timer, int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) BS_RETURN_IF_ERROR(f());
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    timer.start();
    BS_RETURN_IF_ERROR(f());
    ms.push_back(timer.stop_ms());
  }
  std::sort(ms.begin(), ms.end());
  Stats s;
  s.n = iters;
  s.median = ms[ms.size() / 2];
  s.p10 = ms[ms.size() / 10];
  s.p90 = ms[ms.size() * 9 / 10];
  return s;
}

double host_copy_bandwidth_gbs(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    a[i] = b[bytes - 1 - i];  // keep the copies observable
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

// Bytes one decode step must read: every matrix except the embedding table (one row of it),
// plus the 1-D weights, in the backend's storage types.
double decode_weight_bytes(const CausalLM& m) {
  const auto& c = m.config();
  const double mat = static_cast<double>(dtype_size(m.backend().activation_dtype()));
  const double vec = 4.0;
  const double h = static_cast<double>(c.hidden_size), hd = static_cast<double>(c.head_dim);
  const double q = static_cast<double>(c.num_heads) * hd,
               kv = static_cast<double>(c.num_kv_heads) * hd,
               inter = static_cast<double>(c.intermediate_size);
  const double per_layer =
      mat * (h * q + 2 * h * kv + q * h + 3 * h * inter) + vec * (2 * h + 2 * hd);
  return per_layer * static_cast<double>(c.num_layers) +
         mat * static_cast<double>(c.vocab_size) * h + vec * h;
}

void set_mode(Backend& be, const std::string& mode);

using GemvModes = std::vector<std::pair<std::string, std::string>>;

// Times an op launched back to back `reps` times between two timer marks (so launch gaps are
// included, host round trips are not), after 3 untimed launches; f(i) gets the repetition.
struct OpTimer {
  Timer& timer;
  int reps = 50;
  double us(const std::function<void(int)>& f) const {
    for (int i = 0; i < 3; ++i) f(i);
    timer.start();
    for (int i = 0; i < reps; ++i) f(i);
    return timer.stop_ms() * 1e3 / reps;
  }
};

struct Mat {
  const char* name;
  int64_t m, k, per_layer;
};

// The decoder's fused projections (models/decoder.cc) and the LM head.
std::vector<Mat> decoder_mats(const io::TransformerConfig& c) {
  const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const int64_t I = c.intermediate_size;
  return {{"qkv_proj", (nh + 2 * nkv) * hd, H, 1},
          {"o_proj", H, nh * hd, 1},
          {"gate_up_proj", 2 * I, H, 1},
          {"down_proj", H, I, 1},
          {"lm_head", c.vocab_size, H, 0}};
}

// Every matmul of decoder_mats at n rows in each of `modes` (into y [>= n, >= every m]); the
// layers' weights rotate over disjoint slices of the LM head so that no repetition is served from
// L2. Prints per-op times and a forward's total (`per` names what the total is per); returns the
// first mode's total in ms.
double time_matmuls(Backend& be, const CausalLM& target, const OpTimer& op, int64_t n,
                    const GemvModes& modes, const Tensor& y, const std::string& per) {
  const auto& c = target.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, L = c.num_layers;
  const Tensor lm = target.lm_head();
  const Tensor flat = lm.view({V * H});
  double first_ms = -1;
  for (const auto& [label, mode] : modes) {
    set_mode(be, mode);
    double layer_us = 0, head_us = 0;
    std::string line;
    for (const auto& mt : decoder_mats(c)) {
      const int64_t elems = mt.m * mt.k;
      const int64_t slices = std::max<int64_t>(1, (V * H - n * mt.k) / elems);
      const Tensor x = flat.rows(V * H - n * mt.k, n * mt.k).view({n, mt.k});
      const Tensor yv = y.view({-1}).rows(0, n * mt.m).view({n, mt.m});
      const double us = op.us([&](int i) {
        const Tensor w =
            mt.per_layer == 0 ? lm : flat.rows((i % slices) * elems, elems).view({mt.m, mt.k});
        be.matmul(yv, x, w);
      });
      const double gbs = static_cast<double>(elems) * 2 / (us * 1e-6) / 1e9;
      line += fmt::format(" {} {:.1f} us ({:.0f} GB/s);", mt.name, us, gbs);
      if (mt.per_layer)
        layer_us += us * static_cast<double>(mt.per_layer);
      else
        head_us += us;
    }
    fmt::print("  matmul [{}]:{}\n", label.empty() ? "default" : label, line);
    fmt::print("  matmul [{}] per {}: {:.3f} ms ({} layers x {:.1f} us + head {:.1f} us)\n",
               label.empty() ? "default" : label, per,
               (layer_us * static_cast<double>(L) + head_us) / 1e3, L, layer_us, head_us);
    if (first_ms < 0) first_ms = (layer_us * static_cast<double>(L) + head_us) / 1e3;
  }
  set_mode(be, "auto");
  return first_ms;
}

// A layer's RMSNorm + projection and SwiGLU + down projection pairs (Backend::norm_matmul /
// swiglu_matmul) at n rows in each mode: the ops apart, or one fused kernel where the mode has it
// (--gemv stream with BLOCKSPEC_STREAM_VARIANT=4|5). Weights rotate as in time_matmuls.
void time_fused_pairs(Backend& be, const CausalLM& target, const OpTimer& op, int64_t n,
                      const GemvModes& modes, const Tensor& y) {
  const auto& c = target.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const Tensor flat = target.lm_head().view({V * H});
  const std::vector<float> ones(static_cast<size_t>(H), 1.0f);
  const Tensor norm_w = be.upload_weight(DType::kF32, ones.data(), {H});
  const Tensor x = flat.rows(V * H - n * 2 * I, n * H).view({n, H});
  const Tensor gate_up = flat.rows(V * H - n * 2 * I, n * 2 * I).view({n, 2 * I});
  const Tensor scratch = be.empty({n, std::max(H, I)});
  for (const auto& [label, mode] : modes) {
    set_mode(be, mode);
    std::string line;
    for (const auto& mt : decoder_mats(c)) {
      const bool normed = mt.k == H && mt.per_layer != 0 && std::string(mt.name) != "o_proj";
      const bool swiglu = mt.k == I && std::string(mt.name) == "down_proj";
      if (!normed && !swiglu) continue;
      const int64_t elems = mt.m * mt.k;
      const int64_t slices = std::max<int64_t>(1, (V * H - n * 2 * I) / elems);
      const Tensor yv = y.view({-1}).rows(0, n * mt.m).view({n, mt.m});
      const double us = op.us([&](int i) {
        const Tensor w = flat.rows((i % slices) * elems, elems).view({mt.m, mt.k});
        const Tensor sc = scratch.view({-1}).rows(0, n * mt.k).view({n, mt.k});
        if (swiglu) {
          be.swiglu_matmul(yv, sc, gate_up, w);
        } else {
          be.norm_matmul(yv, sc, x, norm_w, 1e-6f, w);
        }
      });
      line += fmt::format(" {} + {} {:.1f} us;", swiglu ? "swiglu" : "rms_norm", mt.name, us);
    }
    fmt::print("  norm / swiglu + matmul [{}]:{}\n", label.empty() ? "default" : label, line);
  }
  set_mode(be, "auto");
}

// The small ops of a forward of `seqs` sequences of n / seqs rows each over `ctx` cached tokens
// apiece, at the target's shapes: seqs == 1 one sequence (decode, verify), its attention one
// paged_attention; seqs == n a batched decode step, its attention as decoder_layer runs an even
// batch (prologue_attention: the qk-norm / rope / KV-write prologue fused with
// paged_attention_batch), the unfused pair timed beside it (not counted). Inputs are slices of
// the LM head; every sequence owns its blocks. Prints per-op times; returns the forward's total in
// ms.
double time_small_ops(Backend& be, const CausalLM& target, const OpTimer& op, int64_t n,
                      int64_t seqs, int64_t ctx, const Tensor& y, const std::string& per) {
  const auto& c = target.config();
  const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const int64_t I = c.intermediate_size, V = c.vocab_size, L = c.num_layers;
  const Tensor flat = target.lm_head().view({V * H});
  std::vector<float> ones(static_cast<size_t>(std::max(H, hd)), 1.0f);
  const Tensor wn = be.upload_weight(DType::kF32, ones.data(), {H});
  const Tensor wh = be.upload_weight(DType::kF32, ones.data(), {hd});
  const Tensor x = be.empty({n, H}), xn = be.empty({n, H});
  be.copy(x, flat.rows(0, n * H).view({n, H}));
  const Tensor q = be.empty({n, nh, hd}), o = be.empty({n, nh, hd});
  be.copy(q, flat.rows(0, n * nh * hd).view({n, nh, hd}));
  const Tensor gate_up = be.empty({n, 2 * I}), act = be.empty({n, I});
  be.copy(gate_up, flat.rows(0, 2 * n * I).view({n, 2 * I}));
  const Tensor qkv = be.empty({n, (nh + 2 * nkv) * hd});
  be.copy(qkv, flat.rows(0, qkv.numel()).view({n, (nh + 2 * nkv) * hd}));
  const int64_t rows = n / seqs, per_seq = (ctx + rows) / kKvBlockSize + 2, blocks = seqs * per_seq;
  const Tensor kp = be.empty({blocks, kKvBlockSize, nkv, hd}),
               vp = be.empty({blocks, kKvBlockSize, nkv, hd});
  for (int64_t kv = 0; kv < 2; ++kv) {  // in pieces: the pools may outgrow the LM head
    const Tensor dst = (kv == 0 ? kp : vp).view({-1});
    for (int64_t at = 0; at < dst.numel(); at += V * H / 2) {
      const int64_t len = std::min(V * H / 2, dst.numel() - at);
      be.copy(dst.rows(at, len), flat.rows(kv * (V * H / 2), len));
    }
  }
  // Sequence s: table row s = blocks [s * per_seq, (s + 1) * per_seq), rows at ctx, ctx + 1, ...
  std::vector<int32_t> pos(n), slot(n), table(blocks), kv_len(seqs);
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>(i);
  for (int64_t s = 0; s < seqs; ++s) {
    kv_len[s] = static_cast<int32_t>(ctx + rows);
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t p = ctx + j;
      pos[s * rows + j] = static_cast<int32_t>(p);
      slot[s * rows + j] =
          static_cast<int32_t>((s * per_seq + p / kKvBlockSize) * kKvBlockSize + p % kKvBlockSize);
    }
  }
  const Tensor pos_t = be.empty({n}, DType::kI32), slot_t = be.empty({n}, DType::kI32),
               table_t = be.empty({seqs, per_seq}, DType::kI32),
               len_t = be.empty({seqs}, DType::kI32), ids = be.empty({n}, DType::kI32);
  be.copy_from_host(pos_t, pos.data());
  be.copy_from_host(slot_t, slot.data());
  be.copy_from_host(table_t, table.data());
  be.copy_from_host(len_t, kv_len.data());
  std::vector<float> freq(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) freq[i] = std::pow(1e6f, -2.0f * i / hd);
  const Tensor inv = be.upload_weight(DType::kF32, freq.data(), {hd / 2});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto prologue = [&](int) {
    be.attention_prologue(q, qkv, wh, wh, 1e-6f, pos_t, inv, 1.0f, kp, vp, slot_t);
  };
  struct Small {
    const char* name;
    int per_layer;  // -1: timed for comparison, not counted
    std::function<void(int)> f;
  };
  std::vector<Small> smalls = {{"rms_norm", 2, [&](int) { be.rms_norm(xn, x, wn, 1e-6f); }}};
  if (seqs == 1) {
    smalls.push_back({"qk_norm+rope+kv_write", 1, prologue});
    smalls.push_back({"attention", 1, [&](int) {
                        be.paged_attention(o, q, kp, vp, table_t.view({per_seq}), ctx + rows,
                                           AttentionMask{}, scale);
                      }});
  } else {
    smalls.push_back({"prologue+attention (fused, as the decoder)", 1, [&](int) {
                        be.prologue_attention(o, q, qkv, wh, wh, 1e-6f, pos_t, inv, 1.0f, kp, vp,
                                              slot_t, table_t, len_t, ctx + rows, AttentionMask{},
                                              scale);
                      }});
    smalls.push_back({"unfused: qk_norm+rope+kv_write", -1, prologue});
    smalls.push_back({"unfused: attention (batched)", -1, [&](int) {
                        be.paged_attention_batch(o, q, kp, vp, table_t, len_t, ctx + rows,
                                                 AttentionMask{}, scale);
                      }});
  }
  smalls.push_back({"swiglu", 1, [&](int) { be.swiglu(act, gate_up); }});
  smalls.push_back({"embedding", 0, [&](int) { be.embedding(xn, ids, target.embed_tokens()); }});
  smalls.push_back({"argmax", 0, [&](int) {
                      be.argmax(ids, y.view({-1}).rows(0, n * V).view({n, V}));
                    }});
  double layer_us = 0, once_us = 0;
  std::string line;
  for (const auto& sm : smalls) {
    const double us = op.us(sm.f);
    line += fmt::format(" {} {:.1f};", sm.name, us);
    if (sm.per_layer > 0)
      layer_us += us * sm.per_layer;
    else if (sm.per_layer == 0)
      once_us += us;
  }
  const double ms = (layer_us * static_cast<double>(L) + once_us) / 1e3;
  fmt::print("  small ops (us):{}\n", line);
  fmt::print(
      "  small ops per {}: {:.3f} ms ({} layers x {:.1f} us + {:.1f} us; attention over {} "
      "keys{})\n",
      per, ms, L, layer_us, once_us, ctx + rows,
      seqs > 1 ? fmt::format(" in each of {} sequences", seqs) : "");
  return ms;
}

// Per-op GPU/CPU times at the target's shapes (OpTimer), at 1 row and at `rows` rows of one
// sequence over `ctx` cached tokens, each matmul in each of `modes`.
void kernel_breakdown(Backend& be, const CausalLM& target, Timer& timer, int64_t rows, int64_t ctx,
                      const GemvModes& modes, bool fp8) {
  const auto& c = target.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const Tensor lm = target.lm_head();
  const Tensor flat = lm.view({V * H});
  const OpTimer op{timer};
  Tensor y = be.empty({rows, std::max<int64_t>(V, 2 * I)});
  // An FP8 copy of the LM head, sliced for every FP8 product timed below (--drafter-fp8).
  const Fp8Weight lm8 = fp8 ? be.quantize_fp8_rows(lm) : Fp8Weight{};
  for (const int64_t n : {int64_t{1}, rows}) {
    fmt::print("kernels, {} row{}:\n", n, n > 1 ? "s" : "");
    time_matmuls(be, target, op, n, modes, y, "token");
    time_fused_pairs(be, target, op, n, modes, y);
    if (fp8) {  // Backend::matmul_fp8 on slices of lm8
      const Tensor flat8 = lm8.q.view({V * H});
      std::string line;
      for (const auto& mt : decoder_mats(c)) {
        const int64_t elems = mt.m * mt.k, slices = std::max<int64_t>(1, V * H / elems - 1);
        const Tensor x = flat.rows(V * H - n * mt.k, n * mt.k).view({n, mt.k});
        const Tensor yv = y.view({-1}).rows(0, n * mt.m).view({n, mt.m});
        const double us = op.us([&](int i) {
          const Fp8Weight w =
              mt.per_layer == 0
                  ? lm8
                  : Fp8Weight{flat8.rows((i % slices) * elems, elems).view({mt.m, mt.k}),
                              lm8.scale.rows(0, mt.m)};
          be.matmul_fp8(yv, x, w);
        });
        line += fmt::format(" {} {:.1f} us ({:.0f} GB/s);", mt.name, us,
                            static_cast<double>(elems) / (us * 1e-6) / 1e9);
      }
      fmt::print("  matmul [FP8 weights]:{}\n", line);
    }
    time_small_ops(be, target, op, n, 1, ctx, y, "token");
  }
}

// --kernels --batch N: what one batched decode step of N sequences x 1 row over `ctx` cached
// tokens each runs, op by op (the matmuls at N rows in the backend's default mode, the attention
// as decoder_layer runs it), with the step's total and its cost per token.
void batch_kernel_breakdown(Backend& be, const CausalLM& target, Timer& timer, int64_t seqs,
                            int64_t ctx) {
  const auto& c = target.config();
  const OpTimer op{timer};
  const Tensor y = be.empty({seqs, std::max<int64_t>(c.vocab_size, 2 * c.intermediate_size)});
  fmt::print("kernels, batched decode step ({} sequences x 1 row, {} cached tokens each):\n", seqs,
             ctx);
  const double mm = time_matmuls(be, target, op, seqs, {{"", "auto"}}, y, "step");
  const double small = time_small_ops(be, target, op, seqs, seqs, ctx, y, "step");
  fmt::print(
      "  batched step from its ops: {:.3f} ms (matmuls {:.3f} + small ops {:.3f}) = {:.3f} ms per "
      "token of the step ({} tokens)\n",
      mm + small, mm, small, (mm + small) / static_cast<double>(seqs), seqs);
}

// Selects how the CUDA backend runs few-row matmuls ("auto", "mma", "simt", "cublaslt",
// "stream").
void set_mode(Backend& be, const std::string& mode) {
#ifdef BLOCKSPEC_HAS_CUDA
  if (be.device() != Device::kCuda) return;
  cuda::set_gemv_mode(be, mode == "cublaslt" ? cuda::GemvMode::kCublasLt
                          : mode == "simt"   ? cuda::GemvMode::kSimt
                          : mode == "mma"    ? cuda::GemvMode::kMma
                          : mode == "stream" ? cuda::GemvMode::kStream
                                             : cuda::GemvMode::kAuto);
#endif
}

std::string fmt_stats(const Stats& s) {
  return fmt::format("{:.3f} ms (p10 {:.3f}, p90 {:.3f}, n={})", s.median, s.p10, s.p90, s.n);
}

// "<what>: <stats> -> tok/s, GB/s of weights = % of copy bandwidth" for a step that streams the
// weights once and yields `tokens` tokens.
void print_decode(const std::string& what, const Stats& s, int64_t tokens, double weight_bytes,
                  double copy_gbs) {
  const double gbs = weight_bytes / (s.median * 1e-3) / 1e9;
  fmt::print("{}: {} -> {:.1f} tok/s, {:.0f} GB/s of weights = {:.1f}% of copy bandwidth\n", what,
             fmt_stats(s), static_cast<double>(tokens) * 1e3 / s.median, gbs,
             100.0 * gbs / copy_gbs);
}

int fail(const Status& st) {
  fmt::print(stderr, "blockspec: error: {}\n", st.message());
  return 1;
}

// The end-to-end runs' prompt length: --prompt-tokens, by default min(32, context) (the length of
// every figure before the flag existed).
int64_t e2e_prompt_tokens(const BenchArgs& a, int64_t ctx) {
  return a.prompt_tokens > 0 ? a.prompt_tokens : std::min<int64_t>(32, ctx);
}

// `p_len` tokens of a prompt: the first of `cached` (the timed steps' context), then more drawn
// from `tok` when it is longer.
std::vector<int32_t> e2e_prompt(std::span<const int32_t> cached, int64_t p_len, std::mt19937& rng,
                                std::uniform_int_distribution<int32_t>& tok) {
  std::vector<int32_t> p(cached.begin(),
                         cached.begin() + std::min<int64_t>(p_len, std::ssize(cached)));
  while (std::ssize(p) < p_len) p.push_back(tok(rng));
  return p;
}

// A generate run's rate with its prompts' prefill counted: what a server delivers for the same
// requests (a served request's duration includes its prefill), "; X tok/s end to end (prefill Y
// ms)".
std::string end_to_end(int64_t tokens, const GenerateStats& st) {
  const double seconds = st.prefill_seconds + st.decode_seconds;
  return fmt::format("; {:.1f} tok/s end to end (prefill {:.1f} ms)",
                     static_cast<double>(tokens) / seconds, 1e3 * st.prefill_seconds);
}

void print_e2e_shape(int64_t p_len, int64_t gen, int64_t seqs) {
  fmt::print(
      "generate runs: prompts of {} tokens (--prompt-tokens), {} new tokens, {} sequence{}\n",
      p_len, gen, seqs, seqs > 1 ? "s" : "");
}

// One request per sequence: `tokens[i]` at position `start` of sequence i, logits of every row.
std::vector<ForwardRequest> batch_requests(const std::vector<std::unique_ptr<SequenceKv>>& seqs,
                                           const std::vector<std::span<const int32_t>>& tokens,
                                           int64_t start, std::span<const int> taps) {
  std::vector<ForwardRequest> reqs;
  for (size_t i = 0; i < seqs.size(); ++i) {
    reqs.push_back({.tokens = tokens[i],
                    .start_pos = start,
                    .block_table = seqs[i]->block_table(),
                    .num_logits = static_cast<int64_t>(tokens[i].size()),
                    .tap_layers = taps});
  }
  return reqs;
}

// Batched speculative generation of `prompts` end to end (after an untimed warm-up run), compared
// with the batched plain outputs.
int bench_speculative_batch(CausalLM& target, Drafter& drafter,
                            const std::vector<std::vector<int32_t>>& prompts,
                            const GenerateOptions& opt,
                            const std::vector<std::vector<int32_t>>& plain) {
  std::vector<GenerateStats> stats;
  GenerateOptions warm = opt;
  warm.max_tokens = std::min<int64_t>(opt.max_tokens, 4 * drafter.block_size());
  if (auto w = generate_speculative_batch(target, drafter, prompts, warm, &stats); !w.ok()) {
    return fail(w.status());
  }
  auto out = generate_speculative_batch(target, drafter, prompts, opt, &stats);
  if (!out.ok()) return fail(out.status());
  int64_t total = 0, steps = 0, accepted = 0, drafted = 0;
  for (const auto& st : stats) {
    total += st.generated_tokens;
    steps += st.steps;
    accepted += st.accepted;
    drafted += st.drafted;
  }
  const double seconds = stats[0].decode_seconds;
  fmt::print(
      "generate (speculative, batch {}): {} tokens in {:.3f} s -> {:.1f} tok/s; mean acceptance "
      "length {:.2f} over {} sequence steps, drafts accepted {}/{}; host time {}; {}{}\n",
      prompts.size(), total, seconds, static_cast<double>(total) / seconds,
      steps ? static_cast<double>(accepted + steps) / static_cast<double>(steps) : 0.0, steps,
      accepted, drafted, phase_times(stats[0]),
      *out == plain ? "output == plain" : "OUTPUT DIFFERS from plain", end_to_end(total, stats[0]));
  return 0;
}

// --batch N > 1: N sequences with `context` cached tokens each decode one token per step in one
// batched forward (CausalLM::forward_batch); then batched plain generation end to end. With a
// drafter also the batched verify step (N blocks of B rows with taps over the same caches) and
// batched speculative generation (generate_speculative_batch) end to end.
int run_batch_bench(const BenchArgs& a, Backend& be, CausalLM& target, Drafter* drafter,
                    double copy_gbs, double wbytes) {
  const auto& cfg = target.config();
  const int64_t N = a.batch, max_pos = cfg.max_position_embeddings;
  // Rows past the context per sequence: a verify's anchor and drafts.
  const int64_t B = drafter ? drafter->max_drafts() + 1 : 1;
  const int64_t ctx =
      std::max<int64_t>(2, std::min<int64_t>(a.context, max_pos - std::max<int64_t>(4, B + 2)));
  const int64_t per_seq = (ctx + B + 1 + kKvBlockSize - 1) / kKvBlockSize + 1;
  KvPool pool = target.make_kv_pool(N * per_seq);
  BlockAllocator alloc(N * per_seq);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(
      0, static_cast<int32_t>(std::min<int64_t>(cfg.vocab_size, 30000) - 1));
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(N));
  std::vector<int32_t> last(static_cast<size_t>(N));
  auto timer = make_timer(be);
  timer->start();
  for (int64_t i = 0; i < N; ++i) {
    seqs.push_back(std::make_unique<SequenceKv>(alloc, kKvBlockSize));
    if (Status st = seqs[i]->reserve(ctx + B); !st.ok()) return fail(st);
    for (int64_t j = 0; j < ctx; ++j) prompts[i].push_back(tok(rng));
    ForwardResult res;
    if (Status st = target.forward({.tokens = prompts[i],
                                    .start_pos = 0,
                                    .block_table = seqs[i]->block_table(),
                                    .num_logits = 0,
                                    .tap_layers = {}},
                                   pool, &res);
        !st.ok()) {
      return fail(st);
    }
    seqs[i]->set_length(ctx);
    last[i] = prompts[i].back();
  }
  fmt::print("prefill: {} sequences x {} tokens in {:.2f} ms\n", N, ctx, timer->stop_ms());
  const Tensor ids = be.empty({N * B}, DType::kI32);
  std::vector<int32_t> host_ids(static_cast<size_t>(N * B));
  BatchForwardResult res;
  // One batched forward + argmax of every logit row + read back.
  auto step = [&](const std::vector<ForwardRequest>& reqs) -> Status {
    BS_RETURN_IF_ERROR(target.forward_batch(reqs, pool, &res));
    const Tensor out = ids.rows(0, res.logits.dim(0));
    be.argmax(out, res.logits);
    be.copy_to_host(host_ids.data(), out);
    return Status::Ok();
  };
  std::vector<std::span<const int32_t>> one_token;
  for (int64_t i = 0; i < N; ++i) one_token.emplace_back(&last[i], 1);
  const std::vector<ForwardRequest> decode_reqs = batch_requests(seqs, one_token, ctx, {});
  auto s = time_it(*timer, a.warmup, a.iters, [&] { return step(decode_reqs); });
  if (!s.ok()) return fail(s.status());
  print_decode(fmt::format("batch decode step ({} sequences x 1 token)", N), *s, N, wbytes,
               copy_gbs);
  if (a.kernels) batch_kernel_breakdown(be, target, *timer, N, ctx);
  if (drafter) {
    std::vector<int32_t> block(static_cast<size_t>(B));
    for (auto& t : block) t = tok(rng);
    const std::vector<std::span<const int32_t>> blocks(static_cast<size_t>(N), block);
    const std::vector<ForwardRequest> verify_reqs =
        batch_requests(seqs, blocks, ctx, drafter->target_layers());
    auto v = time_it(*timer, a.warmup, a.iters, [&] { return step(verify_reqs); });
    if (!v.ok()) return fail(v.status());
    fmt::print("batch verify step ({} sequences x {} rows, taps): {} = {:.2f}x batch decode\n", N,
               B, fmt_stats(*v), v->median / s->median);
  }

  // End to end: N prompts generated together.
  const int64_t p_len = e2e_prompt_tokens(a, ctx);
  GenerateOptions opt;
  opt.max_tokens = std::max<int64_t>(1, std::min<int64_t>(a.gen_tokens, max_pos - p_len - 2));
  if (drafter) opt.draft_confidence_min = a.draft_confidence_min;
  opt.verify_budget = a.verify_budget;
  opt.max_context = std::min<int64_t>(max_pos, p_len + opt.max_tokens + 16);
  for (auto& p : prompts) p = e2e_prompt(p, p_len, rng, tok);
  print_e2e_shape(p_len, opt.max_tokens, N);
  std::vector<GenerateStats> stats;
  GenerateOptions warm = opt;
  warm.max_tokens = std::min<int64_t>(opt.max_tokens, 8);
  if (auto w = generate_plain_batch(target, prompts, warm, &stats); !w.ok()) {
    return fail(w.status());
  }
  auto out = generate_plain_batch(target, prompts, opt, &stats);
  if (!out.ok()) return fail(out.status());
  int64_t total = 0;
  for (const auto& st : stats) total += st.generated_tokens;
  fmt::print(
      "generate (plain, batch {}): {} tokens in {:.3f} s -> {:.1f} tok/s; prompts of {} "
      "tokens{}\n",
      N, total, stats[0].decode_seconds, static_cast<double>(total) / stats[0].decode_seconds,
      stats[0].prompt_tokens, end_to_end(total, stats[0]));
  return drafter ? bench_speculative_batch(target, *drafter, prompts, opt, *out) : 0;
}

int run_bench(const BenchArgs& a) {
  if (a.batch < 1) return fail(InvalidArgument("--batch {}: must be at least 1", a.batch));
  auto backend_r = make_backend(a.device, a.threads);
  if (!backend_r.ok()) return fail(backend_r.status());
  Backend& be = **backend_r;
  const bool cuda = be.device() == Device::kCuda;
  std::string device_desc = be.name();
#ifdef BLOCKSPEC_HAS_CUDA
  if (cuda) device_desc = cuda::device_description(be);
#endif
  fmt::print("device: {}\n", device_desc);

  // Copy bandwidth (the floor's yardstick).
  const int64_t copy_mb = a.copy_mb > 0 ? a.copy_mb : (cuda ? 2048 : 256);
  double copy_gbs = 0;
#ifdef BLOCKSPEC_HAS_CUDA
  if (cuda) copy_gbs = cuda::copy_bandwidth_gbs(be, static_cast<size_t>(copy_mb) << 20, 20);
#endif
  if (!cuda) copy_gbs = host_copy_bandwidth_gbs(static_cast<size_t>(copy_mb) << 20);
  fmt::print("copy bandwidth: {:.0f} GB/s (read + write, {} MiB buffer, median)\n", copy_gbs,
             copy_mb);

  const auto t_load = std::chrono::steady_clock::now();
  auto target_r = load_target(a.model, be);
  if (!target_r.ok()) return fail(target_r.status());
  CausalLM& target = **target_r;
  const auto& cfg = target.config();
  std::unique_ptr<Drafter> drafter;
  if (!a.drafter.empty()) {
    auto d = load_drafter(a.drafter, target,
                          {.flashmap_steps = a.flashmap_steps,
                           .flashmap_noise_scale = a.flashmap_noise_scale,
                           .fp8_weights = a.drafter_fp8});
    if (!d.ok()) return fail(d.status());
    drafter = std::move(*d);
  }
  be.synchronize();
  fmt::print("load: {:.1f} s\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count());
  const double wbytes = decode_weight_bytes(target);
  fmt::print(
      "model: {} ({} layers, hidden {}, heads {}/{}, vocab {}); decode streams {:.3f} GB "
      "of weights per token\n",
      a.model, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size,
      wbytes / 1e9);

  if (a.prompt_tokens >= cfg.max_position_embeddings) {
    return fail(InvalidArgument(
        "--prompt-tokens {}: the model's context window ({} positions) leaves no room to generate",
        a.prompt_tokens, cfg.max_position_embeddings));
  }
  if (a.batch > 1) return run_batch_bench(a, be, target, drafter.get(), copy_gbs, wbytes);

  // Rows of a verify step: the anchor and every draft (the most a step commits).
  const int64_t B = drafter ? drafter->max_drafts() + 1 : 16;
  const int64_t max_pos = cfg.max_position_embeddings;
  const int64_t ctx = std::max<int64_t>(2, std::min<int64_t>(a.context, max_pos - 2 * B - 2));
  const int64_t blocks = (ctx + 2 * B) / kKvBlockSize + 4;
  KvPool tpool = target.make_kv_pool(blocks);
  KvPool dpool;
  if (drafter) dpool = drafter->make_kv_pool(blocks);
  BlockAllocator alloc(blocks);
  SequenceKv seq(alloc, kKvBlockSize);
  if (Status st = seq.reserve(ctx + 2 * B); !st.ok()) return fail(st);
  std::vector<int> taps;
  if (drafter) taps = drafter->target_layers();

  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(
      0, static_cast<int32_t>(std::min<int64_t>(cfg.vocab_size, 30000) - 1));
  std::vector<int32_t> prompt(ctx);
  for (auto& t : prompt) t = tok(rng);

  auto timer = make_timer(be);
  ForwardResult res;
  auto prefill_target = [&]() -> Status {
    return target.forward({.tokens = prompt,
                           .start_pos = 0,
                           .block_table = seq.block_table(),
                           .num_logits = 1,
                           .tap_layers = taps},
                          tpool, &res);
  };
  auto prefill_drafter = [&]() -> Status {
    return drafter ? drafter->observe(dpool, seq.block_table(), res.taps.rows(0, ctx - 1), 0)
                   : Status::Ok();
  };
  // The first prefill (cuBLASLt plans, workspaces, kernel attributes set up on first use).
  timer->start();
  if (Status st = prefill_target(); !st.ok()) return fail(st);
  if (Status st = prefill_drafter(); !st.ok()) return fail(st);
  fmt::print("prefill (first call): {} tokens in {:.2f} ms{}\n", ctx, timer->stop_ms(),
             drafter ? " (with the drafter's context update)" : "");
  // Warm prefill: the same prompt again over the same positions (the cache gets the same
  // contents), after one more untimed run (graph capture); medians of 3.
  {
    const int prefill_iters = 3;
    auto target_ms = time_it(*timer, 1, prefill_iters, prefill_target);
    if (!target_ms.ok()) return fail(target_ms.status());
    auto drafter_ms = time_it(*timer, 1, prefill_iters, prefill_drafter);
    if (!drafter_ms.ok()) return fail(drafter_ms.status());
    const double total = target_ms->median + (drafter ? drafter_ms->median : 0.0);
    fmt::print("prefill: {} tokens in {:.2f} ms = {:.0f} tok/s (target {:.2f} ms = {:.0f} tok/s",
               ctx, total, ctx / total * 1e3, target_ms->median, ctx / target_ms->median * 1e3);
    if (drafter) fmt::print(", drafter context update {:.2f} ms", drafter_ms->median);
    fmt::print("; median of {})\n", prefill_iters);
  }
  seq.set_length(ctx);

  Tensor ids = be.empty({B}, DType::kI32);
  std::vector<int32_t> host_ids(static_cast<size_t>(B));
  const std::vector<int32_t> one = {prompt.back()};
  std::vector<int32_t> block(static_cast<size_t>(B));
  for (auto& t : block) t = tok(rng);

  auto decode_step = [&]() -> Status {
    BS_RETURN_IF_ERROR(target.forward({.tokens = one,
                                       .start_pos = ctx,
                                       .block_table = seq.block_table(),
                                       .num_logits = 1,
                                       .tap_layers = {}},
                                      tpool, &res));
    be.argmax(ids.rows(0, 1), res.logits);
    be.copy_to_host(host_ids.data(), ids.rows(0, 1));
    return Status::Ok();
  };
  auto verify_step = [&]() -> Status {
    BS_RETURN_IF_ERROR(target.forward({.tokens = block,
                                       .start_pos = ctx,
                                       .block_table = seq.block_table(),
                                       .num_logits = B,
                                       .tap_layers = taps},
                                      tpool, &res));
    be.argmax(ids, res.logits);
    be.copy_to_host(host_ids.data(), ids);
    return Status::Ok();
  };

  std::vector<std::pair<std::string, std::string>> gemv_modes = {{"", "default"}};
#ifdef BLOCKSPEC_HAS_CUDA
  if (cuda && a.gemv == "all") {
    gemv_modes = {{"pinned cuBLASLt", "auto"},
                  {"skinny MMA", "mma"},
                  {"stream GEMM", "stream"},
                  {"SIMT GEMV", "simt"},
                  {"cuBLASLt heuristic", "cublaslt"}};
  }
  if (cuda && a.gemv == "cublaslt") gemv_modes = {{"cuBLASLt heuristic", "cublaslt"}};
  if (cuda && a.gemv == "simt") gemv_modes = {{"SIMT GEMV", "simt"}};
  if (cuda && a.gemv == "mma") gemv_modes = {{"skinny MMA", "mma"}};
  if (cuda && a.gemv == "auto") gemv_modes = {{"pinned cuBLASLt", "auto"}};
  // The stream GEMM drives verify, draft and end to end; decode and verify also for cuBLASLt.
  if (cuda && a.gemv == "stream") gemv_modes = {{"stream", "stream"}, {"pinned cuBLASLt", "auto"}};
#endif
  if (a.kernels) kernel_breakdown(be, target, *timer, B, ctx, gemv_modes, a.drafter_fp8);
  Stats decode{};
  for (const auto& [label, mode] : gemv_modes) {
    set_mode(be, mode);
    auto s = time_it(*timer, a.warmup, a.iters, decode_step);
    if (!s.ok()) return fail(s.status());
    print_decode(label.empty() ? "decode step" : "decode step (" + label + ")", *s, 1, wbytes,
                 copy_gbs);
    if (decode.n == 0) decode = *s;  // ratios below use the default mode (listed first)
  }
  const std::string main_mode = gemv_modes[0].second;  // verify, draft and end to end use it
  set_mode(be, main_mode);
  const double floor_ms = wbytes / (copy_gbs * 1e9) * 1e3;
  fmt::print("decode floor (weight bytes / copy bandwidth): {:.3f} ms\n", floor_ms);

  for (size_t i = 1; i < gemv_modes.size(); ++i) {  // the other modes, for comparison
    set_mode(be, gemv_modes[i].second);
    auto v = time_it(*timer, a.warmup, a.iters, verify_step);
    if (!v.ok()) return fail(v.status());
    fmt::print("verify step ({} rows, {}): {}\n", B, gemv_modes[i].first, fmt_stats(*v));
  }
  set_mode(be, main_mode);
  auto verify = time_it(*timer, a.warmup, a.iters, verify_step);
  if (!verify.ok()) return fail(verify.status());
  fmt::print("verify step ({} rows{}): {} = {:.2f}x decode\n", B, taps.empty() ? "" : ", taps",
             fmt_stats(*verify), verify->median / decode.median);

  if (drafter) {
    const Tensor step_taps = res.taps;  // the last verify's taps [B, n_taps * hidden]
    auto context_step = [&]() -> Status {
      return drafter->observe(dpool, seq.block_table(), step_taps, ctx - 1);
    };
    auto ctxs = time_it(*timer, a.warmup, a.iters, context_step);
    if (!ctxs.ok()) return fail(ctxs.status());
    fmt::print("context update ({} positions): {} = {:.1f}% of decode\n", B, fmt_stats(*ctxs),
               100.0 * ctxs->median / decode.median);
    // Restore the drafter's context at [ctx-1, ...) is irrelevant for timing.
    const int64_t nd = drafter->max_drafts();
    auto draft_step = [&]() -> Status {
      Tensor logits;
      ProposeRequest req{.anchor = prompt.back(),
                         .anchor_pos = ctx - 1,
                         .block_table = seq.block_table(),
                         .num_drafts = nd,
                         .noise_seed = 5};
      BS_RETURN_IF_ERROR(drafter->propose(dpool, req, &logits));
      be.argmax(ids.rows(0, logits.dim(0)), logits);  // the timer waits for it
      return Status::Ok();
    };
    auto draft = time_it(*timer, a.warmup, a.iters, draft_step);
    if (!draft.ok()) return fail(draft.status());
    fmt::print("draft step ({} drafts{}): {} = {:.1f}% of decode\n", nd,
               a.drafter_fp8 ? ", FP8 weights" : "", fmt_stats(*draft),
               100.0 * draft->median / decode.median);
    double drafting = draft->median;
    if (drafter->draws_drafts()) {
      // The engine's path for a drafter that draws its drafts (DSpark, DFlash2): propose_draw with
      // a greedy draw, the ids chosen on the device and no logits rows (the line above times
      // propose, which also writes every row's full-vocabulary logits).
      const Tensor drawn = be.empty({nd}, DType::kI32);
      std::vector<std::vector<float>> conf;
      bool with_conf = false;  // also the confidence head, its survivals read back
      auto drawn_step = [&]() -> Status {
        const ProposeRequest req{.anchor = prompt.back(),
                                 .anchor_pos = ctx - 1,
                                 .block_table = seq.block_table(),
                                 .num_drafts = nd,
                                 .noise_seed = 5};
        const DraftDraw greedy{.ids = drawn};
        return drafter->propose_draw(dpool, {&req, 1}, {&greedy, 1}, with_conf ? &conf : nullptr);
      };
      auto drawn_t = time_it(*timer, a.warmup, a.iters, drawn_step);
      if (!drawn_t.ok()) return fail(drawn_t.status());
      fmt::print("draft step, greedy draw ({} drafts, the engine's path): {} = {:.1f}% of decode\n",
                 nd, fmt_stats(*drawn_t), 100.0 * drawn_t->median / decode.median);
      drafting = drawn_t->median;
      if (drafter->has_confidence()) {
        // As the engine's step when a confidence cut or the verify budget reads the survivals.
        with_conf = true;
        auto conf_t = time_it(*timer, a.warmup, a.iters, drawn_step);
        if (!conf_t.ok()) return fail(conf_t.status());
        fmt::print("draft step, greedy draw + confidences read back: {} = {:.1f}% of decode\n",
                   fmt_stats(*conf_t), 100.0 * conf_t->median / decode.median);
      }
    }
    const double step = verify->median + drafting + ctxs->median;
    fmt::print(
        "speculative step estimate (verify + draft + context): {:.3f} ms -> at "
        "acceptance length {} {:.0f} tok/s, at 1 {:.0f} tok/s\n",
        step, B, 1e3 * static_cast<double>(B) / step, 1e3 / step);
  }

  // End to end (engine loops, host round trips included).
  const int64_t p_len = e2e_prompt_tokens(a, ctx);
  const int64_t gen =
      std::max<int64_t>(1, std::min<int64_t>(a.gen_tokens, max_pos - p_len - 2 * B - 2));
  const std::vector<int32_t> e2e = e2e_prompt(prompt, p_len, rng, tok);
  print_e2e_shape(p_len, gen, 1);
  GenerateOptions opt;
  opt.max_tokens = gen;
  opt.max_context = std::min<int64_t>(max_pos, p_len + gen + 2 * B + 16);
  if (drafter) opt.draft_confidence_min = a.draft_confidence_min;
  opt.verify_budget = a.verify_budget;
  GenerateStats st;
  auto plain = generate_plain(target, e2e, opt, nullptr, &st);
  if (!plain.ok()) return fail(plain.status());
  fmt::print("generate (plain): {} tokens in {:.3f} s -> {:.1f} tok/s; prompt of {} tokens{}\n",
             st.generated_tokens, st.decode_seconds,
             static_cast<double>(st.generated_tokens) / st.decode_seconds, st.prompt_tokens,
             end_to_end(st.generated_tokens, st));
  if (drafter) {
    // One untimed run first: plan creation and first-call allocations stay out of the numbers.
    GenerateOptions warm = opt;
    warm.max_tokens = std::min<int64_t>(opt.max_tokens, 4 * B);
    if (auto w = generate_speculative(target, *drafter, e2e, warm, nullptr, &st); !w.ok()) {
      return fail(w.status());
    }
    auto spec = generate_speculative(target, *drafter, e2e, opt, nullptr, &st);
    if (!spec.ok()) return fail(spec.status());
    const bool same = *spec == *plain;
    fmt::print(
        "generate (speculative): {} tokens in {:.3f} s -> {:.1f} tok/s; acceptance length "
        "{:.2f} over {} steps, drafts accepted {}/{}; host time {}; output {} plain{}\n",
        st.generated_tokens, st.decode_seconds,
        static_cast<double>(st.generated_tokens) / st.decode_seconds, st.acceptance_length(),
        st.steps, st.accepted, st.drafted, phase_times(st),
        same ? "==" : "!=", end_to_end(st.generated_tokens, st));
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& app) {
  g_cmd = app.add_subcommand("bench", "Time decode / verify / draft / context-update steps");
  g_cmd->add_option("--model", g_args.model, "Target model folder")->required();
  g_cmd->add_option("--drafter", g_args.drafter,
                    "Drafter folder (DFlash, DSpark, DFlash2 or FlashMap)");
  g_cmd
      ->add_option("--draft-confidence-min", g_args.draft_confidence_min,
                   "DSpark: verify only drafts whose predicted prefix survival is >= P (0 = off)")
      ->check(CLI::Range(0.0, 1.0));
  add_verify_budget_option(g_cmd, &g_args.verify_budget);
  g_cmd->add_option("--device", g_args.device, "cpu, cuda or auto");
  g_cmd->add_option(
      "--batch", g_args.batch,
      "Sequences decoded together (> 1: batched plain and, with --drafter, speculative decoding)");
  g_cmd->add_option("--iters", g_args.iters, "Timed iterations per measurement")
      ->check(at_least(1));
  g_cmd->add_option("--warmup", g_args.warmup, "Untimed iterations first")->check(at_least(0));
  g_cmd->add_option("--context", g_args.context, "Tokens in the KV cache while timing steps")
      ->check(at_least(1));
  g_cmd->add_option("--gen-tokens", g_args.gen_tokens, "Tokens for the end-to-end generation runs")
      ->check(at_least(1));
  g_cmd
      ->add_option("--prompt-tokens", g_args.prompt_tokens,
                   "Prompt length of the end-to-end generation runs (default: min(32, --context))")
      ->check(at_least(1));
  g_cmd->add_option("--copy-mb", g_args.copy_mb,
                    "Buffer for the copy-bandwidth measurement (default 2048 GPU, 256 CPU)");
  g_cmd->add_option("--threads", g_args.threads, "CPU threads (default: all cores)");
  g_cmd->add_option(
      "--gemv", g_args.gemv,
      "CUDA few-row matmuls to time: all, auto (pinned cuBLASLt), mma, stream (with auto "
      "beside it), simt or cublaslt");
  g_cmd->add_flag("--kernels", g_args.kernels, "Also time each op alone at the model's shapes");
  g_cmd->add_flag("--drafter-fp8", g_args.drafter_fp8,
                  "DFlash weights and its LM-head copy in FP8 (one scale per row)");
  g_cmd
      ->add_option("--flashmap-steps", g_args.flashmap_steps,
                   "FlashMap jumps per draft (default: config)")
      ->check(at_least(0));
  g_cmd
      ->add_option("--flashmap-noise-scale", g_args.flashmap_noise_scale,
                   "FlashMap noise scale (0: deterministic drafts)")
      ->check(at_least(0));
  register_synth(app);
  register_bench_serve(app);
}

int run_registered(CLI::App& app) {
  int rc = 1;
  if (run_synth_if_parsed(&rc)) return rc;
  if (run_bench_serve_if_parsed(&rc)) return rc;
  if (g_cmd && g_cmd->parsed()) return run_bench(g_args);
  return 1;
}

}  // namespace bs::cli
