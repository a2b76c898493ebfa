// The kev_server program's queue flags, and kev_benchmark's run counts: out-of-range values are usage
// errors (exit 2) naming the flag and its range, and --help lists them. Runs the built programs
// (tests/CMakeLists.txt makes the server tests depend on them).
#include <string>

#include <gtest/gtest.h>

#include "support/run_command.h"

namespace {

using kev::test_support::CommandRun;

CommandRun run_tool(const std::string& tool, const std::string& args) {
  return kev::test_support::run_command(kev::test_support::built_tool(tool) + " " + args);
}

TEST(KevServerFlags, QueueFlagsAreValidatedAndDocumented) {
  const CommandRun help = run_tool("kev_server", "--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("--max-queue"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--queue-timeout-ms"), std::string::npos) << help.output;

  // Parsing happens before the model is opened, so a missing model directory does not matter here.
  const CommandRun no_queue = run_tool("kev_server", "--model /nonexistent --max-queue 0");
  EXPECT_EQ(no_queue.exit_code, 2) << no_queue.output;
  EXPECT_NE(no_queue.output.find("--max-queue: Value 0 not in range 1 to 1048576"), std::string::npos)
      << no_queue.output;
  const CommandRun negative = run_tool("kev_server", "--model /nonexistent --queue-timeout-ms -1");
  EXPECT_EQ(negative.exit_code, 2) << negative.output;
  EXPECT_NE(negative.output.find("--queue-timeout-ms: Value -1 not in range 0 to 3600000"), std::string::npos)
      << negative.output;
  const CommandRun not_a_number = run_tool("kev_server", "--model /nonexistent --max-queue many");
  EXPECT_EQ(not_a_number.exit_code, 2) << not_a_number.output;

  // In-range values pass parsing; the run then fails on the model (exit 1), not on the flags.
  const CommandRun in_range = run_tool("kev_server", "--model /nonexistent --max-queue 1 --queue-timeout-ms 3600000");
  EXPECT_EQ(in_range.exit_code, 1) << in_range.output;
  EXPECT_EQ(in_range.output.find("not in range"), std::string::npos) << in_range.output;
}

// --runs 0 used to crash the report (a median of no runs); --warmups takes 0.
TEST(KevBenchmarkFlags, RunCountsAreValidated) {
  const CommandRun no_runs = run_tool("kev_benchmark", "--model /nonexistent --runs 0");
  EXPECT_EQ(no_runs.exit_code, 2) << no_runs.output;
  EXPECT_NE(no_runs.output.find("--runs: Value 0 not in range 1 to 100000"), std::string::npos) << no_runs.output;
  const CommandRun negative = run_tool("kev_benchmark", "--model /nonexistent --warmups -1");
  EXPECT_EQ(negative.exit_code, 2) << negative.output;
  EXPECT_NE(negative.output.find("--warmups: Value -1 not in range 0 to 100000"), std::string::npos)
      << negative.output;
  // In range: parsing passes and the run fails on the model (exit 1).
  const CommandRun in_range = run_tool("kev_benchmark", "--model /nonexistent --runs 1 --warmups 0");
  EXPECT_EQ(in_range.exit_code, 1) << in_range.output;
  EXPECT_EQ(in_range.output.find("not in range"), std::string::npos) << in_range.output;
}

}  // namespace
