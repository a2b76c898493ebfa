// Inline FP32 vector helpers for the FAST kernels. Reductions keep 8 independent partial sums so
// the compiler can vectorise them without -ffast-math (a single running float sum is a serial
// dependency it may not reorder).
#pragma once

#include <cmath>
#include <cstdint>

namespace kev::cpu {

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float sum_squares(const float* a, int64_t n) { return dot(a, a, n); }

inline float sigmoid(float x) {
  // Both branches evaluate exp of a non-positive number, so neither overflows.
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

inline double sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

inline float silu(float x) { return x * sigmoid(x); }
inline double silu(double x) { return x * sigmoid(x); }

// ln(1 + e^x) = max(x, 0) + ln(1 + e^-|x|): no overflow for large x, no loss for very negative x.
inline float softplus(float x) { return std::fmax(x, 0.0f) + std::log1p(std::exp(-std::fabs(x))); }
inline double softplus(double x) { return std::fmax(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

}  // namespace kev::cpu
