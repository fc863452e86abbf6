#include "core/dtype.h"

#include <cmath>

namespace bs {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  static constexpr struct {
    std::string_view name;
    DType type;
  } kTable[] = {{"F32", DType::kF32},        {"F16", DType::kF16}, {"BF16", DType::kBF16},
                {"F8_E4M3", DType::kF8E4M3}, {"I32", DType::kI32}, {"I64", DType::kI64},
                {"U8", DType::kU8}};
  for (const auto& e : kTable) {
    if (e.name == name) {
      *out = e.type;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00u;
  if (a < std::ldexp(1.0f, -24) * 0.5f) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + 15;
  if (exp <= 0) {  // subnormal: units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  }
  uint32_t m = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 10 - (e - 1))));  // 1024..2048
  if (m == 2048) {
    m = 1024;
    ++exp;
  }
  if (exp >= 31) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>(exp << 10) | static_cast<uint16_t>(m & 0x3ffu);
}

float f8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  float r;
  if (exp == 15 && mant == 7) return NAN;
  if (exp == 0) {
    r = std::ldexp(static_cast<float>(mant), -9);
  } else {
    r = std::ldexp(static_cast<float>(mant | 8u), static_cast<int>(exp) - 10);
  }
  return sign ? -r : r;
}

uint8_t f32_to_f8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fmin(std::fabs(f), 448.0f);  // saturating, like cvt .satfinite
  // Below the smallest normal 2^-6 the code is the count of 2^-9 quanta (code 8 is 2^-6 itself).
  // std::nearbyint rounds half to even in the default rounding mode: ties go to the even code.
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  int e = 0;
  std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1): a's binade is [2^(e-1), 2^e)
  // 8 quanta of 2^(e-4) per binade; q in [8, 16] (16 carries into the next exponent).
  const int q = static_cast<int>(std::nearbyint(std::ldexp(a, 4 - e)));
  return sign | static_cast<uint8_t>(((e + 6) << 3) + q - 8);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      float table[256];
      for (int i = 0; i < 256; ++i) table[i] = f8e4m3_to_f32(static_cast<uint8_t>(i));
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
    case DType::kI32: {
      const auto* s = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kI64: {
      const auto* s = static_cast<const int64_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kU8: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
  }
}

}  // namespace bs
