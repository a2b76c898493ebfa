// Op-test harness after ggml's test-backend-ops: every case runs one Backend op on a backend under
// test and on the CPU backend in reference mode (plain loops, double accumulation) from identical
// random inputs, and compares.
//
//   OpCase c = ...;                                  // op, parameter string, operands, tolerance, call
//   CaseReport r = run_case(c, *fast, *reference);
//   EXPECT_TRUE(r.ok) << r.message;                  // message starts with OP(params)
//
// Per case the harness:
// - fills every operand from its initialiser (deterministic: the RNG is seeded from the case label),
//   in a buffer of its own with 256-byte guard regions before and after it; an operand with
//   pad_front/pad_back is a strided view of a wider parent (like q inside a [n,H,2·hd] projection),
//   so the gaps between its rows are guarded too. Guards, gaps and the initial contents of outputs
//   hold a NaN bit pattern, so an element the op forgets to write fails the NaN/Inf check;
// - asks supports() first (an unsupported case is reported, never passed);
// - runs the op on both backends, then checks that inputs are bit-identical to what was uploaded
//   (read-only state really is read-only), that no guard or gap byte changed, that outputs are
//   finite, and that each output's NMSE = Σ(x−ref)²/Σref² is within the case's max_nmse; it also
//   reports the max absolute error.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace kev::optest {

using Rng = std::mt19937_64;

// Fills `values` (the operand's logical elements, row-major over `shape`). Integers are stored as
// their double value; BF16 operands are rounded when uploaded.
using InitFn = std::function<void(Rng& rng, const std::vector<int64_t>& shape, std::vector<double>& values)>;

enum class Role { In, Out, InOut };

struct ArgSpec {
  std::string name;
  Role role = Role::In;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // empty: an absent optional operand (passed as an empty Tensor)
  InitFn init;                 // inputs and in-out operands only
  int64_t pad_front = 0;       // elements before / after each innermost row in the parent
  int64_t pad_back = 0;
};

struct OpCase {
  using RunFn = std::function<Status(Backend&, const std::vector<Tensor>&)>;
  OpCase(OpKind kind, std::string params, std::vector<ArgSpec> args, double max_nmse, RunFn run)
      : kind(kind), params(std::move(params)), args(std::move(args)), max_nmse(max_nmse), run(std::move(run)) {}

  OpKind kind;
  std::string params;         // "n=64,d=1024"
  std::vector<ArgSpec> args;  // in the op's operand order, outputs last (as in OpDesc)
  double max_nmse = 1e-7;
  // Calls the backend method with the case's scalars and layout. Operands as built from `args`.
  RunFn run;
  // The OpDesc operands supports() is asked about, from the same tensors; unset: `args` as they are.
  // In-place cases pass one operand twice (e.g. rms_norm's x as out).
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> desc;

  std::string label() const;  // "op(params)"
};

struct CaseReport {
  bool supported = true;
  bool ok = false;
  std::string message;  // "OP(params): ..." one line per problem, plus per-output error figures
};

CaseReport run_case(const OpCase& c, Backend& under_test, Backend& reference);

// ---- initialisers ---------------------------------------------------------------------------------
InitFn normal(double mean = 0.0, double stddev = 1.0);
InitFn uniform(double lo, double hi);
// Each innermost row ~ N(0,1) then scaled to L2 norm `norm` (q, k after the model's l2_norm).
InitFn l2_rows(double norm = 1.0);
// GDN log decay: −softplus(N(0,1)) · exp(N(0, 0.5)), always < 0.
InitFn log_decay();
// Mostly weak decay (g in [-0.1, -0.001]) with 5% spikes down to -1000: large cumulative decays
// followed by small steps, which a float-accumulated Γ would get wrong.
InitFn spiky_log_decay();
// Integers uniform in [0, limit).
InitFn indices(int64_t limit);
// Fixed values, cycled.
InitFn constant(double value);

// ---- case-building helpers ------------------------------------------------------------------------
ArgSpec in(std::string name, std::vector<int64_t> shape, InitFn init, DType dtype = DType::F32);
ArgSpec out(std::string name, std::vector<int64_t> shape, DType dtype = DType::F32);
ArgSpec absent(std::string name);
// `a` as a strided view: pad elements before/after each innermost row.
ArgSpec padded(ArgSpec a, int64_t front, int64_t back);

// SeqLayout from sequence lengths.
SeqLayout layout_of(const std::vector<int64_t>& lengths, int64_t pos0, bool from_prefix);
std::string lengths_str(const std::vector<int64_t>& lengths);  // "1+7+64"

// A gated_delta_rule case with q, k L2-normalised (q scaled by 1/sqrt(dk)), natural log decays, β in
// [0, 1), state_in when `prefix`; q and k views of wider rows when qk_pad > 0. Its name is `tag`
// followed by the shape and the sequences.
struct GdnShape {
  int64_t Hk, Hv, dk, dv;
};
OpCase gdn_case(const std::string& tag, GdnShape s, const std::vector<int64_t>& seqs, bool prefix, bool state_out,
                int64_t qk_pad = 0);

// A causal_conv1d_silu case: x [Σ seqs, C] (a view when x_pad > 0), w [C, K], state_in when `prefix`.
OpCase conv_case(int64_t C, int64_t K, const std::vector<int64_t>& seqs, bool prefix, bool state_out, int64_t x_pad);

// Every case of the op tables (op_cases_support.cpp).
const std::vector<OpCase>& all_op_cases();

}  // namespace kev::optest
