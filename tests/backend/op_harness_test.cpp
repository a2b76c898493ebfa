// Runs every op case of the tables (op_cases_support.cpp) on the CPU backend in FAST mode against
// the CPU backend in REFERENCE mode. One gtest per case, named <op>_<index>; failures print
// OP(params). Rerun one op with --gtest_filter='Cpu/OpFastVsReference.Matches/gated_delta_rule*'.
#include "backend/op_harness.h"

#include <gtest/gtest.h>

#include <cctype>
#include <iostream>
#include <set>

namespace kev::optest {
namespace {

Backend& backend(bool reference) {
  static std::shared_ptr<Backend> fast, ref;
  std::shared_ptr<Backend>& b = reference ? ref : fast;
  if (!b) {
    BackendOptions o;
    o.reference_mode = reference;
    auto r = create_backend("cpu", o);
    if (!r.ok()) {
      ADD_FAILURE() << r.status().to_string();
      std::abort();
    }
    b = r.value();
  }
  return *b;
}

class OpFastVsReference : public ::testing::TestWithParam<size_t> {};

TEST_P(OpFastVsReference, Matches) {
  const OpCase& c = all_op_cases()[GetParam()];
  const CaseReport r = run_case(c, backend(false), backend(true));
  ASSERT_TRUE(r.supported) << r.message;
  EXPECT_TRUE(r.ok) << r.message;
  std::cout << r.message;
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  return std::string(op_name(all_op_cases()[info.param].kind)) + "_" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(Cpu, OpFastVsReference, ::testing::Range<size_t>(0, all_op_cases().size()), case_name);

// Coverage: every op of the interface has at least one case.
TEST(OpCases, CoverEveryOp) {
  std::set<OpKind> seen;
  for (const OpCase& c : all_op_cases()) seen.insert(c.kind);
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    EXPECT_TRUE(seen.count(static_cast<OpKind>(k))) << "no op case for " << op_name(static_cast<OpKind>(k));
  }
}

}  // namespace
}  // namespace kev::optest
