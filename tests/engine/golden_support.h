// Shared by the golden parity tests of every backend (golden_test.cpp: CPU against HF; the GPU
// backends' parity tests: against HF and against the CPU path). Fixture: tests/fixtures/golden
// (docs/golden.md).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "kev/kev.h"

namespace kev::golden {

using json = nlohmann::ordered_json;  // request bodies keep their key order

std::string golden_dir();  // tests/fixtures/golden
json read_json(const std::string& path);

// An exported copy of an upstream-layout fixture in a temporary directory, removed on destruction.
struct ExportedModel {
  std::string dir;
  ExportedModel(const std::string& checkpoint, const std::string& base, const std::string& name);
  ExportedModel(const ExportedModel&) = delete;
  ExportedModel& operator=(const ExportedModel&) = delete;
  ~ExportedModel();
};

// Runs every request of an expected.json through the engine (checking the encoding on the way);
// returns the worst |Δp| and |Δlogit| against the fixture.
void check_requests(Engine& engine, const json& expected, double* worst_p, double* worst_z);

// The same exported model on `backend` and on the CPU: the reused state after each request's state
// pass (read back from both) and the logits of each request's questions.
struct BackendDiff {
  double logits = 0, conv = 0, recurrent = 0, k = 0, v = 0;
};
Result<BackendDiff> compare_with_cpu(const std::string& model_dir, const std::string& backend, const json& expected);

}  // namespace kev::golden
