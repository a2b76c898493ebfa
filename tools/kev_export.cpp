// kev_export: writes an exported Kev model directory (model.json + weights.safetensors + tokenizer.json).
//   kev_export --synthetic tiny|0.8b|4b|9b [--seed N] [--dtype fp32|bf16] [--backend cpu|cuda|webgpu]
//              [--tokenizer tokenizer.json] --out DIR
// Exit codes: 0 success, 1 error (one line on stderr), 2 usage.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "model/synthetic.h"

int main(int argc, char** argv) {
  CLI::App app{"kev_export: write an exported Kev model directory"};
  kev::SyntheticOptions opt;
  std::string kind;
  std::string dtype;
  app.add_option("--synthetic", kind, "synthetic model with random weights: tiny, 0.8b, 4b, 9b")->required();
  app.add_option("--seed", opt.seed, "random seed")->default_val(0);
  app.add_option("--dtype", dtype, "backbone weight dtype: fp32 or bf16 (default: bf16 for cuda, else fp32)");
  app.add_option("--backend", opt.backend, "backend the export is meant for: cpu, cuda, webgpu")->default_val("cpu");
  app.add_option("--tokenizer", opt.tokenizer_path, "tokenizer.json to ship")->default_val(KEV_DEFAULT_TOKENIZER);
  app.add_option("--out", opt.out_dir, "output directory")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  opt.kind = kind;
  opt.dtype = !dtype.empty() ? dtype : opt.backend == "cuda" ? "bf16" : "fp32";
  int last_pct = -1;
  opt.progress = [&](uint64_t done, uint64_t total) {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (pct / 5 != last_pct / 5) {
      std::fprintf(stderr, "\rwriting weights: %3d%% (%.1f / %.1f MiB)", pct, done / 1048576.0, total / 1048576.0);
      last_pct = pct;
    }
  };
  const kev::Status st = kev::write_synthetic_model(opt);
  std::fprintf(stderr, "\n");
  if (!st.ok()) {
    std::cerr << "kev_export: " << st.to_string() << "\n";
    return 1;
  }
  std::cout << "wrote synthetic " << kind << " (" << opt.dtype << ", seed " << opt.seed << ") to " << opt.out_dir << "\n";
  return 0;
}
