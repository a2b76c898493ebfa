// Scalar and bulk conversions between FP32 and the 16-bit float formats found in checkpoints:
// bfloat16 (1-8-7) and IEEE half (1-5-10).
//
//   uint16_t b = kev::f32_to_bf16(1.5f);   // round to nearest, ties to even
//   float f = kev::bf16_to_f32(b);         // exact
//
// Contracts: widening (bf16/f16 -> f32) is exact for every input, including subnormals, infinities
// and NaN payloads. Narrowing rounds to nearest, ties to even; finite values too large for the target
// become infinity; NaN stays NaN (its sign and, where it fits, its payload are kept, with the quiet bit
// set so that truncating a signalling NaN's payload can never turn it into an infinity).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace kev {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even; a carry into the
  // exponent is the correct result (including rounding the largest finite values up to infinity).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal half: shift the mantissa up until its leading one becomes the implicit bit.
  uint32_t e = 113u;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // with the implicit bit
  int32_t shift;                                  // bits of the 24-bit mantissa dropped
  uint32_t biased;
  if (exp >= -14) {
    shift = 13;
    biased = static_cast<uint32_t>(exp + 15);
  } else {
    if (exp < -25) return sign;  // below half the smallest subnormal: rounds to zero
    shift = -exp - 1;            // 14..24: subnormal result
    biased = 0;
  }
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rest = mant & ((1u << shift) - 1u);
  mant >>= shift;
  if (rest > half || (rest == half && (mant & 1u))) ++mant;
  // For normals the implicit bit lands in the exponent field (hence biased - 1 below); a mantissa
  // carry from rounding bumps the exponent, which is again the correct encoding.
  const uint32_t bits = biased == 0 ? mant : ((biased - 1u) << 10) + mant;
  return static_cast<uint16_t>(sign | bits);
}

inline void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
inline void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
inline void f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
inline void f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

}  // namespace kev
