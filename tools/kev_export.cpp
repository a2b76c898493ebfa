// kev_export: writes an exported Kev model directory (model.json + weights.safetensors + tokenizer.json)
// from an upstream checkpoint or as a synthetic model, then prints the target backend's op audit.
//   kev_export --checkpoint DIR [--base DIR] --out DIR [--backend cpu|cuda|webgpu] [--dtype fp32|bf16]
//              [--max-prefix N] [--max-context N] [--max-questions N] [--lora-scale S] [--audit-only]
//   kev_export --synthetic tiny|0.8b|4b|9b [--seed N] [--dtype fp32|bf16] [--backend cpu|cuda|webgpu]
//              [--tokenizer tokenizer.json] --out DIR
// --dtype defaults to bf16 for cuda and fp32 otherwise. docs/model-format.md describes the output.
// Exit codes: 0 success, 1 error (one line on stderr), 2 usage, 3 written but the audit found ops the
// backend does not support.
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "common/check.h"
#include "model/audit.h"
#include "model/checkpoint_import.h"
#include "model/model_file.h"
#include "model/synthetic.h"

namespace {

// 10822656 -> "10,822,656".
std::string grouped(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// KEV_SPEC.md §1: LoRA parameter totals of the released checkpoints (r = 16 on every projection).
const char* released_kev_with(int64_t lora_parameters) {
  switch (lora_parameters) {
    case 10822656: return "kev-0.8b";
    case 32464896: return "kev-4b";
    case 43278336: return "kev-9b";
    case 116727808: return "kev-27b";
    default: return nullptr;
  }
}

void print_summary(const std::string& dir, const kev::ImportSummary& s) {
  std::cout << "checkpoint " << dir << "\n"
            << "  id:          " << s.checkpoint_id << "\n"
            << "  base:        " << (s.base.empty() ? "(not named in head.pt)" : s.base)
            << (s.base_revision.empty() ? "" : " @ " + s.base_revision) << "\n"
            << "  temperature: " << s.temperature << "\n"
            << "  weights:     " << s.weights << "\n";
  if (s.lora_rank == 0) {
    std::cout << "  LoRA:        none merged\n";
    return;
  }
  std::string modules;
  for (const auto& [name, count] : s.merged_by_module) {
    modules += kev::cat(modules.empty() ? "" : ", ", name, " ", count);
  }
  std::cout << "  LoRA:        rank " << s.lora_rank << ", merge scale " << s.lora_scale << "\n"
            << "  merged:      " << s.lora_modules << " modules (" << modules << ")\n"
            << "  LoRA params: " << grouped(s.lora_parameters);
  if (s.lora_parameters == s.lora_parameters_all) {
    std::cout << " (every projection adapted";
  } else {
    std::cout << " (" << grouped(s.lora_parameters_all) << " if every projection were adapted";
  }
  const char* released = released_kev_with(s.lora_parameters);
  std::cout << (released ? kev::cat("; equals ", released, "'s total in KEV_SPEC.md") : std::string()) << ")\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kev_export: write an exported Kev model directory"};
  std::string checkpoint, kind, dtype, backend = "cpu", out_dir;
  kev::ImportOptions imp;
  kev::SyntheticOptions syn;
  bool audit_only = false;
  auto* ck_opt =
      app.add_option("--checkpoint", checkpoint, "upstream Kev checkpoint directory (head.pt + adapter or weights)");
  auto* syn_opt = app.add_option("--synthetic", kind, "synthetic model with random weights: tiny, 0.8b, 4b, 9b");
  ck_opt->excludes(syn_opt);
  app.add_option("--base", imp.base_dir, "HF directory of the base model head.pt names (not needed for full weights)")
      ->needs(ck_opt);
  app.add_option("--out", out_dir, "output directory");
  app.add_option("--backend", backend, "backend the export is meant for and audited against: cpu, cuda, webgpu")
      ->default_val("cpu");
  app.add_option("--dtype", dtype, "backbone weight dtype: fp32 or bf16 (default: bf16 for cuda, else fp32)");
  app.add_option("--max-prefix", imp.limits.max_prefix, "state token limit recorded in model.json")->needs(ck_opt);
  app.add_option("--max-context", imp.limits.max_context, "state + row token limit recorded in model.json")
      ->needs(ck_opt);
  app.add_option("--max-questions", imp.limits.max_questions, "questions per pass (0 = only the token budget)")
      ->needs(ck_opt);
  app.add_option("--lora-scale", imp.lora_scale, "LoRA user scale s (upstream KEV_LORA_SCALE)")->needs(ck_opt);
  app.add_flag("--audit-only", audit_only, "check the checkpoint and print the op audit; write nothing")->needs(ck_opt);
  app.add_option("--seed", syn.seed, "random seed (synthetic)")->default_val(0)->needs(syn_opt);
  app.add_option("--tokenizer", syn.tokenizer_path, "tokenizer.json to ship (synthetic)")
      ->default_val(KEV_DEFAULT_TOKENIZER)
      ->needs(syn_opt);
  try {
    app.parse(argc, argv);
    if (checkpoint.empty() == kind.empty()) {
      throw CLI::ValidationError("give exactly one of --checkpoint and --synthetic");
    }
    if (out_dir.empty() && !audit_only) throw CLI::RequiredError("--out");
    if (!dtype.empty() && dtype != "fp32" && dtype != "bf16") throw CLI::ValidationError("--dtype", "fp32 or bf16");
    if (const kev::Status st = kev::validate_limits(imp.limits); !st.ok()) {
      throw CLI::ValidationError("limits", st.message());
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (dtype.empty()) dtype = kev::default_export_dtype(backend);

  int last_pct = -1;
  auto progress = [&](uint64_t done, uint64_t total) {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (pct / 5 != last_pct / 5) {
      std::fprintf(stderr, "\rwriting weights: %3d%% (%.1f / %.1f MiB)", pct, done / 1048576.0, total / 1048576.0);
      last_pct = pct;
    }
  };
  auto fail = [](const kev::Status& st) {
    std::cerr << "kev_export: " << st.to_string() << "\n";
    return 1;
  };

  kev::ModelConfig config;
  int64_t pointer_dim = 0;
  kev::Limits limits = imp.limits;
  if (!checkpoint.empty()) {
    auto ck = kev::open_checkpoint(checkpoint, imp.base_dir, imp.lora_scale);
    if (!ck.ok()) return fail(ck.status());
    print_summary(checkpoint, ck->summary);
    config = ck->config;
    pointer_dim = ck->meta.pointer_dim;
    if (!audit_only) {
      imp.checkpoint_dir = checkpoint;
      imp.out_dir = out_dir;
      imp.dtype = dtype;
      imp.backend = backend;
      imp.progress = progress;
      const kev::Status st = kev::write_exported_model(*ck, imp);
      std::fprintf(stderr, "\n");
      if (!st.ok()) return fail(st);
      std::cout << "wrote " << out_dir << " (" << dtype << ", for " << backend << ")\n";
    }
  } else {
    syn.kind = kind;
    syn.dtype = dtype;
    syn.backend = backend;
    syn.out_dir = out_dir;
    syn.progress = progress;
    const kev::Status st = kev::write_synthetic_model(syn);
    std::fprintf(stderr, "\n");
    if (!st.ok()) return fail(st);
    std::cout << "wrote synthetic " << kind << " (" << dtype << ", seed " << syn.seed << ") to " << out_dir << "\n";
    auto model = kev::read_model_file(out_dir);
    if (!model.ok()) return fail(model.status());
    config = model->config;
    pointer_dim = model->kev.pointer_dim;
    limits = model->kev.limits;
  }

  auto audit = kev::audit_ops(config, pointer_dim, dtype, backend, kev::AuditShape::for_limits(limits));
  if (!audit.ok()) return fail(audit.status());
  std::cout << kev::format_audit(*audit);
  return audit->unsupported() > 0 ? 3 : 0;
}
