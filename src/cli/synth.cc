// `blockspec synth`: synthetic checkpoints at real shapes for benchmarks (design.md,
// "Performance method"). Every weight is random, so every kernel runs at full cost, but the
// construction fixes what greedy decoding does:
//   * every embedding row holds a constant C > 0 in hidden dimension j;
//   * row j of every residual-writing projection (o_proj, down_proj) is zero, so the residual
//     keeps exactly C in dimension j through every layer (of the target and of the drafter);
//   * the final norm weight is e_j, so the normed output is (C / rms) e_j;
//   * LM-head column j is small noise except +1 at token kFavoured and -1 at token kShunned.
// The target therefore always predicts kFavoured. A DFlash drafter built the same way with final
// norm +e_j drafts kFavoured too (100% acceptance, tau = block size); with -e_j it drafts
// kShunned (0% acceptance, tau = 1). A FlashMap drafter forces its drafts through its head
// instead (construction above write_flashmap). The target folder also gets a byte-level
// tokenizer.json in which kFavoured and kShunned read "<|favoured|>" and "<|shunned|>", so that
// `blockspec generate` runs on it too. --dry-run writes nothing and prints what would be written
// (tensor and parameter counts, the drafter's config.json).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace bs::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kSpecialDim = 7;   // j
constexpr float kConstant = 4.0f;    // C
constexpr int32_t kFavoured = 1000;  // the target's (and the 100% drafter's) token
constexpr int32_t kShunned = 2000;   // the 0% drafter's token

// FlashMap drafter shape (docs/FLASHMAP.md, "Synthetic checkpoints", says where each number of
// the qwen3-8b preset comes from).
struct FlashMapShape {
  int64_t hidden, layers, heads, head_dim, inter, cond, freq, block_size;
};

struct Preset {
  std::string name;
  int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab, max_pos;
  double rope_theta;
  // DFlash drafter
  int64_t d_layers, block_size, mask_id;
  std::vector<int> taps;  // tapped target layers (FlashMap: eagle aux ids = taps + 1)
  FlashMapShape fm;
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {.name = "qwen3-8b",
       .hidden = 4096,
       .inter = 12288,
       .layers = 36,
       .heads = 32,
       .kv_heads = 8,
       .head_dim = 128,
       .vocab = 151936,
       .max_pos = 40960,
       .rope_theta = 1e6,
       .d_layers = 5,
       .block_size = 16,
       .mask_id = 151669,
       .taps = {1, 9, 17, 25, 33},
       .fm = {.hidden = 2048,
              .layers = 6,
              .heads = 16,
              .head_dim = 128,
              .inter = 8192,
              .cond = 256,
              .freq = 256,
              .block_size = 16}},
      {.name = "tiny",
       .hidden = 256,
       .inter = 512,
       .layers = 6,
       .heads = 4,
       .kv_heads = 2,
       .head_dim = 64,
       .vocab = 4096,
       .max_pos = 4096,
       .rope_theta = 1e6,
       .d_layers = 2,
       .block_size = 16,
       .mask_id = 4095,
       .taps = {1, 3},
       .fm = {.hidden = 128,
              .layers = 2,
              .heads = 4,
              .head_dim = 32,
              .inter = 512,
              .cond = 64,
              .freq = 32,
              .block_size = 16}},
  };
  return p;
}

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t hash_name(const std::string& s, uint64_t seed) {
  uint64_t h = mix64(seed);
  for (unsigned char c : s) h = mix64(h ^ c);
  return h;
}

// BF16 values uniform in [center - amp, center + amp], deterministic per (seed, chunk) and
// filled by all cores.
void fill_uniform(std::vector<uint16_t>& v, float center, float amp, uint64_t seed) {
  constexpr size_t kChunk = 1 << 20;
  const size_t chunks = (v.size() + kChunk - 1) / kChunk;
  const unsigned threads =
      std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t c = t; c < chunks; c += threads) {
        uint64_t s = mix64(seed ^ (c * 0x100000001B3ull)) | 1;
        const size_t end = std::min(v.size(), (c + 1) * kChunk);
        for (size_t i = c * kChunk; i < end; ++i) {
          s ^= s >> 12;
          s ^= s << 25;
          s ^= s >> 27;
          const uint64_t r = s * 0x2545F4914F6CDD1Dull;
          const float u = static_cast<float>(r >> 40) * 0x1p-24f;  // [0, 1)
          v[i] = f32_to_bf16(center + amp * (2.0f * u - 1.0f));
        }
      }
    });
  }
  for (auto& th : pool) th.join();
}

struct Tensors {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<uint16_t>> data;

  std::vector<uint16_t>& add(const std::string& name, std::vector<int64_t> shape) {
    names.push_back(name);
    data.emplace_back(static_cast<size_t>(numel(shape)));
    shapes.push_back(std::move(shape));
    return data.back();
  }
  uint64_t bytes() const {
    uint64_t b = 0;
    for (const auto& d : data) b += d.size() * 2;
    return b;
  }
  void clear() {
    names.clear();
    shapes.clear();
    data.clear();
  }
  static int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class Writer {
 public:
  // dry: count tensors and parameters only; nothing is allocated or written.
  Writer(std::string dir, uint64_t seed, bool dry) : dir_(std::move(dir)), seed_(seed), dry_(dry) {
    if (!dry_) fs::create_directories(dir_);
  }

  // A random [out, in] projection; zero_row_j for residual-writing ones.
  void linear(const std::string& name, int64_t out, int64_t in, bool zero_row_j) {
    auto* v = add(name, {out, in});
    if (!v) return;
    fill_uniform(*v, 0.0f, 0.5f * std::sqrt(3.0f / static_cast<float>(in)), hash_name(name, seed_));
    if (zero_row_j) {
      std::fill(v->begin() + kSpecialDim * in, v->begin() + (kSpecialDim + 1) * in, 0);
    }
  }
  // A random bias [n] of a projection with `in` inputs (the scale of its weight).
  void bias(const std::string& name, int64_t n, int64_t in) {
    auto* v = add(name, {n});
    if (!v) return;
    fill_uniform(*v, 0.0f, 0.5f * std::sqrt(3.0f / static_cast<float>(in)), hash_name(name, seed_));
  }
  void norm(const std::string& name, int64_t d) {
    auto* v = add(name, {d});
    if (v) fill_uniform(*v, 1.0f, 0.1f, hash_name(name, seed_));
  }
  // `value` everywhere.
  void constant(const std::string& name, std::vector<int64_t> shape, float value) {
    auto* v = add(name, std::move(shape));
    if (v) std::fill(v->begin(), v->end(), f32_to_bf16(value));
  }
  // Uniform values center +- amp.
  void uniform(const std::string& name, std::vector<int64_t> shape, float center, float amp) {
    auto* v = add(name, std::move(shape));
    if (v) fill_uniform(*v, center, amp, hash_name(name, seed_));
  }
  // e_j scaled by sign.
  void unit_norm(const std::string& name, int64_t d, float sign) {
    auto* v = add(name, {d});
    if (!v) return;
    std::fill(v->begin(), v->end(), 0);
    (*v)[kSpecialDim] = f32_to_bf16(sign);
  }
  void embedding(const std::string& name, int64_t vocab, int64_t h) {
    auto* v = add(name, {vocab, h});
    if (!v) return;
    fill_uniform(*v, 0.0f, 1.0f, hash_name(name, seed_));
    for (int64_t r = 0; r < vocab; ++r) (*v)[r * h + kSpecialDim] = f32_to_bf16(kConstant);
  }
  void lm_head(const std::string& name, int64_t vocab, int64_t h) {
    auto* v = add(name, {vocab, h});
    if (!v) return;
    fill_uniform(*v, 0.0f, 0.5f * std::sqrt(3.0f / static_cast<float>(h)), hash_name(name, seed_));
    for (int64_t r = 0; r < vocab; ++r) {
      const float noise = 0.01f * (static_cast<float>(mix64(r ^ seed_) >> 40) * 0x1p-23f - 1.0f);
      (*v)[r * h + kSpecialDim] = f32_to_bf16(noise);
    }
    (*v)[kFavoured * h + kSpecialDim] = f32_to_bf16(1.0f);
    (*v)[kShunned * h + kSpecialDim] = f32_to_bf16(-1.0f);
  }
  // An I64 tensor [values.size()] (a draft vocabulary's d2t), written with the next shard.
  void int64s(const std::string& name, std::vector<int64_t> values) {
    ++tensors_;
    if (!dry_) ints_.emplace_back(name, std::move(values));
  }
  // The last tensor added (not in a dry run), to adjust single entries.
  std::vector<uint16_t>* last() { return dry_ || cur_.data.empty() ? nullptr : &cur_.data.back(); }

  // Writes the tensors gathered so far as the next shard once they pass `min_bytes`.
  Status flush(uint64_t min_bytes = 0) {
    if (dry_ || (cur_.names.empty() && ints_.empty()) || cur_.bytes() < min_bytes) {
      return Status::Ok();
    }
    const std::string file = fmt::format("model-{:05d}.safetensors", shards_.size() + 1);
    std::vector<io::TensorToWrite> tw;
    for (size_t i = 0; i < cur_.names.size(); ++i) {
      tw.push_back({cur_.names[i], DType::kBF16, cur_.shapes[i], cur_.data[i].data()});
      map_[cur_.names[i]] = file;
    }
    for (const auto& [name, values] : ints_) {
      tw.push_back({name, DType::kI64, {static_cast<int64_t>(values.size())}, values.data()});
      map_[name] = file;
      total_ += values.size() * sizeof(int64_t);
    }
    total_ += cur_.bytes();
    BS_RETURN_IF_ERROR(io::write_safetensors((fs::path(dir_) / file).string(), tw));
    fmt::print(stderr, "synth: wrote {} ({:.2f} GB)\n", (fs::path(dir_) / file).string(),
               static_cast<double>(cur_.bytes()) / 1e9);
    shards_.push_back(file);
    cur_.clear();
    ints_.clear();
    return Status::Ok();
  }
  // Writes the last shard and model.safetensors.index.json.
  Status finish() {
    BS_RETURN_IF_ERROR(flush());
    if (dry_) return Status::Ok();
    json index = {{"metadata", {{"total_size", total_}}}, {"weight_map", map_}};
    std::ofstream(fs::path(dir_) / "model.safetensors.index.json") << index.dump(2) << "\n";
    return Status::Ok();
  }
  // "N tensors, P parameters (B GB in BF16)".
  std::string summary() const {
    return fmt::format("{} tensors, {} parameters ({:.2f} GB in BF16)", tensors_, params_,
                       static_cast<double>(params_) * 2 / 1e9);
  }
  bool dry() const { return dry_; }
  const std::string& dir() const { return dir_; }

 private:
  // Records a tensor; its storage, or nullptr in a dry run.
  std::vector<uint16_t>* add(const std::string& name, std::vector<int64_t> shape) {
    ++tensors_;
    params_ += Tensors::numel(shape);
    if (dry_) return nullptr;
    return &cur_.add(name, std::move(shape));
  }

  std::string dir_;
  uint64_t seed_;
  bool dry_;
  Tensors cur_;
  std::vector<std::pair<std::string, std::vector<int64_t>>> ints_;  // I64 tensors of the shard
  std::vector<std::string> shards_;
  std::map<std::string, std::string> map_;
  uint64_t total_ = 0;
  int64_t tensors_ = 0, params_ = 0;
};

void write_json(const fs::path& path, const json& j) { std::ofstream(path) << j.dump(2) << "\n"; }

// One Qwen3 decoder layer's tensors under `pre` (target and DFlash drafter share the layout);
// the residual-writing projections keep row j zero so the forced dimension survives.
void write_decoder_layer(Writer& w, const Preset& p, const std::string& pre) {
  const int64_t h = p.hidden, q = p.heads * p.head_dim, kv = p.kv_heads * p.head_dim;
  w.norm(pre + "input_layernorm.weight", h);
  w.norm(pre + "post_attention_layernorm.weight", h);
  w.linear(pre + "self_attn.q_proj.weight", q, h, false);
  w.linear(pre + "self_attn.k_proj.weight", kv, h, false);
  w.linear(pre + "self_attn.v_proj.weight", kv, h, false);
  w.linear(pre + "self_attn.o_proj.weight", h, q, true);
  w.norm(pre + "self_attn.q_norm.weight", p.head_dim);
  w.norm(pre + "self_attn.k_norm.weight", p.head_dim);
  w.linear(pre + "mlp.gate_proj.weight", p.inter, h, false);
  w.linear(pre + "mlp.up_proj.weight", p.inter, h, false);
  w.linear(pre + "mlp.down_proj.weight", h, p.inter, true);
}

json target_config(const Preset& p, uint64_t seed) {
  return {{"architectures", {"Qwen3ForCausalLM"}},
          {"model_type", "qwen3"},
          {"hidden_size", p.hidden},
          {"intermediate_size", p.inter},
          {"num_hidden_layers", p.layers},
          {"num_attention_heads", p.heads},
          {"num_key_value_heads", p.kv_heads},
          {"head_dim", p.head_dim},
          {"vocab_size", p.vocab},
          {"max_position_embeddings", p.max_pos},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", p.rope_theta},
          {"rope_scaling", nullptr},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"tie_word_embeddings", false},
          {"use_sliding_window", false},
          {"torch_dtype", "bfloat16"},
          {"bos_token_id", nullptr},
          {"eos_token_id", p.vocab - 2},
          {"blockspec_synth", {{"preset", p.name}, {"seed", seed}, {"favoured_token", kFavoured}}}};
}

// A byte-level BPE tokenizer.json (GPT-2 byte alphabet at ids 0..255, no merges) with the
// favoured, shunned and end-of-text tokens added at their ids, so that `blockspec generate` can
// encode a prompt and print the forced output.
json synth_tokenizer(const Preset& p) {
  // GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100.. in order.
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  json vocab = json::object();
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    vocab[utf8(printable ? b : next++)] = b;
  }
  auto added = [](int64_t id, const std::string& content, bool special) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {added(kFavoured, "<|favoured|>", false), added(kShunned, "<|shunned|>", false),
            added(p.vocab - 2, "<|endoftext|>", true)}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", false},
            {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", false},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", json::array()}}}};
}

Status write_target(Writer& w, const Preset& p, uint64_t seed) {
  const int64_t h = p.hidden;
  w.embedding("model.embed_tokens.weight", p.vocab, h);
  w.unit_norm("model.norm.weight", h, 1.0f);
  w.lm_head("lm_head.weight", p.vocab, h);
  BS_RETURN_IF_ERROR(w.flush());
  for (int64_t i = 0; i < p.layers; ++i) {
    const std::string pre = fmt::format("model.layers.{}.", i);
    write_decoder_layer(w, p, pre);
    BS_RETURN_IF_ERROR(w.flush(2'000'000'000ull));
  }
  BS_RETURN_IF_ERROR(w.finish());
  if (!w.dry()) {
    write_json(fs::path(w.dir()) / "config.json", target_config(p, seed));
    write_json(fs::path(w.dir()) / "tokenizer.json", synth_tokenizer(p));
  }
  return Status::Ok();
}

// --draft-vocab N: N target ids in EAGLE-3 form (sorted; d2t[j] = id_j - j). Both forced tokens
// are in it, so the drafter keeps its forced acceptance; the others are spread evenly over the
// vocabulary.
std::vector<int64_t> synth_draft_vocab(int64_t n, int64_t vocab) {
  std::vector<char> taken(static_cast<size_t>(vocab), 0);
  std::vector<int64_t> ids;
  auto take = [&](int64_t id) {
    if (static_cast<int64_t>(ids.size()) < n && !taken[id]) {
      taken[id] = 1;
      ids.push_back(id);
    }
  };
  take(kFavoured);
  take(kShunned);
  for (int64_t i = 0; i < n; ++i) take(i * vocab / n);
  for (int64_t id = 0; id < vocab; ++id) take(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// draft_vocab > 0: a restricted draft vocabulary of that many tokens (draft_vocab_size).
json dflash_config(const Preset& p, uint64_t seed, int acceptance, int64_t draft_vocab = 0) {
  json c = {{"architectures", {"DFlashDraftModel"}},
            {"model_type", "qwen3"},
            {"hidden_size", p.hidden},
            {"intermediate_size", p.inter},
            {"num_hidden_layers", p.d_layers},
            {"num_attention_heads", p.heads},
            {"num_key_value_heads", p.kv_heads},
            {"head_dim", p.head_dim},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", p.rope_theta},
            {"rope_scaling", nullptr},
            {"max_position_embeddings", p.max_pos},
            {"vocab_size", p.vocab},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"},
            {"num_target_layers", p.layers},
            {"block_size", p.block_size},
            {"dflash_config", {{"mask_token_id", p.mask_id}, {"target_layer_ids", p.taps}}},
            {"layer_types", std::vector<std::string>(p.d_layers, "full_attention")},
            {"use_sliding_window", false},
            {"sliding_window", nullptr},
            {"max_window_layers", p.d_layers},
            {"blockspec_synth",
             {{"preset", p.name}, {"seed", seed}, {"acceptance_percent", acceptance}}}};
  if (draft_vocab > 0) {
    c["draft_vocab_size"] = draft_vocab;
    c["blockspec_synth"]["draft_vocab"] = draft_vocab;
  }
  return c;
}

Status write_dflash(Writer& w, const Preset& p, int acceptance, int64_t draft_vocab) {
  const int64_t h = p.hidden;
  w.linear("fc.weight", h, h * static_cast<int64_t>(p.taps.size()), false);
  w.norm("hidden_norm.weight", h);
  w.unit_norm("norm.weight", h, acceptance == 0 ? -1.0f : 1.0f);
  for (int64_t i = 0; i < p.d_layers; ++i) {
    const std::string pre = fmt::format("layers.{}.", i);
    write_decoder_layer(w, p, pre);
  }
  if (draft_vocab > 0) {
    std::vector<int64_t> d2t = synth_draft_vocab(draft_vocab, p.vocab);
    for (size_t j = 0; j < d2t.size(); ++j) d2t[j] -= static_cast<int64_t>(j);
    w.int64s("d2t", std::move(d2t));
  }
  return w.finish();
}

// DSpark (dspark-b7) and DFlash2 (dflash2-b16) drafters: the DFlash construction plus their
// modules at the published shapes (Markov rank 256 and a confidence head; 2-tap convolutions in
// groups of 16 and a rank-256 top-16 selector). Their extra logit terms are small (codebooks and
// Markov factors of amplitude 0.02), far below the +-1 margin of the forced token, and DFlash2's
// convolutions keep dimension j: the finishing convolution sees a sublayer output whose column j
// is zero (o_proj / down_proj row j), so the residual's j stays C.
constexpr int64_t kMarkovRank = 256, kSelectorRank = 256, kConvGroup = 16;

json relative_config(const Preset& p, uint64_t seed, int acceptance, bool dspark) {
  json c = dflash_config(p, seed, acceptance);
  c.erase("block_size");
  json& d = c["dflash_config"];
  if (dspark) {
    c["architectures"] = {"DSparkDraftModel"};
    c["block_size"] = 7;
    d["projector_type"] = "dspark";
    d["markov_rank"] = kMarkovRank;
    d["markov_head_type"] = "vanilla";
    d["enable_confidence_head"] = true;
    d["confidence_head_with_markov"] = true;
  } else {
    c["architectures"] = {"DFlash2DraftModel"};
    c["is_causal"] = false;
    d["block_size"] = 16;
    d["conv_kernel_size"] = 2;
    d["conv_group_size"] = kConvGroup;
    d["selector_rank"] = kSelectorRank;
    d["selector_top_k"] = 16;
  }
  return c;
}

Status write_relative(Writer& w, const Preset& p, int acceptance, bool dspark) {
  const int64_t h = p.hidden, v = p.vocab;
  w.linear("fc.weight", h, h * static_cast<int64_t>(p.taps.size()), false);
  w.norm("hidden_norm.weight", h);
  w.unit_norm("norm.weight", h, acceptance == 0 ? -1.0f : 1.0f);
  for (int64_t i = 0; i < p.d_layers; ++i) {
    const std::string pre = fmt::format("layers.{}.", i);
    write_decoder_layer(w, p, pre);
    if (!dspark) {
      for (const char* sub : {"attention_conv", "mlp_conv"}) {
        w.uniform(pre + sub + ".base_kernel", {2, 2, h}, 0.5f, 0.5f);
        w.linear(pre + sub + ".kernel_projection.weight", 2 * 2 * (h / kConvGroup), h, false);
      }
    }
    BS_RETURN_IF_ERROR(w.flush(1ull << 30));
  }
  if (dspark) {
    w.uniform("markov_head.markov_w1.weight", {v, kMarkovRank}, 0.0f, 0.02f);
    w.uniform("markov_head.markov_w2.weight", {v, kMarkovRank}, 0.0f, 0.02f);
    w.uniform("confidence_head.proj.weight", {1, h + kMarkovRank}, 0.0f, 0.02f);
    w.constant("confidence_head.proj.bias", {1}, 2.0f);
  } else {
    w.uniform("candidate_selector.predecessor_codebook", {v, kSelectorRank}, 0.0f, 0.02f);
    w.uniform("candidate_selector.successor_codebook", {v, kSelectorRank}, 0.0f, 0.02f);
    w.linear("candidate_selector.hidden_projection.weight", kSelectorRank, h, false);
  }
  return w.finish();
}

// ------------------------------------------------------------------------------------------------
// FlashMap drafter (flashmap-b16; tensors and config fields of docs/FLASHMAP.md).
//
// Its data flow: noise -> the embedded state (one jump: first_hidden + g rms(z) noise_embed z;
// several jumps: the vocabulary-sized state through E, state_norm / noise_norm and x_embed, with
// softmax(folded head) mixed back in between jumps) -> L DiT layers, each adding
// gate * f(LN(h) (1 + scale) + shift) for self-attention, cross-attention to the context and the
// GELU MLP -> out = LN(h) (1 + scale_f) + shift_f -> logits = lm_head (W_head out + b_head),
// drafts = argmax. DFlash's trick (a constant residual dimension read out by a norm weight e_j)
// does not carry over: the DiT's final norm is a LayerNorm without a weight (nothing to set to
// e_j), and the noise and the AdaLN shifts reach every dimension. The head forces the drafts:
//   * row j of head.weight is zero and head.bias[j] = +beta (100%) or -beta (0%),
//     beta = 4 sqrt(D), so dimension j of the head's output is exactly +-beta whatever the DiT
//     computed; folded into the target's LM head, logit_v = +-beta lm_head[v, j] + W_f[v] out
//     + (small bias terms), with W_f = lm_head W_head over the other Ht - 1 dimensions;
//   * lm_head[v, j] is +1 at kFavoured, -1 at kShunned and within +-0.01 elsewhere (the target's
//     construction), so the forced part puts kFavoured (+beta) or kShunned (-beta) at least
//     0.99 beta above every other token;
//   * the rest is bounded for every input: LN(h) has norm sqrt(D) whatever h is, hence whatever
//     the noise, its scale, the jump or the context, so |W_f[v] out| <= |W_f[v]| |out| with
//     |W_f[v]| ~ 0.25 for these random scales and |out| <~ 1.5 sqrt(D): below 0.4 sqrt(D) per
//     logit even for the worst direction of out, so below 0.8 sqrt(D) between two logits,
//     against a forced lead of 3.96 sqrt(D) (measured at the tiny preset: the forced logit
//     44.8..45.4, every other <= 1.7, noise scales 0 to 100, 1 or 2 jumps).
// So every draft is kFavoured, the target's greedy token (100%), or kShunned (0%: the first draft
// of every block is rejected), for any noise and any number of jumps: between jumps
// softmax(folded head) is (nearly) one-hot at the forced token, which changes only the next
// jump's input, never the bound. Everything else (fc, anchor, noise fold, time embeddings,
// AdaLN modulations, both attentions, the MLP, the folded head's GEMM) is random at the usual
// scales, so every kernel runs at full cost.
// ------------------------------------------------------------------------------------------------

json flashmap_config(const Preset& p, uint64_t seed, int acceptance) {
  const FlashMapShape& f = p.fm;
  std::vector<int> aux;  // vLLM "input of layer id" = output of the tapped layer
  for (int t : p.taps) aux.push_back(t + 1);
  const json grids = json::array({json::array({0.0, 1.0}), json::array({0.0, 0.5, 1.0}),
                                  json::array({0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0}),
                                  json::array({0.0, 0.25, 0.5, 0.75, 1.0})});
  return {{"architectures", {"FlashMapDraftModel"}},
          {"model_type", "flashmap"},
          {"hidden_size", f.hidden},
          {"target_hidden_size", p.hidden},
          {"num_hidden_layers", f.layers},
          {"num_attention_heads", f.heads},
          {"head_dim", f.head_dim},
          {"intermediate_size", f.inter},
          {"timestep_embed_dim", f.cond},
          {"timestep_frequency_dim", f.freq},
          {"time_scale", 1000.0},
          {"time_grids", grids},
          {"num_steps", 1},
          {"noise_gate", "jump"},
          {"adaln_eps", 1e-6},
          {"qk_norm_eps", 1e-6},
          {"rms_norm_eps", 1e-6},
          {"block_size", f.block_size},
          {"eagle_aux_hidden_state_layer_ids", aux},
          {"vocab_size", p.vocab},
          {"rope_theta", p.rope_theta},
          {"torch_dtype", "bfloat16"},
          {"blockspec_synth",
           {{"preset", p.name}, {"seed", seed}, {"acceptance_percent", acceptance}}}};
}

Status write_flashmap(Writer& w, const Preset& p, int acceptance) {
  const FlashMapShape& f = p.fm;
  const int64_t D = f.hidden, Ht = p.hidden, A = f.heads * f.head_dim, C = f.cond;
  const int64_t n_aux = static_cast<int64_t>(p.taps.size());
  w.linear("fc.weight", D, n_aux * Ht, false);
  w.norm("hidden_norm.weight", D);
  w.linear("anchor_proj.weight", D, Ht, false);
  w.bias("anchor_proj.bias", D, Ht);
  w.norm("anchor_norm.weight", D);
  w.norm("state_norm.weight", Ht);
  w.norm("noise_norm.weight", Ht);
  w.constant("noise_gate", {1}, 1.0f);
  w.linear("x_embed.weight", D, Ht, false);
  w.bias("x_embed.bias", D, Ht);
  for (const char* e : {"time_embed", "jump_embed"}) {
    const std::string pre = std::string(e) + ".";
    w.linear(pre + "linear_1.weight", C, f.freq, false);
    w.bias(pre + "linear_1.bias", C, f.freq);
    w.linear(pre + "linear_2.weight", C, C, false);
    w.bias(pre + "linear_2.bias", C, C);
  }
  for (int64_t i = 0; i < f.layers; ++i) {
    const std::string pre = fmt::format("layers.{}.", i);
    for (const char* sub : {"self_attn_adaln", "cross_attn_adaln", "mlp_adaln"}) {
      w.linear(pre + sub + ".linear.weight", 3 * D, C, false);
      w.bias(pre + sub + ".linear.bias", 3 * D, C);
    }
    for (const char* attn : {"self_attn", "cross_attn"}) {
      const std::string a = pre + attn + ".";
      for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
        w.linear(a + proj + ".weight", A, D, false);
      }
      w.linear(a + "o_proj.weight", D, A, false);
      w.norm(a + "q_norm.weight", f.head_dim);
      w.norm(a + "k_norm.weight", f.head_dim);
    }
    w.linear(pre + "mlp.fc1.weight", f.inter, D, false);
    w.bias(pre + "mlp.fc1.bias", f.inter, D);
    w.linear(pre + "mlp.fc2.weight", D, f.inter, false);
    w.bias(pre + "mlp.fc2.bias", D, f.inter);
  }
  w.linear("final_adaln.linear.weight", 3 * D, C, false);
  w.bias("final_adaln.linear.bias", 3 * D, C);
  // The forced head (construction above): row j of the weight zero, bias j = +-beta.
  w.linear("head.weight", Ht, D, /*zero_row_j=*/true);
  w.bias("head.bias", Ht, D);
  if (auto* b = w.last()) {
    const float beta = 4.0f * std::sqrt(static_cast<float>(D));
    (*b)[kSpecialDim] = f32_to_bf16(acceptance == 0 ? -beta : beta);
  }
  return w.finish();
}

struct SynthArgs {
  std::string preset;
  std::string out;
  std::string drafter;
  std::string drafter_out;
  int acceptance = 100;
  int64_t draft_vocab = 0;  // DFlash: a restricted draft vocabulary of this many tokens (d2t)
  uint64_t seed = 1;
  bool force = false;
  bool dry_run = false;
};

SynthArgs g_args;
CLI::App* g_cmd = nullptr;

// Whether dir already holds this preset's target (same preset and seed): then it is reused.
bool target_exists(const std::string& dir, const Preset& p, uint64_t seed) {
  std::ifstream f(fs::path(dir) / "config.json");
  if (!f) return false;
  try {
    const json j = json::parse(f);
    return j.at("blockspec_synth").at("preset") == p.name &&
           j.at("blockspec_synth").at("seed") == seed &&
           fs::exists(fs::path(dir) / "model.safetensors.index.json") &&
           fs::exists(fs::path(dir) / "tokenizer.json");
  } catch (const std::exception&) {
    return false;
  }
}

int run_synth(const SynthArgs& a) {
  const Preset* p = nullptr;
  for (const auto& q : presets()) {
    if (q.name == a.preset) p = &q;
  }
  if (!p) {
    fmt::print(stderr, "blockspec: error: unknown preset '{}' (qwen3-8b, tiny)\n", a.preset);
    return 1;
  }
  const bool dflash = a.drafter == "dflash-b16", flashmap = a.drafter == "flashmap-b16",
             dspark = a.drafter == "dspark-b7", dflash2 = a.drafter == "dflash2-b16";
  if (!a.drafter.empty() && !dflash && !flashmap && !dspark && !dflash2) {
    fmt::print(stderr,
               "blockspec: error: unknown drafter '{}' (dflash-b16, dspark-b7, dflash2-b16, "
               "flashmap-b16)\n",
               a.drafter);
    return 1;
  }
  if (a.acceptance != 0 && a.acceptance != 100) {
    fmt::print(stderr, "blockspec: error: --acceptance must be 100 or 0\n");
    return 1;
  }
  if (a.draft_vocab != 0) {
    if (!dflash) {
      fmt::print(stderr,
                 "blockspec: error: --draft-vocab needs --drafter dflash-b16 (DSpark and DFlash2 "
                 "draw over the full vocabulary)\n");
      return 1;
    }
    if (a.draft_vocab < 2 || a.draft_vocab >= p->vocab) {
      fmt::print(stderr,
                 "blockspec: error: --draft-vocab {} must be in [2, {}) (the preset's vocabulary; "
                 "it holds both forced tokens)\n",
                 a.draft_vocab, p->vocab);
      return 1;
    }
  }
  const char* dry_note = a.dry_run ? " [dry run: nothing written]" : "";
  if (!a.dry_run && !a.force && target_exists(a.out, *p, a.seed)) {
    fmt::print(stderr, "synth: reusing target {}\n", a.out);
    fmt::print("target: {} (preset {}, favoured token {})\n", a.out, p->name, kFavoured);
  } else {
    Writer w(a.out, a.seed, a.dry_run);
    if (const Status st = write_target(w, *p, a.seed); !st.ok()) {
      fmt::print(stderr, "blockspec: error: {}\n", st.message());
      return 1;
    }
    fmt::print("target: {} (preset {}, favoured token {}): {}{}\n", a.out, p->name, kFavoured,
               w.summary(), dry_note);
  }
  if (!a.drafter.empty()) {
    const std::string dir = a.drafter_out.empty()
                                ? fmt::format("{}-{}-acc{}", a.out, a.drafter, a.acceptance)
                                : a.drafter_out;
    Writer w(dir, a.seed ^ (flashmap ? 0xF1A5A4A9ull : 0xD1F1A5Full), a.dry_run);
    const Status st = dflash     ? write_dflash(w, *p, a.acceptance, a.draft_vocab)
                      : flashmap ? write_flashmap(w, *p, a.acceptance)
                                 : write_relative(w, *p, a.acceptance, dspark);
    if (!st.ok()) {
      fmt::print(stderr, "blockspec: error: {}\n", st.message());
      return 1;
    }
    const json cfg = dflash     ? dflash_config(*p, a.seed, a.acceptance, a.draft_vocab)
                     : flashmap ? flashmap_config(*p, a.seed, a.acceptance)
                                : relative_config(*p, a.seed, a.acceptance, dspark);
    if (!a.dry_run) write_json(fs::path(dir) / "config.json", cfg);
    fmt::print("drafter: {} ({}, forced acceptance {}%): {}{}\n", dir, a.drafter, a.acceptance,
               w.summary(), dry_note);
    if (a.dry_run) fmt::print("drafter config: {}\n", cfg.dump());
  }
  return 0;
}

}  // namespace

void register_synth(CLI::App& app) {
  g_cmd = app.add_subcommand(
      "synth", "Write synthetic checkpoints at real shapes with forced greedy acceptance");
  g_cmd->add_option("--preset", g_args.preset, "qwen3-8b or tiny")->required();
  g_cmd->add_option("--out", g_args.out, "Target checkpoint folder")->required();
  g_cmd->add_option("--drafter", g_args.drafter,
                    "Also write a drafter: dflash-b16, dspark-b7, dflash2-b16 or flashmap-b16");
  g_cmd->add_option("--drafter-out", g_args.drafter_out,
                    "Drafter folder (default: OUT-DRAFTER-accN)");
  g_cmd->add_option("--acceptance", g_args.acceptance,
                    "Forced acceptance of the drafter: 100 or 0");
  g_cmd->add_option("--draft-vocab", g_args.draft_vocab,
                    "dflash-b16: a restricted draft vocabulary of N tokens (d2t, "
                    "draft_vocab_size N; keeps the forced acceptance)");
  g_cmd->add_option("--seed", g_args.seed, "Random seed of the weights");
  g_cmd->add_flag("--force", g_args.force, "Rewrite the target even if OUT already holds it");
  g_cmd->add_flag("--dry-run", g_args.dry_run,
                  "Write nothing; print tensor and parameter counts and the drafter's config");
}

bool run_synth_if_parsed(int* rc) {
  if (!g_cmd || !g_cmd->parsed()) return false;
  *rc = run_synth(g_args);
  return true;
}

}  // namespace bs::cli
