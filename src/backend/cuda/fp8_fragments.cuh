// FP8 (E4M3) weight fragments for the tensor cores, shared by fp8_matmul.cu and stream_bulk.cu:
// codes become FP16 by moving their bits into FP16's fields (value * 2^-8, exact, subnormals
// included; the 2^8 goes into the row scale), x is rounded to FP16 (saturated), and m16n8k16
// MMAs with FP32 accumulation take them.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_util.cuh"

namespace bs::cuda {

constexpr float kFp8ToF16Scale = 256.0f;  // e4m3 bits read as fp16 are the value * 2^-8

// Four E4M3 codes (bytes of w, k order 0..3) -> FP16 pairs lo = (0, 1), hi = (2, 3).
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t a = __byte_perm(w, 0, 0x1404);  // byte 0 -> bits 15..8, byte 1 -> 31..24
  const uint32_t b = __byte_perm(w, 0, 0x3424);  // byte 2 -> bits 15..8, byte 3 -> 31..24
  lo = (a & 0x80008000u) | ((a >> 1) & 0x3f803f80u);
  hi = (b & 0x80008000u) | ((b >> 1) & 0x3f803f80u);
}

// Two BF16 (k order 0, 1) -> one FP16 pair, saturated at +-65504.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v) {
  const float lo = __uint_as_float(v << 16), hi = __uint_as_float(v & 0xffff0000u);
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// d += a . b, FP16 operands (device_util.cuh's mma16816).
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  mma16816<true>(d, a0, a1, a2, a3, b0, b1);
}

// 16 consecutive codes -> 8 FP16 pairs in k order.
__device__ __forceinline__ void unpack16(const uint4& v, uint32_t (&h)[8]) {
  e4m3x4_to_f16x2(v.x, h[0], h[1]);
  e4m3x4_to_f16x2(v.y, h[2], h[3]);
  e4m3x4_to_f16x2(v.z, h[4], h[5]);
  e4m3x4_to_f16x2(v.w, h[6], h[7]);
}

}  // namespace bs::cuda
