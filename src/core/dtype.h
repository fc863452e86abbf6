// Storage dtypes of checkpoint tensors and scalar conversions to fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace bs {

enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI32, kI64, kU8 };

// Bytes per element.
size_t dtype_size(DType t);
// "F32", "BF16", ... (safetensors spelling).
std::string_view dtype_name(DType t);
// Parses the safetensors spelling; false when unknown.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Round to nearest even, NaN preserved.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// OCP FP8 E4M3 (the "fn" variant: no infinities, 0x7f/0xff are NaN, max 448).
float f8e4m3_to_f32(uint8_t v);
uint8_t f32_to_f8e4m3(float f);

// Converts n elements of `src` (dtype t) to fp32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace bs
