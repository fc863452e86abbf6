// safetensors reader/writer: round trips, the real stories260K checkpoint, sharded indexes, and one
// test per malformed input (each must fail with a message naming the file/tensor).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "test_util.h"

namespace bs::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using bs::test_util::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// [u64 length][header][data]; `length` overrides the header length field.
std::string make_file(const std::string& header, const std::string& data,
                      std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Writes a file with one header and `data_bytes` zero bytes of data; returns its open status.
Status open_with_header(const TempDir& dir, const std::string& header, size_t data_bytes) {
  const std::string path = dir.file("model.safetensors");
  write_bytes(path, make_file(header, std::string(data_bytes, '\0')));
  auto ck = Checkpoint::open_file(path);
  return ck.ok() ? Status::Ok() : ck.status();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(SafetensorsTest, RoundTripEveryDtype) {
  TempDir dir;
  struct Src {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Src> srcs;
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3,
                          DType::kI32, DType::kI64, DType::kU8};
  int k = 0;
  for (DType t : dtypes) {
    Src s{fmt::format("t.{}", dtype_name(t)), t, {3, 5}, {}};
    s.bytes.resize(15 * dtype_size(t));
    for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = static_cast<uint8_t>(i * 7 + k);
    ++k;
    srcs.push_back(s);
  }
  srcs.push_back({"scalar", DType::kF32, {}, {0, 0, 128, 63}});  // 1.0f
  srcs.push_back({"empty", DType::kBF16, {0, 4}, {}});
  std::vector<TensorToWrite> w;
  for (const Src& s : srcs) w.push_back({s.name, s.dtype, s.shape, s.bytes.data()});
  const std::string path = dir.file("rt.safetensors");
  ASSERT_TRUE(write_safetensors(path, w, {{"format", "pt"}, {"note", "x"}}).ok());

  auto ck = Checkpoint::open_file(path);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->size(), srcs.size());
  EXPECT_EQ(ck->metadata().at("format"), "pt");
  EXPECT_EQ(ck->metadata().at("note"), "x");
  for (const Src& s : srcs) {
    auto t = ck->get(s.name, s.shape);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ((*t)->dtype, s.dtype) << s.name;
    EXPECT_EQ((*t)->nbytes, s.bytes.size()) << s.name;
    EXPECT_EQ((*t)->numel() * static_cast<int64_t>(dtype_size(s.dtype)),
              static_cast<int64_t>(s.bytes.size()));
    EXPECT_EQ((*t)->file, path);
    if (!s.bytes.empty()) {
      EXPECT_EQ(std::memcmp((*t)->data, s.bytes.data(), s.bytes.size()), 0) << s.name;
      // The reference layout (descending element size) keeps every tensor aligned.
      EXPECT_EQ(reinterpret_cast<uintptr_t>((*t)->data) % dtype_size(s.dtype), 0u) << s.name;
    }
  }
  auto scalar = ck->get("scalar");
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ((*scalar)->numel(), 1);
  float one;
  std::memcpy(&one, (*scalar)->data, 4);
  EXPECT_EQ(one, 1.0f);
}

TEST(SafetensorsTest, HeaderIsPaddedToEightBytesWithSpaces) {
  TempDir dir;
  const uint8_t b[3] = {1, 2, 3};
  const std::string path = dir.file("p.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"abc", DType::kU8, {3}, b}}).ok());
  const std::string bytes = read_file(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 3);
  EXPECT_EQ(bytes[8], '{');
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.substr(header.find_last_not_of(' ') + 1),
            std::string(n - 1 - header.find_last_not_of(' '), ' '));
  EXPECT_EQ(bytes.substr(8 + n), "\x01\x02\x03");
}

TEST(SafetensorsTest, WriterRejectsDuplicateAndNegative) {
  TempDir dir;
  const float x[1] = {0};
  Status dup = write_safetensors(dir.file("a.safetensors"),
                                 {{"w", DType::kF32, {1}, x}, {"w", DType::kF32, {1}, x}});
  EXPECT_FALSE(dup.ok());
  EXPECT_THAT(dup.message(), HasSubstr("'w'"));
  Status neg = write_safetensors(dir.file("b.safetensors"), {{"w", DType::kF32, {-1}, x}});
  EXPECT_FALSE(neg.ok());
  EXPECT_THAT(neg.message(), HasSubstr("negative"));
}

TEST(SafetensorsTest, ReadsStories260K) {
  const std::string dir = BS_SOURCE_DIR "/models/stories260K";
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->size(), 47u);
  EXPECT_EQ(ck->names().size(), 47u);
  EXPECT_EQ(ck->dir(), dir);
  EXPECT_EQ(ck->metadata().at("format"), "pt");
  ASSERT_EQ(ck->files().size(), 1u);
  EXPECT_THAT(ck->files()[0], HasSubstr("model.safetensors"));

  auto emb = ck->get("model.embed_tokens.weight", {512, 64});
  ASSERT_TRUE(emb.ok()) << emb.status().message();
  EXPECT_EQ((*emb)->dtype, DType::kF32);
  EXPECT_EQ((*emb)->nbytes, 512u * 64u * 4u);
  std::vector<float> v(512 * 64);
  std::memcpy(v.data(), (*emb)->data, (*emb)->nbytes);
  double sum_sq = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum_sq += double{x} * x;
  }
  EXPECT_GT(sum_sq, 0.0);  // trained weights, not zeros

  auto norm = ck->get("model.layers.0.input_layernorm.weight", {64});
  ASSERT_TRUE(norm.ok()) << norm.status().message();
  float first;
  std::memcpy(&first, (*norm)->data, 4);
  EXPECT_TRUE(std::isfinite(first));
  EXPECT_TRUE(ck->has("model.layers.4.mlp.down_proj.weight"));
  EXPECT_FALSE(ck->has("lm_head.weight"));  // tied embeddings

  // A path to the file itself works too.
  auto direct = Checkpoint::open(dir + "/model.safetensors");
  ASSERT_TRUE(direct.ok()) << direct.status().message();
  EXPECT_EQ(direct->size(), 47u);
}

TEST(SafetensorsTest, MissingTensorNamesDir) {
  auto ck = Checkpoint::open(BS_SOURCE_DIR "/models/stories260K");
  ASSERT_TRUE(ck.ok());
  auto t = ck->get("nope.weight");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr("tensor 'nope.weight' not found in"));
  EXPECT_THAT(t.status().message(), HasSubstr("models/stories260K"));
}

TEST(SafetensorsTest, ShapeMismatchNamesBothShapes) {
  auto ck = Checkpoint::open(BS_SOURCE_DIR "/models/stories260K");
  ASSERT_TRUE(ck.ok());
  auto t = ck->get("model.embed_tokens.weight", {64, 512});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("tensor 'model.embed_tokens.weight' in "));
  EXPECT_THAT(t.status().message(), HasSubstr("model.safetensors has shape [512,64], "
                                              "expected [64,512]"));
}

TEST(SafetensorsTest, MoveKeepsPointersValid) {
  TempDir dir;
  const int32_t x[2] = {7, 9};
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), {{"x", DType::kI32, {2}, x}}).ok());
  auto ck = Checkpoint::open(dir.str());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const TensorInfo* before = *ck->get("x");
  Checkpoint moved = std::move(ck).value();
  Checkpoint again = std::move(moved);
  const TensorInfo* after = *again.get("x");
  EXPECT_EQ(before, after);
  int32_t y[2];
  std::memcpy(y, after->data, 8);
  EXPECT_EQ(y[0], 7);
  EXPECT_EQ(y[1], 9);
}

// ---- directory layouts ----

void write_two_shards(const TempDir& dir) {
  const float a[4] = {1, 2, 3, 4};
  const float b[2] = {5, 6};
  const int64_t c[1] = {42};
  ASSERT_TRUE(write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                                {{"a", DType::kF32, {2, 2}, a}, {"c", DType::kI64, {1}, c}},
                                {{"format", "pt"}})
                  .ok());
  ASSERT_TRUE(
      write_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"b", DType::kF32, {2}, b}})
          .ok());
}

const char* kGoodIndex = R"({
  "metadata": {"total_size": 32},
  "weight_map": {"a": "model-00001-of-00002.safetensors",
                 "c": "model-00001-of-00002.safetensors",
                 "b": "model-00002-of-00002.safetensors"}})";

TEST(SafetensorsTest, ShardedIndex) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model.safetensors.index.json"), kGoodIndex);
  auto ck = Checkpoint::open(dir.str());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck->files().size(), 2u);
  EXPECT_EQ(ck->metadata().at("format"), "pt");
  auto b = ck->get("b", {2});
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_THAT((*b)->file, HasSubstr("model-00002-of-00002.safetensors"));
  float bv[2];
  std::memcpy(bv, (*b)->data, 8);
  EXPECT_EQ(bv[1], 6.0f);
  auto c = ck->get("c", {1});
  ASSERT_TRUE(c.ok());
  int64_t cv;
  std::memcpy(&cv, (*c)->data, 8);
  EXPECT_EQ(cv, 42);
}

TEST(SafetensorsTest, SingleOtherNamedFileIsFound) {
  TempDir dir;
  const float a[1] = {3};
  ASSERT_TRUE(
      write_safetensors(dir.file("weights.safetensors"), {{"a", DType::kF32, {1}, a}}).ok());
  auto ck = Checkpoint::open(dir.str());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_TRUE(ck->has("a"));
}

TEST(SafetensorsTest, SeveralFilesWithoutIndexIsAnError) {
  TempDir dir;
  write_two_shards(dir);
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("model-00001-of-00002.safetensors"));
  EXPECT_THAT(ck.status().message(), HasSubstr("index"));
}

TEST(SafetensorsTest, EmptyDirIsNotFound) {
  TempDir dir;
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ck.status().message(), HasSubstr(dir.str()));
}

TEST(SafetensorsTest, MissingDirIsNotFound) {
  TempDir dir;
  auto ck = Checkpoint::open(dir.file("does_not_exist"));
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ck.status().message(), HasSubstr("does_not_exist"));
}

// ---- malformed single files ----

TEST(SafetensorsMalformed, FileMissing) {
  TempDir dir;
  auto ck = Checkpoint::open_file(dir.file("missing.safetensors"));
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ck.status().message(), HasSubstr("missing.safetensors"));
}

TEST(SafetensorsMalformed, EmptyFile) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), "");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(ck.status().message(), HasSubstr("too short"));
}

TEST(SafetensorsMalformed, ShorterThanEightBytes) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), "\x05\x00\x00");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(ck.status().message(), HasSubstr("too short"));
}

TEST(SafetensorsMalformed, HeaderLongerThanFile) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), make_file("{}", "", 1000));
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(ck.status().message(), HasSubstr("header length 1000"));
}

TEST(SafetensorsMalformed, HeaderLengthAbsurd) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), make_file("{}", "", uint64_t{1} << 62));
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(ck.status().message(), HasSubstr("limit"));
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  TempDir dir;
  Status s = open_with_header(dir, R"({"a": {"dtype": "F32",, }})", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));
}

TEST(SafetensorsMalformed, HeaderNotObject) {
  TempDir dir;
  Status s = open_with_header(dir, "[1, 2]  ", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("not a JSON object"));
}

TEST(SafetensorsMalformed, EntryNotObject) {
  TempDir dir;
  Status s = open_with_header(dir, R"({"w": 5})", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w' in "));
  EXPECT_THAT(s.message(), HasSubstr("object"));
}

TEST(SafetensorsMalformed, MissingDtype) {
  TempDir dir;
  Status s = open_with_header(dir, R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w' in "));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("missing 'dtype'"));
}

TEST(SafetensorsMalformed, MissingShape) {
  TempDir dir;
  Status s = open_with_header(dir, R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("missing 'shape'"));
}

TEST(SafetensorsMalformed, MissingDataOffsets) {
  TempDir dir;
  Status s = open_with_header(dir, R"({"w": {"dtype": "F32", "shape": [1]}})", 4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("missing 'data_offsets'"));
}

TEST(SafetensorsMalformed, UnknownDtype) {
  TempDir dir;
  Status s =
      open_with_header(dir, R"({"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}})", 4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("unknown dtype 'Q7'"));
}

TEST(SafetensorsMalformed, UnsupportedDtype) {
  TempDir dir;
  Status s =
      open_with_header(dir, R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("F64"));
}

TEST(SafetensorsMalformed, NegativeDim) {
  TempDir dir;
  Status s = open_with_header(
      dir, R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 4]}})", 4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("negative dimension"));
}

TEST(SafetensorsMalformed, ShapeNotIntegers) {
  TempDir dir;
  Status s = open_with_header(
      dir, R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("'shape'"));
}

TEST(SafetensorsMalformed, OffsetsNotAPair) {
  TempDir dir;
  Status s =
      open_with_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", 4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("'data_offsets' must be [begin, end]"));
}

TEST(SafetensorsMalformed, OffsetsNegative) {
  TempDir dir;
  Status s =
      open_with_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("data_offsets"));
}

TEST(SafetensorsMalformed, OffsetsBeginAfterEnd) {
  TempDir dir;
  Status s =
      open_with_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("begin > end"));
}

TEST(SafetensorsMalformed, OffsetsBeyondData) {
  TempDir dir;
  Status s =
      open_with_header(dir, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("past the end"));
}

TEST(SafetensorsMalformed, ByteSizeMismatch) {
  TempDir dir;
  Status s =
      open_with_header(dir, R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})", 8);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("hold 8 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("needs 6"));
}

TEST(SafetensorsMalformed, ShapeOverflow) {
  TempDir dir;
  Status s = open_with_header(dir,
                              R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],
                                  "data_offsets": [0, 4]}})",
                              4);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("overflows"));
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  TempDir dir;
  Status s = open_with_header(dir, R"({
      "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                              12);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'a'"));
  EXPECT_THAT(s.message(), HasSubstr("'b'"));
  EXPECT_THAT(s.message(), HasSubstr("overlap"));
}

TEST(SafetensorsMalformed, DuplicateTensorInHeader) {
  TempDir dir;
  Status s = open_with_header(dir, R"({
      "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                              8);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'a'"));
  EXPECT_THAT(s.message(), HasSubstr("twice"));
}

TEST(SafetensorsMalformed, MetadataValueNotString) {
  TempDir dir;
  Status s = open_with_header(dir, R"({"__metadata__": {"format": 3}})", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("__metadata__"));
  EXPECT_THAT(s.message(), HasSubstr("'format'"));
}

TEST(SafetensorsTest, AnyOrderAndEmptyTensorsAreAccepted) {
  TempDir dir;
  Status s = open_with_header(dir, R"({
      "late": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
      "early": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "none": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
      "__metadata__": null})",
                              8);
  EXPECT_TRUE(s.ok()) << s.message();
}

// Truncating a valid file at every length, and corrupting header bytes, must give an error or a
// valid checkpoint, never a crash (run under ASan/UBSan to make this meaningful).
TEST(SafetensorsMalformed, TruncationAndCorruptionNeverCrash) {
  TempDir dir;
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const uint16_t b[3] = {1, 2, 3};
  const std::string good = dir.file("good.safetensors");
  ASSERT_TRUE(write_safetensors(good, {{"a", DType::kF32, {2, 3}, a}, {"b", DType::kBF16, {3}, b}},
                                {{"format", "pt"}})
                  .ok());
  const std::string bytes = read_file(good);
  const std::string path = dir.file("bad.safetensors");
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(path, bytes.substr(0, len));
    auto ck = Checkpoint::open_file(path);
    EXPECT_FALSE(ck.ok()) << "truncated to " << len;
    if (!ck.ok()) {
      EXPECT_THAT(ck.status().message(), HasSubstr("bad.safetensors"));
    }
  }
  uint32_t seed = 12345;
  auto next = [&seed]() {
    seed = seed * 1664525u + 1013904223u;
    return seed >> 8;
  };
  const char kChars[] = "{}[]\",:-0123456789eE. aFBIU_";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string c = bytes;
    const int flips = 1 + static_cast<int>(next() % 3);
    for (int k = 0; k < flips; ++k) {
      const size_t pos = next() % c.size();
      c[pos] =
          (next() % 2) ? static_cast<char>(next() & 0xff) : kChars[next() % (sizeof(kChars) - 1)];
    }
    write_bytes(path, c);
    auto ck = Checkpoint::open_file(path);
    if (ck.ok()) {
      for (const std::string& name : ck->names()) {
        const TensorInfo* t = *ck->get(name);
        EXPECT_EQ(t->nbytes, static_cast<size_t>(t->numel()) * dtype_size(t->dtype));
      }
    }
  }
}

// ---- malformed sharded checkpoints ----

TEST(SafetensorsShardedMalformed, IndexNotJson) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model.safetensors.index.json"), "{\"weight_map\": ");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("model.safetensors.index.json"));
}

TEST(SafetensorsShardedMalformed, IndexWithoutWeightMap) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(ck.status().message(), HasSubstr("'weight_map'"));
}

TEST(SafetensorsShardedMalformed, WeightMapNotObject) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": ["a"]})");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("'weight_map'"));
}

TEST(SafetensorsShardedMalformed, WeightMapValueNotString) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": {"a": 1}})");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("tensor 'a'"));
}

TEST(SafetensorsShardedMalformed, ShardEscapesDirectory) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model.safetensors.index.json"),
              R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("tensor 'a'"));
  EXPECT_THAT(ck.status().message(), HasSubstr("../model-00001"));
}

TEST(SafetensorsShardedMalformed, ShardFileMissing) {
  TempDir dir;
  write_two_shards(dir);
  fs::remove(dir.file("model-00002-of-00002.safetensors"));
  write_bytes(dir.file("model.safetensors.index.json"), kGoodIndex);
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ck.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(ck.status().message(), HasSubstr("model.safetensors.index.json"));
}

TEST(SafetensorsShardedMalformed, TensorAbsentFromItsShard) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": {
      "a": "model-00001-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors",
      "ghost": "model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  // Either 'b' (listed in the wrong shard) or 'ghost' (in no shard) is reported.
  EXPECT_THAT(ck.status().message(), HasSubstr("listed in"));
  EXPECT_THAT(ck.status().message(), HasSubstr("is not in its shard"));
}

TEST(SafetensorsShardedMalformed, GhostTensor) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": {
      "a": "model-00001-of-00002.safetensors",
      "ghost": "model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("tensor 'ghost'"));
  EXPECT_THAT(ck.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST(SafetensorsShardedMalformed, DuplicateAcrossShards) {
  TempDir dir;
  const float a[1] = {1};
  ASSERT_TRUE(write_safetensors(dir.file("s1.safetensors"), {{"a", DType::kF32, {1}, a}}).ok());
  ASSERT_TRUE(write_safetensors(dir.file("s2.safetensors"), {{"a", DType::kF32, {1}, a}}).ok());
  write_bytes(dir.file("model.safetensors.index.json"),
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("tensor 'a'"));
  EXPECT_THAT(ck.status().message(), HasSubstr("s1.safetensors"));
  EXPECT_THAT(ck.status().message(), HasSubstr("s2.safetensors"));
}

TEST(SafetensorsShardedMalformed, BadShardNamesTheShard) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model-00002-of-00002.safetensors"), "\x01\x02");
  write_bytes(dir.file("model.safetensors.index.json"), kGoodIndex);
  auto ck = Checkpoint::open(dir.str());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
}

}  // namespace
}  // namespace bs::io
