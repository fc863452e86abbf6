// The model registry rejects what it cannot serve with errors naming the file and field.
#include "models/registry.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace bs {
namespace {

namespace fs = std::filesystem;

// A copy of stories260K whose config.json has `key` set to `value` (raw JSON).
std::string patched_model(const std::string& name, const std::string& key,
                          const std::string& value) {
  const fs::path src = fs::path(BS_SOURCE_DIR) / "models" / "stories260K";
  const fs::path dir = fs::temp_directory_path() / ("bs_registry_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(src / "model.safetensors", dir / "model.safetensors");
  std::ifstream in(src / "config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string needle = "\"" + key + "\":";
  const size_t at = cfg.find(needle);
  EXPECT_NE(at, std::string::npos) << key;
  const size_t end = cfg.find_first_of(",\n}", cfg.find_first_not_of(" ", at + needle.size()) + 1);
  const size_t value_start = at + needle.size();
  size_t value_end = end;
  if (cfg[cfg.find_first_not_of(" ", value_start)] == '[')
    value_end = cfg.find(']', value_start) + 1;
  cfg = cfg.substr(0, value_start) + " " + value + cfg.substr(value_end);
  std::ofstream(dir / "config.json") << cfg;
  return dir.string();
}

TEST(Registry, UnknownArchitectureIsNamed) {
  auto backend = make_cpu_backend(1);
  const auto dir = patched_model("arch", "architectures", "[\"GPT2LMHeadModel\"]");
  auto m = load_target(dir, *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("GPT2LMHeadModel"), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("config.json"), std::string::npos);
}

TEST(Registry, UnsupportedActivationIsNamed) {
  auto backend = make_cpu_backend(1);
  auto m = load_target(patched_model("act", "hidden_act", "\"gelu\""), *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("hidden_act"), std::string::npos) << m.status().message();
}

TEST(Registry, MisshapenTensorIsNamed) {
  auto backend = make_cpu_backend(1);
  // The checkpoint's tensors no longer fit a wider model.
  auto m = load_target(patched_model("shape", "intermediate_size", "200"), *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("mlp.gate_proj.weight"), std::string::npos)
      << m.status().message();
}

TEST(Registry, MissingDirectoryIsNamed) {
  auto backend = make_cpu_backend(1);
  auto m = load_target("/no/such/model", *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("/no/such/model"), std::string::npos);
}

}  // namespace
}  // namespace bs
