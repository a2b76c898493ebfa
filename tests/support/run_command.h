// Runs a shell command and returns its exit code and its output (stdout and stderr together), for the
// tests that check a built program's behaviour from outside. Header-only: any test program includes it.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace kev::test_support {

struct CommandRun {
  int exit_code = -1;  // -1: the command could not be started or did not exit normally
  std::string output;
};

inline CommandRun run_command(const std::string& command) {
  CommandRun r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A kev program, quoted for the shell: the one beside this test program where there is one (the GPU
// machine's bundle puts every program in one bin/), else the one in this build's tools/ folder.
inline std::string built_tool(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path beside = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / name;
  const std::string path = !ec && std::filesystem::exists(beside, ec) ? beside.string()
                                                                     : std::string(KEV_BUILD_DIR) + "/tools/" + name;
  return "'" + path + "'";
}

}  // namespace kev::test_support
