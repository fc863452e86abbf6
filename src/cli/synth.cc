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
// kShunned (0% acceptance, tau = 1).
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

struct Preset {
  std::string name;
  int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab, max_pos;
  double rope_theta;
  // DFlash drafter
  int64_t d_layers, block_size, mask_id;
  std::vector<int> taps;
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"qwen3-8b",
       4096,
       12288,
       36,
       32,
       8,
       128,
       151936,
       40960,
       1e6,
       5,
       16,
       151669,
       {1, 9, 17, 25, 33}},
      {"tiny", 256, 512, 6, 4, 2, 64, 4096, 4096, 1e6, 2, 16, 4095, {1, 3}},
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
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    names.push_back(name);
    shapes.push_back(std::move(shape));
    data.emplace_back(static_cast<size_t>(n));
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
};

class Writer {
 public:
  Writer(std::string dir, uint64_t seed) : dir_(std::move(dir)), seed_(seed) {}

  // A random [out, in] projection; zero_row_j for residual-writing ones.
  void linear(const std::string& name, int64_t out, int64_t in, bool zero_row_j) {
    auto& v = cur_.add(name, {out, in});
    fill_uniform(v, 0.0f, 0.5f * std::sqrt(3.0f / static_cast<float>(in)), hash_name(name, seed_));
    if (zero_row_j) std::fill(v.begin() + kSpecialDim * in, v.begin() + (kSpecialDim + 1) * in, 0);
  }
  void norm(const std::string& name, int64_t d) {
    fill_uniform(cur_.add(name, {d}), 1.0f, 0.1f, hash_name(name, seed_));
  }
  // e_j scaled by sign.
  void unit_norm(const std::string& name, int64_t d, float sign) {
    auto& v = cur_.add(name, {d});
    std::fill(v.begin(), v.end(), 0);
    v[kSpecialDim] = f32_to_bf16(sign);
  }
  void embedding(const std::string& name, int64_t vocab, int64_t h) {
    auto& v = cur_.add(name, {vocab, h});
    fill_uniform(v, 0.0f, 1.0f, hash_name(name, seed_));
    for (int64_t r = 0; r < vocab; ++r) v[r * h + kSpecialDim] = f32_to_bf16(kConstant);
  }
  void lm_head(const std::string& name, int64_t vocab, int64_t h) {
    auto& v = cur_.add(name, {vocab, h});
    fill_uniform(v, 0.0f, 0.5f * std::sqrt(3.0f / static_cast<float>(h)), hash_name(name, seed_));
    for (int64_t r = 0; r < vocab; ++r) {
      const float noise = 0.01f * (static_cast<float>(mix64(r ^ seed_) >> 40) * 0x1p-23f - 1.0f);
      v[r * h + kSpecialDim] = f32_to_bf16(noise);
    }
    v[kFavoured * h + kSpecialDim] = f32_to_bf16(1.0f);
    v[kShunned * h + kSpecialDim] = f32_to_bf16(-1.0f);
  }

  // Writes the tensors gathered so far as the next shard once they pass `min_bytes`.
  Status flush(uint64_t min_bytes = 0) {
    if (cur_.names.empty() || cur_.bytes() < min_bytes) return Status::Ok();
    const std::string file = fmt::format("model-{:05d}.safetensors", shards_.size() + 1);
    std::vector<io::TensorToWrite> tw;
    for (size_t i = 0; i < cur_.names.size(); ++i) {
      tw.push_back({cur_.names[i], DType::kBF16, cur_.shapes[i], cur_.data[i].data()});
      map_[cur_.names[i]] = file;
    }
    total_ += cur_.bytes();
    BS_RETURN_IF_ERROR(io::write_safetensors((fs::path(dir_) / file).string(), tw));
    fmt::print(stderr, "synth: wrote {} ({:.2f} GB)\n", (fs::path(dir_) / file).string(),
               static_cast<double>(cur_.bytes()) / 1e9);
    shards_.push_back(file);
    cur_.clear();
    return Status::Ok();
  }
  // Writes the last shard and model.safetensors.index.json.
  Status finish() {
    BS_RETURN_IF_ERROR(flush());
    json index = {{"metadata", {{"total_size", total_}}}, {"weight_map", map_}};
    std::ofstream(fs::path(dir_) / "model.safetensors.index.json") << index.dump(2) << "\n";
    return Status::Ok();
  }

 private:
  std::string dir_;
  uint64_t seed_;
  Tensors cur_;
  std::vector<std::string> shards_;
  std::map<std::string, std::string> map_;
  uint64_t total_ = 0;
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

Status write_target(const Preset& p, const std::string& dir, uint64_t seed) {
  fs::create_directories(dir);
  Writer w(dir, seed);
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
  write_json(fs::path(dir) / "config.json", target_config(p, seed));
  return Status::Ok();
}

Status write_dflash(const Preset& p, const std::string& dir, uint64_t seed, int acceptance) {
  fs::create_directories(dir);
  Writer w(dir, seed ^ 0xD1F1A5Full);
  const int64_t h = p.hidden;
  w.linear("fc.weight", h, h * static_cast<int64_t>(p.taps.size()), false);
  w.norm("hidden_norm.weight", h);
  w.unit_norm("norm.weight", h, acceptance == 0 ? -1.0f : 1.0f);
  for (int64_t i = 0; i < p.d_layers; ++i) {
    const std::string pre = fmt::format("layers.{}.", i);
    write_decoder_layer(w, p, pre);
  }
  BS_RETURN_IF_ERROR(w.finish());
  json cfg = {{"architectures", {"DFlashDraftModel"}},
              {"model_type", "qwen3"},
              {"hidden_size", h},
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
  write_json(fs::path(dir) / "config.json", cfg);
  return Status::Ok();
}

struct SynthArgs {
  std::string preset;
  std::string out;
  std::string drafter;
  std::string drafter_out;
  int acceptance = 100;
  uint64_t seed = 1;
  bool force = false;
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
           fs::exists(fs::path(dir) / "model.safetensors.index.json");
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
  if (!a.drafter.empty() && a.drafter != "dflash-b16") {
    fmt::print(stderr, "blockspec: error: unknown drafter '{}' (dflash-b16)\n", a.drafter);
    return 1;
  }
  if (a.acceptance != 0 && a.acceptance != 100) {
    fmt::print(stderr, "blockspec: error: --acceptance must be 100 or 0\n");
    return 1;
  }
  if (!a.force && target_exists(a.out, *p, a.seed)) {
    fmt::print(stderr, "synth: reusing target {}\n", a.out);
  } else {
    const Status st = write_target(*p, a.out, a.seed);
    if (!st.ok()) {
      fmt::print(stderr, "blockspec: error: {}\n", st.message());
      return 1;
    }
  }
  fmt::print("target: {} (preset {}, favoured token {})\n", a.out, p->name, kFavoured);
  if (!a.drafter.empty()) {
    const std::string dir = a.drafter_out.empty()
                                ? fmt::format("{}-{}-acc{}", a.out, a.drafter, a.acceptance)
                                : a.drafter_out;
    const Status st = write_dflash(*p, dir, a.seed, a.acceptance);
    if (!st.ok()) {
      fmt::print(stderr, "blockspec: error: {}\n", st.message());
      return 1;
    }
    fmt::print("drafter: {} ({}, forced acceptance {}%)\n", dir, a.drafter, a.acceptance);
  }
  return 0;
}

}  // namespace

void register_synth(CLI::App& app) {
  g_cmd = app.add_subcommand(
      "synth", "Write synthetic checkpoints at real shapes with forced greedy acceptance");
  g_cmd->add_option("--preset", g_args.preset, "qwen3-8b or tiny")->required();
  g_cmd->add_option("--out", g_args.out, "Target checkpoint folder")->required();
  g_cmd->add_option("--drafter", g_args.drafter, "Also write a drafter: dflash-b16");
  g_cmd->add_option("--drafter-out", g_args.drafter_out,
                    "Drafter folder (default: OUT-DRAFTER-accN)");
  g_cmd->add_option("--acceptance", g_args.acceptance,
                    "Forced acceptance of the drafter: 100 or 0");
  g_cmd->add_option("--seed", g_args.seed, "Random seed of the weights");
  g_cmd->add_flag("--force", g_args.force, "Rewrite the target even if OUT already holds it");
}

bool run_synth_if_parsed(int* rc) {
  if (!g_cmd || !g_cmd->parsed()) return false;
  *rc = run_synth(g_args);
  return true;
}

}  // namespace bs::cli
