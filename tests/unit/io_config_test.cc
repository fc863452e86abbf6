// config.json parsing (hf_config) and the typed JSON field getters (json_file).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/hf_config.h"
#include "io/json_file.h"
#include "test_util.h"

namespace bs::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using bs::test_util::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A minimal valid Llama-style config; tests patch fields into it.
json base_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0})");
}

Result<TransformerConfig> parse(const json& j) { return parse_transformer_config(j, "cfg.json"); }

Status parse_status(const json& j) {
  auto c = parse(j);
  return c.ok() ? Status::Ok() : c.status();
}

TEST(HfConfigTest, Stories260K) {
  auto c = load_transformer_config(BS_SOURCE_DIR "/models/stories260K");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->hidden_act, "silu");
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c->layer_types, std::vector<std::string>(5, "full_attention"));
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_EQ(c->raw["torch_dtype"], "float32");
}

TEST(HfConfigTest, Defaults) {
  json j = base_config();
  j.erase("num_key_value_heads");
  j.erase("rms_norm_eps");
  j.erase("rope_theta");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(HfConfigTest, ExplicitHeadDim) {
  json j = base_config();
  j["head_dim"] = 128;  // Qwen3 style: head_dim * heads != hidden
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->head_dim, 128);
}

TEST(HfConfigTest, EosAsList) {
  json j = base_config();
  j["eos_token_id"] = {128001, 128008, 128009};
  j["bos_token_id"] = 128000;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c->bos_token_id, 128000);
}

TEST(HfConfigTest, EosNullIsEmpty) {
  json j = base_config();
  j["eos_token_id"] = nullptr;
  j["bos_token_id"] = nullptr;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->bos_token_id, -1);
}

TEST(HfConfigTest, GenerationConfigEosComesFirstAndKeepsConfigIds) {
  TempDir dir;
  json j = base_config();
  j["eos_token_id"] = 151643;
  j["bos_token_id"] = 151643;
  write_text(dir.file("config.json"), j.dump());
  write_text(dir.file("generation_config.json"),
             R"({"bos_token_id": 151642, "eos_token_id": [151645, 151643]})");
  auto c = load_transformer_config(dir.str());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645, 151643));
  EXPECT_EQ(c->bos_token_id, 151642);

  write_text(dir.file("generation_config.json"), R"({"eos_token_id": 7})");
  c = load_transformer_config(dir.str());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_THAT(c->eos_token_ids, ElementsAre(7, 151643));
  EXPECT_EQ(c->bos_token_id, 151643);
}

TEST(HfConfigTest, BadGenerationConfigNamesIt) {
  TempDir dir;
  write_text(dir.file("config.json"), base_config().dump());
  write_text(dir.file("generation_config.json"), R"({"eos_token_id": "two"})");
  auto c = load_transformer_config(dir.str());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("generation_config.json"));
  EXPECT_THAT(c.status().message(), HasSubstr("'eos_token_id'"));
}

TEST(HfConfigTest, RopeScalingLlama3) {
  json j = base_config();
  j["rope_scaling"] = json::parse(R"({"factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
}

TEST(HfConfigTest, RopeParametersLlama3WithThetaInside) {
  json j = base_config();
  j.erase("rope_theta");
  j["rope_parameters"] = json::parse(R"({"rope_type": "llama3", "rope_theta": 500000.0,
      "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
}

TEST(HfConfigTest, Llama3MissingFieldNamesIt) {
  json j = base_config();
  j["rope_scaling"] = json::parse(R"({"rope_type": "llama3", "factor": 8.0,
      "high_freq_factor": 4.0})");
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cfg.json (rope_scaling)"));
  EXPECT_THAT(s.message(), HasSubstr("'low_freq_factor'"));
}

TEST(HfConfigTest, RopeScalingYarnOldSpelling) {
  json j = base_config();
  j["rope_theta"] = 1000000.0;
  j["rope_scaling"] = json::parse(R"({"type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 32768})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1000000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c->rope.beta_fast, 32);
  EXPECT_DOUBLE_EQ(c->rope.beta_slow, 1);
  EXPECT_FALSE(c->rope.attention_factor.has_value());
  EXPECT_FALSE(c->rope.mscale.has_value());
  EXPECT_TRUE(c->rope.truncate);
}

TEST(HfConfigTest, RopeParametersYarnNewSpelling) {
  // The Kimi-K3 DSpark drafter's form (specs/dflash.md 1.5).
  json j = base_config();
  j.erase("rope_theta");
  j["rope_parameters"] = json::parse(R"({"rope_type": "yarn", "factor": 16,
      "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "beta_fast": 16,
      "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false,
      "attention_factor": null})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 16.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c->rope.beta_fast, 16);
  EXPECT_DOUBLE_EQ(c->rope.beta_slow, 2);
  EXPECT_DOUBLE_EQ(c->rope.mscale.value_or(0), 0.707);
  EXPECT_DOUBLE_EQ(c->rope.mscale_all_dim.value_or(0), 1.0);
  EXPECT_FALSE(c->rope.attention_factor.has_value());
  EXPECT_FALSE(c->rope.truncate);
}

TEST(HfConfigTest, YarnWithoutFactorUsesContextRatio) {
  json j = base_config();  // max_position_embeddings 131072
  j["rope_parameters"] =
      json::parse(R"({"rope_type": "yarn", "original_max_position_embeddings": 4096})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);  // from the top level
}

TEST(HfConfigTest, TopLevelOriginalMaxPositionWins) {
  json j = base_config();
  j["original_max_position_embeddings"] = 2048;
  j["rope_scaling"] = json::parse(
      R"({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.original_max_position_embeddings, 2048);
}

TEST(HfConfigTest, YarnOriginalDefaultsToMaxPosition) {
  json j = base_config();
  j["rope_scaling"] = json::parse(R"({"rope_type": "yarn", "factor": 2.0})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.original_max_position_embeddings, 131072);
}

TEST(HfConfigTest, RopeScalingLinearAndDefaultSpellings) {
  json j = base_config();
  j["rope_scaling"] = json::parse(R"({"type": "linear", "factor": 2.0})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope.factor, 2.0);

  for (const char* spelling : {R"({"rope_type": "default"})", R"({"type": "none"})",
                               R"({"rope_type": null, "rope_theta": 1e6})", "null"}) {
    j["rope_scaling"] = json::parse(spelling);
    c = parse(j);
    ASSERT_TRUE(c.ok()) << spelling << ": " << c.status().message();
    EXPECT_EQ(c->rope.type, RopeType::kDefault) << spelling;
  }
  // Qwen3 under transformers 5: rope_parameters carries theta for the default type.
  j.erase("rope_scaling");
  j["rope_parameters"] = json::parse(R"({"rope_type": "default", "rope_theta": 1000000})");
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
}

TEST(HfConfigTest, UnknownRopeTypeIsUnimplemented) {
  json j = base_config();
  j["rope_scaling"] = json::parse(R"({"rope_type": "dynamic", "factor": 2.0})");
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("'dynamic'"));
  EXPECT_THAT(s.message(), HasSubstr("cfg.json"));
}

TEST(HfConfigTest, PerLayerTypeRopeIsUnimplemented) {
  json j = base_config();
  j["rope_parameters"] = json::parse(R"({"full_attention": {"rope_type": "default"},
      "sliding_attention": {"rope_type": "default"}})");
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("rope_parameters"));
}

TEST(HfConfigTest, PartialRotaryIsUnimplemented) {
  json j = base_config();
  j["partial_rotary_factor"] = 0.5;
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("partial_rotary_factor"));
}

TEST(HfConfigTest, RopeScalingNotObject) {
  json j = base_config();
  j["rope_scaling"] = "yarn";
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'rope_scaling'"));
}

TEST(HfConfigTest, LinearWithoutFactor) {
  json j = base_config();
  j["rope_scaling"] = json::parse(R"({"rope_type": "linear"})");
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'factor'"));
}

TEST(HfConfigTest, MissingHiddenSize) {
  json j = base_config();
  j.erase("hidden_size");
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cfg.json"));
  EXPECT_THAT(s.message(), HasSubstr("'hidden_size'"));
}

TEST(HfConfigTest, MissingHiddenSizeFromFileNamesPath) {
  TempDir dir;
  json j = base_config();
  j.erase("hidden_size");
  write_text(dir.file("config.json"), j.dump());
  auto c = load_transformer_config(dir.str());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr(dir.file("config.json")));
  EXPECT_THAT(c.status().message(), HasSubstr("missing required field 'hidden_size'"));
}

TEST(HfConfigTest, WrongTypeNamesField) {
  json j = base_config();
  j["num_hidden_layers"] = "two";
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'num_hidden_layers'"));
  EXPECT_THAT(s.message(), HasSubstr("integer"));
}

TEST(HfConfigTest, NonPositiveNamesField) {
  for (const char* field :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "max_position_embeddings"}) {
    json j = base_config();
    j[field] = 0;
    Status s = parse_status(j);
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_THAT(s.message(), HasSubstr(fmt::format("'{}'", field)));
    EXPECT_THAT(s.message(), HasSubstr("positive"));
  }
}

TEST(HfConfigTest, HeadsNotDivisible) {
  json j = base_config();
  j["num_key_value_heads"] = 3;
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("num_attention_heads (8)"));
  EXPECT_THAT(s.message(), HasSubstr("num_key_value_heads (3)"));
}

TEST(HfConfigTest, HiddenNotDivisibleWithoutHeadDim) {
  json j = base_config();
  j["num_attention_heads"] = 6;
  j["num_key_value_heads"] = 6;
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("head_dim"));
}

TEST(HfConfigTest, LayerTypesAndSlidingWindow) {
  json j = base_config();
  j["layer_types"] = {"sliding_attention", "full_attention"};
  j["sliding_window"] = 2048;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_THAT(c->layer_types, ElementsAre("sliding_attention", "full_attention"));
  EXPECT_EQ(c->sliding_window.value_or(0), 2048);

  j["layer_types"] = {"full_attention"};
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'layer_types'"));

  j["layer_types"] = {"sliding_attention", "full_attention"};
  j["sliding_window"] = nullptr;
  s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("sliding_window"));
}

TEST(HfConfigTest, Qwen3UseSlidingWindowFalseDisablesWindow) {
  json j = base_config();
  j["sliding_window"] = 4096;
  j["use_sliding_window"] = false;
  j["max_window_layers"] = 1;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_THAT(c->layer_types, ElementsAre("full_attention", "full_attention"));

  j["use_sliding_window"] = true;
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->sliding_window.value_or(0), 4096);
  EXPECT_THAT(c->layer_types, ElementsAre("full_attention", "sliding_attention"));
}

// Mistral (no use_sliding_window switch): a sliding_window applies to every layer, as
// transformers' Mistral masks it; null means none.
TEST(HfConfigTest, MistralSlidingWindowCoversEveryLayer) {
  json j = base_config();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = 4096;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->sliding_window.value_or(0), 4096);
  EXPECT_THAT(c->layer_types, ElementsAre("sliding_attention", "sliding_attention"));
  j["sliding_window"] = nullptr;
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_THAT(c->layer_types, ElementsAre("full_attention", "full_attention"));
  // A Llama config with a stray sliding_window keeps full attention (no switch says otherwise).
  j = base_config();
  j["sliding_window"] = 4096;
  c = parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->layer_types, ElementsAre("full_attention", "full_attention"));
}

TEST(HfConfigTest, TextConfigNesting) {
  json inner = base_config();
  inner.erase("architectures");
  json j = {{"architectures", {"SomeVLForConditionalGeneration"}},
            {"model_type", "some_vl"},
            {"tie_word_embeddings", true},
            {"text_config", inner}};
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "SomeVLForConditionalGeneration");
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_TRUE(c->tie_word_embeddings);

  j["text_config"].erase("vocab_size");
  Status s = parse_status(j);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cfg.json (text_config)"));
  EXPECT_THAT(s.message(), HasSubstr("'vocab_size'"));
}

TEST(HfConfigTest, NotAnObject) {
  Status s = parse_status(json::array());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cfg.json"));
}

TEST(HfConfigTest, BadJson) {
  TempDir dir;
  write_text(dir.file("config.json"), "{\"hidden_size\": 64,\n \"vocab_size\": }");
  auto c = load_transformer_config(dir.str());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(dir.file("config.json")));
  EXPECT_THAT(c.status().message(), HasSubstr("invalid JSON"));
  EXPECT_THAT(c.status().message(), HasSubstr("line 2"));
}

TEST(HfConfigTest, MissingConfigIsNotFound) {
  TempDir dir;
  auto c = load_transformer_config(dir.str());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("config.json"));
}

// ---- json_file getters ----

TEST(JsonFileTest, ReadJsonFileMissingAndDirectory) {
  TempDir dir;
  auto missing = read_json_file(dir.file("nope.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.json"));
  auto d = read_json_file(dir.str());
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("directory"));
}

TEST(JsonFileTest, ReadJsonFileOk) {
  TempDir dir;
  write_text(dir.file("a.json"), R"({"x": [1, 2]})");
  auto j = read_json_file(dir.file("a.json"));
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ((*j)["x"][1], 2);
}

TEST(JsonFileTest, Getters) {
  const json j = json::parse(R"({"i": 3, "f": 2.5, "fi": 4096.0, "s": "hi", "b": true,
      "l": [1, 2, 3], "n": null, "big": 18446744073709551615, "sl": ["a", "b"]})");
  EXPECT_EQ(*get_int(j, "i", "f.json"), 3);
  EXPECT_EQ(*get_int(j, "fi", "f.json"), 4096);
  EXPECT_DOUBLE_EQ(*get_float(j, "f", "f.json"), 2.5);
  EXPECT_DOUBLE_EQ(*get_float(j, "i", "f.json"), 3.0);
  EXPECT_EQ(*get_string(j, "s", "f.json"), "hi");
  EXPECT_TRUE(*get_bool(j, "b", "f.json"));
  EXPECT_THAT(*get_int_list(j, "l", "f.json"), ElementsAre(1, 2, 3));
  EXPECT_THAT(*get_int_list(j, "i", "f.json", /*allow_scalar=*/true), ElementsAre(3));
  EXPECT_THAT(*get_string_list_or_empty(j, "sl", "f.json"), ElementsAre("a", "b"));
  EXPECT_TRUE(get_string_list_or_empty(j, "absent", "f.json")->empty());
  EXPECT_TRUE(get_int_list_or_empty(j, "n", "f.json")->empty());

  EXPECT_EQ(*get_int_or(j, "absent", "f.json", 7), 7);
  EXPECT_EQ(*get_int_or(j, "n", "f.json", 8), 8);  // null means absent
  EXPECT_DOUBLE_EQ(*get_float_or(j, "absent", "f.json", 0.5), 0.5);
  EXPECT_EQ(*get_string_or(j, "absent", "f.json", "d"), "d");
  EXPECT_FALSE(*get_bool_or(j, "absent", "f.json", false));
  EXPECT_TRUE(has_field(j, "i"));
  EXPECT_FALSE(has_field(j, "n"));
}

TEST(JsonFileTest, GetterErrorsNameFieldAndFile) {
  const json j = json::parse(R"({"f": 2.5, "s": "hi", "l": [1, "x"], "big": 18446744073709551615,
      "b": 1})");
  auto frac = get_int(j, "f", "f.json");
  ASSERT_FALSE(frac.ok());
  EXPECT_THAT(frac.status().message(), HasSubstr("f.json: field 'f' must be an integer"));
  auto big = get_int(j, "big", "f.json");
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.status().message(), HasSubstr("out of range"));
  auto str = get_float(j, "s", "f.json");
  ASSERT_FALSE(str.ok());
  EXPECT_THAT(str.status().message(), HasSubstr("field 's' must be a number, got string"));
  auto lst = get_int_list(j, "l", "f.json");
  ASSERT_FALSE(lst.ok());
  EXPECT_THAT(lst.status().message(), HasSubstr("'l[1]'"));
  auto scalar = get_int_list(j, "f", "f.json");
  ASSERT_FALSE(scalar.ok());
  EXPECT_THAT(scalar.status().message(), HasSubstr("list of integers"));
  auto b = get_bool_or(j, "b", "f.json", false);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("'b' must be a boolean"));
  auto missing = get_string(j, "nope", "f.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("f.json: missing required field 'nope'"));
  auto not_obj = get_int(json::array(), "x", "f.json");
  ASSERT_FALSE(not_obj.ok());
  EXPECT_THAT(not_obj.status().message(), HasSubstr("expected a JSON object"));
}

}  // namespace
}  // namespace bs::io
