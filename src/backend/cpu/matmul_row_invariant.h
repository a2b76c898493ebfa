// A row-invariant FP32 GEMM for the CPU backend's matmul: out[i,j] = Σ_l x[i,l]·w[j,l] (+ bias[j]).
//
//   gemm_row_invariant(pool, {n, k, m, x, ldx, w, bias, out, ldo});
//
// Contract: every output element is produced by the same sequence of floating-point operations
// whatever n is, wherever its row sits in x, and however the pool splits the work, so a row's result
// is bit-identical whether it is computed alone or packed with other rows (the engine's "questions
// together == questions alone"). The sequence is fixed per machine: the AVX2+FMA path (chosen at
// run time when the CPU has it) and the portable path give different bits, each deterministic.
// Layouts: x [n,k] rows ldx apart (ldx >= k when n > 1), w [m,k] contiguous, bias [m] or null,
// out [n,m] rows ldo apart; out must not overlap the inputs. Any k >= 0 (k = 0 gives bias or 0).
#pragma once

#include <cstdint>

#include "backend/cpu/thread_pool.h"

namespace kev::cpu {

struct GemmProblem {
  int64_t n = 0, k = 0, m = 0;
  const float* x = nullptr;
  int64_t ldx = 0;
  const float* w = nullptr;
  const float* bias = nullptr;  // null: no bias
  float* out = nullptr;
  int64_t ldo = 0;
};

enum class GemmIsa {
  Best,      // AVX2+FMA when the CPU supports it, else portable
  Portable,  // plain C++ (tests force it to check the fallback's invariance on AVX2 machines)
};

void gemm_row_invariant(ThreadPool& pool, const GemmProblem& p, GemmIsa isa = GemmIsa::Best);

// "avx2+fma" or "portable": the path GemmIsa::Best takes on this CPU.
const char* gemm_row_invariant_isa();

}  // namespace kev::cpu
