// The per-token part of backend/logit_rules.h that device code shares (C++17, no std::span):
// a rule's token entry and the rule itself, so the CPU backend and the CUDA kernel compute one
// formula.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define BS_HOST_DEVICE __host__ __device__
#else
#define BS_HOST_DEVICE
#endif

namespace bs::sampling {

// A token the rules name: generated before the block (count > 0), in the prompt (only listed
// when rep != 1), biased, or a stop token (only listed while stop_rows > 0).
struct TokenRule {
  int32_t token = 0;
  int32_t count = 0;  // occurrences in G
  float bias = 0.0f;
  uint8_t in_prompt = 0;
  uint8_t stop = 0;
  uint8_t pad[2] = {0, 0};
};

// a * b rounded on its own: device code would otherwise fuse it with a following add (FMA),
// and the CPU's and the GPU's results would differ in the last bit.
BS_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// The rule for one token of row r (backend/logit_rules.h); `count` is c.
BS_HOST_DEVICE inline float rule_logit(float x, int32_t count, float bias, bool in_prompt,
                                       bool forbidden, float repetition, float frequency,
                                       float presence) {
  if (forbidden) return -INFINITY;
  x += bias;
  if (repetition != 1.0f && (in_prompt || count > 0)) {
    x = x > 0.0f ? x / repetition : mul_rn(x, repetition);
  }
  return x - (mul_rn(frequency, static_cast<float>(count)) + (count > 0 ? presence : 0.0f));
}

}  // namespace bs::sampling
