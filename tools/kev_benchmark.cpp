// kev_benchmark: latency of the Kev workflow, ExecuTorch-example protocol.
//   kev_benchmark --model DIR [--backend cpu|cuda|webgpu] [--workload demo|short|long|many | --request F.json]
//                 [--warmups 2] [--runs 5] [--threads N] [--profile] [--gemm-peak] [--json]
// Protocol: load once (not timed); then warm-ups and timed runs. Each run = prefill(state), then
// evaluate() on that prefix (the demo workload splits its 3 questions into 2 calls, as the ExecuTorch
// example does); then the same through prefill_and_evaluate() (the state pass fused with the first
// call's first score pass; system_one's path) and evaluate() for any further calls. Timing includes
// tokenisation, the passes, waiting for the device and the answer maths; it excludes loading. Reports
// medians of prefill, cached evaluation (all calls of a run), prefill + evaluation (median of per-run
// totals) and the fused prefill + evaluation, plus tokens/s.
// --profile: a separate profiled run (every op synchronised and timed) gives the share of time per op.
// --gemm-peak: OpenBLAS sgemm throughput measured in the same process, the CPU baseline for GEMM.
// --ceilings: the backend's own matmul rate (4096³ in the model's weight dtype) and copy bandwidth,
// measured through the Backend interface in the same process; each pass's achieved FLOP rate and
// weight bandwidth are then also reported as a share of them. Pass FLOPs are counted from the model
// shape: 2·(projection parameters)·tokens + causal attention (4·H·hd per query-key pair).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>

#include <cblas.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/check.h"
#include "engine/backend_options.h"
#include "io/json_util.h"
#include "backend_options.h"
#include "kev/kev.h"
#include "model/model_file.h"
#include "model/weights.h"
#include "text/demo.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

int fail(const kev::Status& st) {
  std::cerr << "kev_benchmark: " << st.to_string() << "\n";
  return 1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// A deterministic support-ticket state of about `target` tokens (delimiter included).
kev::Result<std::string> make_state(const kev::Tokenizer& tok, int64_t target) {
  static const char* kSentences[] = {
      "Customer 4411 reports that the March invoice was charged twice to the same card.",
      "The first charge posted on March 3 and the second on March 4, both for 129.00 EUR.",
      "They contacted support by email and later by phone, and were promised a callback.",
      "No callback happened, and the customer now asks for the duplicate to be refunded.",
      "Their account is on the Team plan with 14 seats and annual billing since 2023.",
      "Earlier tickets mention an outage of the export API that lasted about two hours.",
      "The customer says they may move to a competitor if this is not resolved this week.",
      "Logs show two payment intents created 31 seconds apart from the same browser session.",
  };
  std::string text;
  for (size_t i = 0;; ++i) {
    const std::string next = text + (text.empty() ? "" : " ") + kSentences[i % 8];
    auto ids = tok.encode(next);
    if (!ids) return ids.status();
    if (static_cast<int64_t>(ids->size()) + 1 > target) return text;
    text = next;
  }
}

kev::Question make_question(size_t i) {
  switch (i % 3) {
    case 0:
      return {"q" + std::to_string(i), kev::Noul{"Does the customer explicitly ask for a refund of the duplicate charge?",
                                                  "No refund is requested.", "A refund is requested."}};
    case 1:
      return {"q" + std::to_string(i),
              kev::Choice{"Which team should handle this ticket?",
                          {{"billing", "Payments, invoices, and refunds"},
                           {"technical", "Bugs, outages, and integrations"},
                           {"sales", "Pricing, upgrades, and new accounts"},
                           {"retention", "Customers at risk of leaving"}}}};
    default:
      return {"q" + std::to_string(i), kev::Score{"How urgent is this ticket?",
                                                  {"Not urgent", "Somewhat urgent", "Urgent", "Critical"}}};
  }
}

struct Workload {
  std::string name;
  std::string state;
  std::vector<kev::Questions> calls;  // evaluate() calls per run
};

kev::Result<Workload> make_workload(const std::string& name, const kev::Tokenizer& tok) {
  Workload w{name, {}, {}};
  if (name == "demo") {
    kev::Request r = kev::default_demo_request();
    w.state = r.state_text;
    w.calls = {{r.questions[0], r.questions[1]}, {r.questions[2]}};
    return w;
  }
  int64_t tokens = 0;
  size_t n_questions = 0;
  if (name == "short") tokens = 256, n_questions = 6;
  else if (name == "long") tokens = 2200, n_questions = 5;
  else if (name == "many") tokens = 1024, n_questions = 64;
  else return kev::Status(kev::ErrorCode::InvalidRequest, "unknown workload '" + name + "'; choose demo, short, long, many");
  auto state = make_state(tok, tokens);
  if (!state) return state.status();
  w.state = *state;
  kev::Questions qs;
  for (size_t i = 0; i < n_questions; ++i) qs.push_back(make_question(i));
  w.calls = {qs};
  return w;
}

double sgemm_gflops(int m, int n, int k, double seconds_budget) {
  std::vector<float> a(static_cast<size_t>(m) * k, 0.01f), b(static_cast<size_t>(n) * k, 0.02f), c(static_cast<size_t>(m) * n);
  auto once = [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n); };
  once();
  int reps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds_budget || reps < 3) {
    once();
    ++reps;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return 2.0 * m * n * k * reps / elapsed * 1e-9;
}

// Ceilings measured through the backend's own ops (the same kernels the model uses).
struct Ceilings {
  double matmul_tflops = 0;  // out[n,m] = x[n,k]·W[m,k]ᵀ at n = m = k = 4096
  double copy_gbps = 0;      // F32 copy, bytes read + written per second
};

kev::Result<double> time_op(kev::Backend& b, const std::function<kev::Status()>& op, double budget_s) {
  KEV_TRY(op());
  KEV_TRY(b.synchronize());
  int reps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (elapsed < budget_s || reps < 3) {
    KEV_TRY(op());
    KEV_TRY(b.synchronize());
    ++reps;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return elapsed / reps;
}

kev::Result<Ceilings> measure_ceilings(const kev::Options& options, const kev::ModelFile& model) {
  KEV_ASSIGN_OR_RETURN(kev::BackendOptions bo, kev::backend_options(options));
  KEV_ASSIGN_OR_RETURN(std::shared_ptr<kev::Backend> b, kev::create_backend(options.backend, bo));
  // The projections' dtype on this backend, chosen as the engine's load chooses it.
  const kev::DType weight_dtype = kev::matmul_dtype_for(*b, model.config, model.kev.dtype);
  // The ceiling is the hardware's plain 16-bit GEMM rate: BF16 x for BF16 weights (F16 weights come
  // with their x conversion and row rescale, as in the passes).
  if (weight_dtype == kev::DType::BF16 && bo.cuda_gemm != kev::CudaGemm::BF16) {
    bo.cuda_gemm = kev::CudaGemm::BF16;
    KEV_ASSIGN_OR_RETURN(b, kev::create_backend(options.backend, bo));
  }
  const int64_t n = 4096;
  std::vector<std::shared_ptr<kev::Buffer>> hold;  // keeps the buffers alive while measuring
  auto make = [&](kev::DType dt, std::initializer_list<int64_t> shape) -> kev::Result<kev::Tensor> {
    size_t count = 1;
    for (int64_t d : shape) count *= static_cast<size_t>(d);
    KEV_ASSIGN_OR_RETURN(std::shared_ptr<kev::Buffer> buf, b->alloc(count * kev::dtype_size(dt), kev::BufferUsage::Activations));
    hold.push_back(buf);
    kev::Tensor t = kev::Tensor::contiguous(buf.get(), 0, dt, shape);
    KEV_TRY(b->fill_zero(t));
    return t;
  };
  KEV_ASSIGN_OR_RETURN(kev::Tensor x, make(kev::DType::F32, {n, n}));
  KEV_ASSIGN_OR_RETURN(kev::Tensor w, make(weight_dtype, {n, n}));
  KEV_ASSIGN_OR_RETURN(kev::Tensor y, make(kev::DType::F32, {n, n}));
  Ceilings c;
  const double budget = options.backend == "cpu" ? 2.0 : 0.5;
  KEV_ASSIGN_OR_RETURN(double mm_s, time_op(*b, [&] { return b->matmul(x, w, kev::Tensor(), y); }, budget));
  c.matmul_tflops = 2.0 * n * n * n / mm_s * 1e-12;
  // 128 MiB per operand: past every last-level cache, within every binding limit; rows so that
  // row-parallel copy kernels fill the device.
  const int64_t rows = 8192, cols = 4096, elems = rows * cols;
  KEV_ASSIGN_OR_RETURN(kev::Tensor a, make(kev::DType::F32, {rows, cols}));
  KEV_ASSIGN_OR_RETURN(kev::Tensor o, make(kev::DType::F32, {rows, cols}));
  KEV_ASSIGN_OR_RETURN(double cp_s, time_op(*b, [&] { return b->copy(a, o); }, budget));
  c.copy_gbps = 2.0 * static_cast<double>(elems) * 4 / cp_s * 1e-9;
  return c;
}

// FLOPs and streamed weight bytes of one pass of `tokens` tokens over `context` earlier tokens.
struct PassCost {
  double flops = 0, weight_bytes = 0;
};
PassCost pass_cost(const kev::ModelFile& m, int64_t tokens, int64_t context, int64_t sequences) {
  const kev::ModelConfig& c = m.config;
  double params = 0;
  for (const kev::WeightSpec& spec : kev::weight_specs(c, m.kev.pointer_dim)) {
    if (!spec.projection) continue;
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    params += n;
  }
  int64_t n_attn = 0;
  for (kev::LayerType t : c.layer_types) n_attn += t == kev::LayerType::FullAttention;
  const double per_seq = static_cast<double>(tokens) / static_cast<double>(std::max<int64_t>(sequences, 1));
  const double pairs = static_cast<double>(tokens) * static_cast<double>(context) + sequences * per_seq * (per_seq + 1) / 2;
  PassCost p;
  p.flops = 2.0 * params * static_cast<double>(tokens) + 4.0 * static_cast<double>(c.n_head * c.head_dim) * pairs * n_attn;
  p.weight_bytes = params * (m.kev.dtype == "bf16" ? 2 : 4);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kev_benchmark: Kev latency, ExecuTorch-example protocol"};
  std::string model_dir, workload_name = "demo", request_file;
  kev::Options options;
  int warmups = 2, runs = 5;
  bool profile = false, gemm_peak = false, ceilings = false, json_out = false;
  app.add_option("--model", model_dir, "exported model directory")->required();
  kev::tools::add_backend_options(app, options);
  app.add_option("--workload", workload_name, "demo, short (~256-token state, 6 questions), long (~2,200, 5), many (~1,024, 64)");
  app.add_option("--request", request_file, "a /v1/systemone request body instead of a workload");
  app.add_option("--warmups", warmups, "untimed runs first")->default_val(2)->check(CLI::Range(0, 100000));
  app.add_option("--runs", runs, "timed runs (at least 1: the report gives their median)")
      ->default_val(5)
      ->check(CLI::Range(1, 100000));
  app.add_flag("--profile", profile, "add one profiled run: time per op");
  app.add_flag("--gemm-peak", gemm_peak, "measure OpenBLAS sgemm throughput in the same run (CPU baseline)");
  app.add_flag("--ceilings", ceilings, "measure the backend's matmul and copy ceilings; report each pass against them");
  app.add_flag("--json", json_out, "print results as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto model = kev::read_model_file(model_dir);
  if (!model) return fail(model.status());
  auto tok = kev::Tokenizer::load(model->tokenizer_path());
  if (!tok) return fail(tok.status());
  Workload w;
  if (!request_file.empty()) {
    auto body = kev::read_text_file(request_file);
    if (!body) return fail(body.status());
    auto req = kev::parse_request(*body);
    if (!req) return fail(req.status());
    w = {"request", req->state_text, {req->questions}};
  } else {
    auto made = make_workload(workload_name, *tok);
    if (!made) return fail(made.status());
    w = *made;
  }
  // The workloads exceed the ExecuTorch limits (384/1,024): benchmark under the serving profile.
  options.limits = kev::Limits::serving();
  options.override_limits = true;

  const auto t_load = Clock::now();
  auto engine = kev::Engine::load(model_dir, options);
  if (!engine) return fail(engine.status());
  const double load_ms = ms(t_load, Clock::now());

  std::vector<double> prefill_ms, eval_ms, total_ms, fused_ms;
  int64_t state_tokens = 0, row_tokens = 0;
  size_t n_questions = 0;
  for (const auto& c : w.calls) n_questions += c.size();
  for (int r = 0; r < warmups + runs; ++r) {
    const auto t0 = Clock::now();
    auto prefix = engine->prefill(w.state);
    if (!prefix) return fail(prefix.status());
    const auto t1 = Clock::now();
    int64_t rows = 0;
    for (const kev::Questions& qs : w.calls) {
      auto answers = engine->evaluate(*prefix, qs);
      if (!answers) return fail(answers.status());
      rows += answers->usage.input_tokens - prefix->state_tokens();
    }
    const auto t2 = Clock::now();
    auto fused = engine->prefill_and_evaluate(w.state, w.calls.front());
    if (!fused) return fail(fused.status());
    for (size_t c = 1; c < w.calls.size(); ++c) {
      auto answers = engine->evaluate(fused->prefix, w.calls[c]);
      if (!answers) return fail(answers.status());
    }
    const auto t3 = Clock::now();
    state_tokens = prefix->state_tokens();
    row_tokens = rows;
    if (r >= warmups) {
      prefill_ms.push_back(ms(t0, t1));
      eval_ms.push_back(ms(t1, t2));
      total_ms.push_back(ms(t0, t2));
      fused_ms.push_back(ms(t2, t3));
    }
    std::fprintf(stderr, "\r%s run %d/%d (%s)  ", w.name.c_str(), r + 1, warmups + runs, r < warmups ? "warm-up" : "timed");
  }
  std::fprintf(stderr, "\n");

  std::vector<kev::OpProfile> profile_rows;
  if (profile) {
    kev::Options popts = options;
    popts.profile_ops = true;
    auto pengine = kev::Engine::load(model_dir, popts);
    if (!pengine) return fail(pengine.status());
    std::vector<kev::OpProfile> after_warmup;
    for (int r = 0; r < 2; ++r) {  // the first run warms caches; report the second alone
      auto prefix = pengine->prefill(w.state);
      if (!prefix) return fail(prefix.status());
      for (const kev::Questions& qs : w.calls) {
        auto answers = pengine->evaluate(*prefix, qs);
        if (!answers) return fail(answers.status());
      }
      if (r == 0) after_warmup = pengine->op_profile();
    }
    profile_rows = pengine->op_profile();
    for (kev::OpProfile& op : profile_rows) {
      for (const kev::OpProfile& before : after_warmup) {
        if (before.op != op.op) continue;
        op.calls -= before.calls;
        op.ms -= before.ms;
        op.gflop -= before.gflop;
      }
    }
  }
  double peak = 0;
  if (gemm_peak) peak = sgemm_gflops(1024, 1024, 1024, 1.0);
  Ceilings ceil;
  if (ceilings) {
    auto c = measure_ceilings(options, *model);
    if (!c) return fail(c.status());
    ceil = *c;
  }
  const PassCost prefill_cost = pass_cost(*model, state_tokens, 0, 1);
  const PassCost eval_cost = pass_cost(*model, row_tokens, state_tokens, static_cast<int64_t>(n_questions));

  const double p = median(prefill_ms), e = median(eval_ms), t = median(total_ms), f = median(fused_ms);
  const kev::ModelInfo& info = engine->info();
  if (json_out) {
    nlohmann::ordered_json j;
    j["model"] = info.name;
    j["architecture"] = info.architecture;
    j["backend"] = info.backend;
    j["dtype"] = info.dtype;
    j["workload"] = w.name;
    j["state_tokens"] = state_tokens;
    j["row_tokens"] = row_tokens;
    j["questions"] = n_questions;
    j["warmups"] = warmups;
    j["runs"] = runs;
    j["load_ms"] = load_ms;
    j["prefill_ms"] = p;
    j["cached_evaluation_ms"] = e;
    j["prefill_plus_evaluation_ms"] = t;
    j["fused_prefill_plus_evaluation_ms"] = f;
    j["prefill_tokens_per_s"] = state_tokens / (p * 1e-3);
    j["evaluation_tokens_per_s"] = row_tokens / (e * 1e-3);
    if (gemm_peak) j["openblas_sgemm_1024_gflops"] = peak;
    j["prefill_tflops"] = prefill_cost.flops / (p * 1e-3) * 1e-12;
    j["prefill_weight_gbps"] = prefill_cost.weight_bytes / (p * 1e-3) * 1e-9;
    j["evaluation_tflops"] = eval_cost.flops / (e * 1e-3) * 1e-12;
    j["evaluation_weight_gbps"] = eval_cost.weight_bytes / (e * 1e-3) * 1e-9;
    if (ceilings) {
      j["ceiling_matmul_tflops"] = ceil.matmul_tflops;
      j["ceiling_copy_gbps"] = ceil.copy_gbps;
    }
    for (const kev::OpProfile& op : profile_rows)
      j["profile"].push_back({{"op", op.op}, {"backend", op.backend}, {"calls", op.calls}, {"ms", op.ms}, {"gflop", op.gflop}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("model: %s (%s, %s on %s)\n", info.name.c_str(), info.architecture.c_str(), info.dtype.c_str(), info.backend.c_str());
  std::printf("workload: %s — state %lld tokens, %zu questions in %zu call(s), %lld row tokens; load %.0f ms\n",
              w.name.c_str(), static_cast<long long>(state_tokens), n_questions, w.calls.size(),
              static_cast<long long>(row_tokens), load_ms);
  std::printf("Median latency (ms; %d warmups, %d runs; %zu questions in %zu calls)\n", warmups, runs, n_questions, w.calls.size());
  std::printf("prefill: %.2f\ncached evaluation: %.2f\nprefill + evaluation: %.2f\n", p, e, t);
  std::printf("prefill + evaluation, state pass fused with the first score pass: %.2f\n", f);
  std::printf("prefill tokens/s: %.0f; evaluation tokens/s: %.0f\n", state_tokens / (p * 1e-3), row_tokens / (e * 1e-3));
  if (!profile_rows.empty()) {
    double total = 0;
    for (const auto& op : profile_rows) total += op.ms;
    std::printf("profile (one prefill + evaluation, every op synchronised): %.2f ms\n", total);
    for (const auto& op : profile_rows) {
      std::printf("  %-20s %6llu calls %9.2f ms %5.1f%%", op.op.c_str(), static_cast<unsigned long long>(op.calls), op.ms,
                  100 * op.ms / total);
      if (op.gflop > 0) std::printf("  %8.2f GFLOP/s", op.gflop / (op.ms * 1e-3));
      std::printf("\n");
    }
  }
  if (gemm_peak) std::printf("OpenBLAS sgemm 1024x1024x1024 (same run): %.2f GFLOP/s\n", peak);
  auto rate = [&](const char* pass, const PassCost& cost, double pass_ms) {
    const double tflops = cost.flops / (pass_ms * 1e-3) * 1e-12, gbps = cost.weight_bytes / (pass_ms * 1e-3) * 1e-9;
    std::printf("%s: %.3f TFLOP/s, weights streamed at %.1f GB/s", pass, tflops, gbps);
    if (ceilings)
      std::printf(" (%.1f%% of the matmul ceiling, %.1f%% of the copy bandwidth)", 100 * tflops / ceil.matmul_tflops,
                  100 * gbps / ceil.copy_gbps);
    std::printf("\n");
  };
  rate("prefill", prefill_cost, p);
  rate("cached evaluation", eval_cost, e);
  if (ceilings)
    std::printf("ceilings (same run, through the backend's ops): matmul 4096³ %.2f TFLOP/s, copy %.1f GB/s\n",
                ceil.matmul_tflops, ceil.copy_gbps);
  return 0;
}
