// models/weight_budget: a model that cannot fit is refused before loading, with the sizes; load
// progress stays silent for fast loads.
#include "models/weight_budget.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "backend/backend.h"

namespace bs {
namespace {

using ::testing::HasSubstr;

const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(WeightBudget, UploadedBytesCountMatricesInTheBackendsDtype) {
  auto ckpt = io::Checkpoint::open(kStories);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  // stories260K: 260,032 parameters (models/MANIFEST.md), of which 11 norm vectors of 64.
  EXPECT_EQ(uploaded_weight_bytes(*ckpt, DType::kF32), 260032 * 4);
  EXPECT_EQ(uploaded_weight_bytes(*ckpt, DType::kBF16), (260032 - 704) * 2 + 704 * 4);
  const auto cpu = make_cpu_backend(1);
  const WeightFootprint held = weights_held_by(*ckpt, *cpu);
  EXPECT_EQ(held.bytes, 260032 * 4);
  EXPECT_EQ(held.how, "F32 on the cpu backend");
}

TEST(WeightBudget, AModelThatCannotFitIsRefusedWithTheSizes) {
  // Qwen3-8B (8.19e9 parameters) on the CPU backend (F32: 32.8 GB) with 24 GiB available.
  const WeightFootprint qwen3_8b{.bytes = 8'190'735'360LL * 4, .how = "F32 on the cpu backend"};
  const AvailableMemory ram{.bytes = int64_t{24} << 30,
                            .source = "available in RAM (MemAvailable, of 31.0 GiB total)",
                            .remedy = "use a smaller model"};
  const Status s = check_weights_fit("/models/Qwen3-8B", qwen3_8b, ram);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(s.message(),
            "/models/Qwen3-8B: the model does not fit in memory: its weights take 30.5 GiB (F32 "
            "on the cpu backend), 33.8 GiB with a margin for the runtime, and 24.0 GiB is "
            "available in RAM (MemAvailable, of 31.0 GiB total); use a smaller model");
  // In BF16 on a GPU with 24 GiB free it fits (16.4 GB + margin).
  const WeightFootprint bf16{.bytes = 8'190'735'360LL * 2, .how = "BF16 matrices"};
  EXPECT_TRUE(check_weights_fit("m", bf16, {.bytes = int64_t{24} << 30}).ok());
  // The margin: 256 MiB + 10 % of the weights.
  const int64_t w = int64_t{1} << 30;
  const int64_t need = w + w / 10 + (int64_t{256} << 20);
  EXPECT_TRUE(check_weights_fit("m", {.bytes = w}, {.bytes = need}).ok());
  EXPECT_FALSE(check_weights_fit("m", {.bytes = w}, {.bytes = need - 1}).ok());
}

TEST(WeightBudget, AvailableMemoryCanBeOverridden) {
  const auto cpu = make_cpu_backend(1);
  {
    auto m = available_memory(*cpu);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_GT(m->bytes, 0);
    EXPECT_THAT(m->source, HasSubstr("MemAvailable"));
  }
  for (const auto& [text, bytes] :
       std::vector<std::pair<const char*, int64_t>>{{"123456", 123456},
                                                    {"24G", int64_t{24} << 30},
                                                    {"24 GiB", int64_t{24} << 30},
                                                    {"1.5t", int64_t{3} << 39},
                                                    {"512M", int64_t{512} << 20},
                                                    {"64KB", 64 << 10}}) {
    ScopedEnv env("BLOCKSPEC_AVAILABLE_MEMORY", text);
    auto m = available_memory(*cpu);
    ASSERT_TRUE(m.ok()) << text << ": " << m.status().message();
    EXPECT_EQ(m->bytes, bytes) << text;
    EXPECT_THAT(m->source, HasSubstr("BLOCKSPEC_AVAILABLE_MEMORY"));
  }
  for (const char* bad : {"lots", "-1G", "12X", "1e30"}) {
    ScopedEnv env("BLOCKSPEC_AVAILABLE_MEMORY", bad);
    auto m = available_memory(*cpu);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_THAT(m.status().message(), HasSubstr("BLOCKSPEC_AVAILABLE_MEMORY")) << bad;
  }
}

TEST(WeightBudget, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1040128), "1015.8 KiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 29), "1.5 GiB");
}

TEST(LoadProgress, SilentForFastLoadsThenShowsTensorsAndBytes) {
  testing::internal::CaptureStderr();
  {
    LoadProgress fast("models/x", 2, 2048);
    fast.add(1024);
    fast.add(1024);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  testing::internal::CaptureStderr();
  {
    LoadProgress slow("models/y", 3, 3 << 20);
    slow.add(1 << 20);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    slow.add(1 << 20);  // past 1 s: shown
    slow.add(1 << 20);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("loading models/y: 2/3 tensors, 2.0 MiB / 3.0 MiB (67%)\n"));
  EXPECT_THAT(err, HasSubstr("loaded models/y: 3 tensors, 3.0 MiB in 1."));
}

}  // namespace
}  // namespace bs
