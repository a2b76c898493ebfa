// OpTimeTable, the per-op table of the GPU backends' traces: sums per label, largest total first,
// calls, mean and share of the pass.
#include "backend/op_time_table.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace kev {
namespace {

std::string printed(const OpTimeTable& t, const std::string& header, const char* note) {
  std::FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  t.print(f, header, note);
  std::rewind(f);
  std::string s;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f)) s += buf;
  std::fclose(f);
  return s;
}

TEST(OpTimeTable, SumsPerLabelLargestFirst) {
  OpTimeTable t;
  t.add("swiglu", 0.010);
  t.add("matmul n=220", 0.030);
  t.add("swiglu", 0.020);
  t.add("matmul n=220", 0.040);
  t.add("add", 0.0);
  EXPECT_DOUBLE_EQ(t.total_ms(), 0.100);
  const std::string s = printed(t, "pass 3 ops: 5 commands", "back to back");
  EXPECT_EQ(s.rfind("pass 3 ops: 5 commands, GPU 0.100 ms back to back\n", 0), 0u) << s;
  const size_t matmul = s.find("  matmul n=220"), swiglu = s.find("  swiglu"), add = s.find("  add");
  ASSERT_NE(matmul, std::string::npos) << s;
  ASSERT_NE(swiglu, std::string::npos) << s;
  ASSERT_NE(add, std::string::npos) << s;
  EXPECT_LT(matmul, swiglu);
  EXPECT_LT(swiglu, add);
  // 2 calls of 35 us = 70 us, 70 % of the pass; 2 of 15 us = 30 us, 30 %.
  EXPECT_NE(s.find("2 x     35.0 us =     70.0 us   70.0%"), std::string::npos) << s;
  EXPECT_NE(s.find("2 x     15.0 us =     30.0 us   30.0%"), std::string::npos) << s;
  EXPECT_NE(s.find("1 x      0.0 us =      0.0 us    0.0%"), std::string::npos) << s;
}

TEST(OpTimeTable, EmptyPassPrintsOnlyTheHeader) {
  const std::string s = printed(OpTimeTable{}, "pass 1 ops: 0 dispatches", "in the timed dispatches");
  EXPECT_EQ(s, "pass 1 ops: 0 dispatches, GPU 0.000 ms in the timed dispatches\n");
}

}  // namespace
}  // namespace kev
