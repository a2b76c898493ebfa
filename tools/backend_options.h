// The command-line flags that choose and tune the backend, shared by the tools that run a model
// (kev_runner, kev_benchmark, kev_server), so they spell and document them identically.
#pragma once

#include <CLI/CLI.hpp>

#include "kev/kev.h"

namespace kev::tools {

inline void add_backend_options(CLI::App& app, Options& options) {
  app.add_option("--backend", options.backend, "cpu, cuda or webgpu")->default_val("cpu");
  app.add_option("--threads", options.threads, "CPU threads of the model (0 = all cores)");
  app.add_option("--device", options.device, "CUDA device ordinal");
  app.add_flag("!--no-cuda-graphs", options.cuda_graphs, "CUDA: launch every kernel instead of replaying graphs");
  app.add_option("--cuda-gemm", options.cuda_gemm,
                 "CUDA, bf16 exports: GEMM operands f16 (weights converted at load, x row-scaled to FP16), "
                 "bf16x2 (x as two BF16 halves) or bf16 (x rounded)")
      ->check(CLI::IsMember({"f16", "bf16x2", "bf16"}));
  app.add_flag("--reserve-memory,!--no-reserve-memory", options.reserve_memory,
               "take the device memory the limits can need at load (runs their largest passes once)");
  app.add_option("--adapter", options.adapter, "WebGPU adapter: name substring or type (discrete, integrated, cpu)");
}

}  // namespace kev::tools
