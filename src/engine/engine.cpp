// Engine: loads an exported model onto a backend and runs the Kev workflow —
// prefill(state) -> Prefix, evaluate(prefix, questions) -> Answers, system_one = both.
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>

#include "backend/backend.h"
#include "common/check.h"
#include "common/hash.h"
#include "engine/backend_options.h"
#include "kev/kev.h"
#include "model/checkpoint_import.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "text/answers.h"
#include "text/encode.h"
#include "text/tokenizer.h"

namespace kev {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct EngineImpl {
  ModelFile model;
  Tokenizer tokenizer;
  Encoder encoder;
  Options options;
  ModelInfo info;
  std::shared_ptr<Backend> backend;
  std::unique_ptr<ModelRunner> runner;
  mutable std::mutex mu;  // one pass at a time
  uint64_t id = 0;
  int64_t prefills = 0, passes = 0, rows = 0, state_tokens = 0, row_tokens = 0;
  int64_t fused = 0;  // state passes run together with their first score pass

  EngineImpl(ModelFile m, Tokenizer t, Encoder e) : model(std::move(m)), tokenizer(std::move(t)), encoder(std::move(e)) {}
};

namespace {

// Options::reserve_memory: the largest passes the limits allow, with throw-away tokens (id 0). Their
// arena, scratch and snapshot blocks stay in the backend's pool for the passes that follow. A score
// pass's rows are short (kRows tokens each, the many-questions case) unless max_questions forces
// longer ones; a last pass holds one row as long as the context allows (backends may take other
// kernels, with other scratch, for rows longer than a chunk).
Status reserve_memory(ModelRunner& runner, const Limits& lim) {
  constexpr int64_t kRows = 32;
  // A prefill of `state_tokens`, then one score pass of `n` row tokens over it, in rows of kRows
  // tokens (short_rows) or as one row.
  auto reserve = [&](int64_t state_tokens, int64_t n, bool short_rows) -> Status {
    KEV_ASSIGN_OR_RETURN(PrefixState prefix, runner.prefill(std::vector<int32_t>(static_cast<size_t>(state_tokens), 0)));
    int64_t rows = short_rows ? (n + kRows - 1) / kRows : 1;
    if (lim.max_questions > 0) rows = std::min(rows, lim.max_questions);
    ScorePass pass;
    pass.tokens.assign(static_cast<size_t>(n), 0);
    pass.layout.offsets = {0};
    pass.layout.pos0 = prefix.n_tokens;
    pass.layout.from_prefix = true;
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t begin = pass.layout.offsets.back();
      const int32_t end = static_cast<int32_t>(n * (r + 1) / rows);
      pass.layout.offsets.push_back(end);
      pass.option_rows.push_back(begin);
      pass.option_question.push_back(static_cast<int32_t>(r));
      pass.decide_rows.push_back(end - 1);
    }
    return runner.score(prefix, pass).status();
  };
  Status st = reserve(lim.max_prefix, lim.pass_token_budget, true);
  if (st.ok() && lim.max_context - 1 > lim.pass_token_budget) st = reserve(1, lim.max_context - 1, true);
  if (st.ok() && lim.max_context > 1) st = reserve(1, lim.max_context - 1, false);
  runner.reset_op_stats();
  if (!st.ok()) {
    return Status(st.code(), cat("reserving device memory for the limits (max_prefix ", lim.max_prefix,
                                 ", pass_token_budget ", lim.pass_token_budget, ", max_context ", lim.max_context,
                                 ") failed: ", st.message(), "; lower the limits or load without reserve_memory"));
  }
  return Status::success();
}

}  // namespace

struct PrefixImpl {
  PrefixState state;
  std::vector<int32_t> tokens;
  int64_t original_length = 0;
  bool truncated = false;
  uint64_t engine_id = 0;
  std::shared_ptr<Backend> backend;  // keeps the device memory's owner alive
};

// ---- Prefix -------------------------------------------------------------------------------------

Prefix::Prefix(std::unique_ptr<PrefixImpl> impl) : impl_(std::move(impl)) {}
Prefix::Prefix(Prefix&&) noexcept = default;
Prefix& Prefix::operator=(Prefix&&) noexcept = default;
Prefix::~Prefix() = default;
int64_t Prefix::state_tokens() const { return impl_->state.n_tokens; }
bool Prefix::truncated() const { return impl_->truncated; }
const std::vector<int32_t>& Prefix::tokens() const { return impl_->tokens; }

Result<uint64_t> Prefix::content_hash() const {
  const PrefixState& s = impl_->state;
  std::vector<uint8_t> bytes(s.bytes);
  const Tensor all = Tensor::contiguous(s.buffer.get(), 0, DType::F32, {static_cast<int64_t>(s.bytes / 4)});
  KEV_TRY(impl_->backend->synchronize());
  KEV_TRY(impl_->backend->download(all, bytes.data(), bytes.size()));
  return fnv1a64(bytes.data(), bytes.size());
}

// ---- Engine -------------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<EngineImpl> impl) : impl_(std::move(impl)) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;
const ModelInfo& Engine::info() const { return impl_->info; }

Result<BackendOptions> backend_options(const Options& options) {
  BackendOptions b;
  b.threads = options.threads;
  b.device = options.device;
  b.cuda_graphs = options.cuda_graphs;
  if (options.cuda_gemm == "f16") {
    b.cuda_gemm = CudaGemm::F16;
  } else if (options.cuda_gemm == "bf16x2") {
    b.cuda_gemm = CudaGemm::BF16x2;
  } else if (options.cuda_gemm == "bf16") {
    b.cuda_gemm = CudaGemm::BF16;
  } else {
    return Status(ErrorCode::InvalidRequest,
                  cat("unknown CUDA GEMM precision '", options.cuda_gemm, "'; use f16, bf16x2 or bf16"));
  }
  b.adapter = options.adapter;
  return b;
}

Result<Engine> Engine::load(const std::string& path, const Options& options) {
  // An upstream checkpoint (head.pt) is merged in memory as kev_export would; else an exported model.
  std::optional<OpenedCheckpoint> checkpoint;
  ModelFile model;
  if (is_checkpoint_dir(path)) {
    KEV_ASSIGN_OR_RETURN(checkpoint, open_checkpoint(path, options.base_dir, options.lora_scale));
    model.dir = path;
    model.config = checkpoint->config;
    model.kev = checkpoint->meta;
  } else {
    KEV_ASSIGN_OR_RETURN(model, read_model_file(path));
  }
  const std::string tokenizer_path = checkpoint ? checkpoint->tokenizer_path : model.tokenizer_path();
  const Limits limits = options.override_limits ? options.limits : model.kev.limits;
  KEV_TRY(validate_limits(limits));

  KEV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(tokenizer_path));
  KEV_ASSIGN_OR_RETURN(SpecialIds ids, resolve_special_ids(tokenizer));
  KEV_TRY(check_special_ids(ids, model.kev.special_ids));
  KEV_CHECK(tokenizer.vocab_size() <= model.config.n_vocab, ErrorCode::TokenizerMismatch, "the tokenizer has ",
            tokenizer.vocab_size(), " ids but the model's embedding has only ", model.config.n_vocab, " rows");

  KEV_ASSIGN_OR_RETURN(BackendOptions backend_opts, backend_options(options));
  // CUDA attention at the precision of the model's projections: FP16 products where a bf16 export's
  // GEMMs round their inputs to 16 bits; 3xTF32 for fp32 exports and bf16x2 (FP32-level inputs).
  const std::string export_dtype = checkpoint ? default_export_dtype(options.backend) : model.kev.dtype;
  backend_opts.cuda_attention_f16 = export_dtype == "bf16" && backend_opts.cuda_gemm != CudaGemm::BF16x2;
  KEV_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, create_backend(options.backend, backend_opts));

  ModelWeights weights;
  if (checkpoint) {
    // The dtype the default export for this backend would hold, so a direct load equals loading it.
    const DType dtype = matmul_dtype_for(*backend, model.config, default_export_dtype(options.backend));
    model.kev.dtype = dtype == DType::F32 ? "fp32" : "bf16";
    KEV_ASSIGN_OR_RETURN(weights,
                         upload_weights(*backend, model.config, model.kev.pointer_dim, checkpoint->tensors, dtype));
  } else {
    KEV_ASSIGN_OR_RETURN(weights, load_model_weights(*backend, model));
  }
  const DType matmul_dtype = weights.matmul_dtype;

  const double temperature = options.temperature > 0 ? options.temperature : model.kev.temperature;
  const double logit_scale = 1.0 / std::sqrt(static_cast<double>(model.kev.pointer_dim)) / temperature;

  Encoder encoder(tokenizer, ids, limits);
  auto impl = std::make_unique<EngineImpl>(std::move(model), std::move(tokenizer), std::move(encoder));
  static std::atomic<uint64_t> next_id{1};
  impl->id = next_id++;
  impl->options = options;
  impl->backend = backend;
  ModelInfo& info = impl->info;
  info.name = impl->model.kev.name;
  info.architecture = impl->model.config.summary();
  info.checkpoint_id = impl->model.kev.checkpoint_id;
  info.dtype = matmul_dtype == DType::BF16  ? "bf16"
               : matmul_dtype == DType::F16 ? "f16 (bf16 export converted at load)"
               : impl->model.kev.dtype == "bf16" ? "fp32 (widened from bf16 at load)"
                                                 : "fp32";
  info.backend = backend->info().name;
  info.device = backend->info().device;
  info.temperature = temperature;
  info.limits = limits;
  impl->runner = std::make_unique<ModelRunner>(backend, impl->model.config, std::move(weights), logit_scale);
  if (options.reserve_memory) KEV_TRY(reserve_memory(*impl->runner, limits));
  impl->runner->set_profiling(options.profile_ops);
  return Engine(std::move(impl));
}

Result<Prefix> Engine::prefill(std::string_view state_text) {
  KEV_ASSIGN_OR_RETURN(EncodedState enc, impl_->encoder.encode_state(state_text, impl_->options.truncate_states));
  return prefill_tokens(std::move(enc.tokens), enc.original_length, enc.truncated);
}

namespace {

Status check_state_tokens(const EngineImpl& e, const std::vector<int32_t>& tokens, int64_t original_length) {
  const Limits& lim = e.encoder.limits();
  const int64_t n = static_cast<int64_t>(tokens.size());
  KEV_CHECK(n > 0 && tokens.front() == e.encoder.special_ids().state, ErrorCode::InvalidRequest,
            "state tokens must start with the state delimiter id ", e.encoder.special_ids().state);
  KEV_CHECK(n <= lim.max_prefix, ErrorCode::InvalidRequest, "the state has ", n, " tokens, over max_prefix ",
            lim.max_prefix, " by ", n - lim.max_prefix);
  KEV_CHECK(original_length >= n, ErrorCode::InvalidRequest, "original_length ", original_length,
            " is below the ", n, " state tokens given");
  return Status::success();
}

// Questions encoded against a state of Ls tokens, split into passes: consecutive questions while the
// packed tokens fit the budget (a lone row may exceed it) and the per-pass question cap allows.
struct EncodedQuestions {
  std::vector<EncodedRow> rows;
  std::vector<std::pair<size_t, size_t>> passes;  // [begin, end) of rows
};

Result<EncodedQuestions> encode_questions(const EngineImpl& e, const Questions& questions, int64_t Ls) {
  KEV_CHECK(!questions.empty(), ErrorCode::InvalidRequest, "a request needs at least one question");
  EncodedQuestions out;
  out.rows.reserve(questions.size());
  for (size_t i = 0; i < questions.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      KEV_CHECK(questions[j].id != questions[i].id, ErrorCode::InvalidRequest, "question id '", questions[i].id,
                "' appears more than once");
    }
    KEV_ASSIGN_OR_RETURN(EncodedRow row, e.encoder.encode_question(questions[i], Ls));
    out.rows.push_back(std::move(row));
  }
  const Limits& lim = e.encoder.limits();
  size_t begin = 0;
  while (begin < out.rows.size()) {
    size_t end = begin;
    int64_t tokens = 0;
    while (end < out.rows.size()) {
      const int64_t len = static_cast<int64_t>(out.rows[end].tokens.size());
      const bool fits = end == begin || tokens + len <= lim.pass_token_budget;
      const bool under_cap = lim.max_questions == 0 || static_cast<int64_t>(end - begin) < lim.max_questions;
      if (!fits || !under_cap) break;
      tokens += len;
      ++end;
    }
    out.passes.emplace_back(begin, end);
    begin = end;
  }
  return out;
}

ScorePass make_pass(const EncodedQuestions& q, std::pair<size_t, size_t> range, int64_t Ls) {
  ScorePass pass;
  pass.layout.offsets = {0};
  pass.layout.pos0 = Ls;
  pass.layout.from_prefix = true;
  for (size_t i = range.first; i < range.second; ++i) {
    const int32_t base = static_cast<int32_t>(pass.tokens.size());
    const EncodedRow& r = q.rows[i];
    pass.tokens.insert(pass.tokens.end(), r.tokens.begin(), r.tokens.end());
    pass.layout.offsets.push_back(static_cast<int32_t>(pass.tokens.size()));
    for (int32_t c : r.close_offsets) {
      pass.option_rows.push_back(base + c);
      pass.option_question.push_back(static_cast<int32_t>(i - range.first));
    }
    pass.decide_rows.push_back(base + r.decide_offset);
  }
  return pass;
}

Answers empty_answers(const EncodedQuestions& q, int64_t Ls, int64_t original_length, bool truncated) {
  Answers out;
  out.answers.resize(q.rows.size());
  out.usage.state_tokens = original_length;
  out.usage.state_tokens_used = Ls;
  out.usage.truncated = truncated;
  out.usage.input_tokens = Ls;
  for (const EncodedRow& r : q.rows) out.usage.input_tokens += static_cast<int64_t>(r.tokens.size());
  return out;
}

// Counts a score pass and turns its logits into the answers of its questions.
Status answer_pass(EngineImpl& e, const Questions& questions, const EncodedQuestions& q,
                   std::pair<size_t, size_t> range, const ScorePass& pass, const std::vector<float>& logits,
                   Answers& out) {
  ++e.passes;
  e.rows += static_cast<int64_t>(range.second - range.first);
  e.row_tokens += static_cast<int64_t>(pass.tokens.size());
  size_t at = 0;
  for (size_t i = range.first; i < range.second; ++i) {
    const size_t k = q.rows[i].close_offsets.size();
    std::vector<double> z(logits.begin() + static_cast<std::ptrdiff_t>(at),
                          logits.begin() + static_cast<std::ptrdiff_t>(at + k));
    at += k;
    KEV_ASSIGN_OR_RETURN(out.answers[i], make_answer(questions[i], z));
  }
  return Status::success();
}

// Scores passes first.. of q over `state` and fills their questions' answers.
Status score_passes(EngineImpl& e, const PrefixState& state, const Questions& questions, const EncodedQuestions& q,
                    size_t first, Answers& out) {
  for (size_t i = first; i < q.passes.size(); ++i) {
    const ScorePass pass = make_pass(q, q.passes[i], state.n_tokens);
    KEV_ASSIGN_OR_RETURN(std::vector<float> logits, e.runner->score(state, pass));
    KEV_TRY(answer_pass(e, questions, q, q.passes[i], pass, logits, out));
  }
  return Status::success();
}

std::unique_ptr<PrefixImpl> make_prefix(EngineImpl& e, PrefixState state, std::vector<int32_t> tokens,
                                        int64_t original_length, bool truncated) {
  ++e.prefills;
  e.state_tokens += state.n_tokens;
  auto impl = std::make_unique<PrefixImpl>();
  impl->state = std::move(state);
  impl->tokens = std::move(tokens);
  impl->original_length = original_length;
  impl->truncated = truncated;
  impl->engine_id = e.id;
  impl->backend = e.backend;
  return impl;
}

}  // namespace

Result<Prefix> Engine::prefill_tokens(std::vector<int32_t> tokens, int64_t original_length, bool truncated) {
  EngineImpl& e = *impl_;
  KEV_TRY(check_state_tokens(e, tokens, original_length));
  std::lock_guard<std::mutex> lock(e.mu);
  KEV_ASSIGN_OR_RETURN(PrefixState state, e.runner->prefill(tokens));
  return Prefix(make_prefix(e, std::move(state), std::move(tokens), original_length, truncated));
}

Result<Answers> Engine::evaluate(const Prefix& prefix, const Questions& questions) {
  const auto t0 = std::chrono::steady_clock::now();
  EngineImpl& e = *impl_;
  KEV_CHECK(prefix.impl_ != nullptr, ErrorCode::InvalidRequest, "the prefix was moved from");
  const PrefixImpl& p = *prefix.impl_;
  KEV_CHECK(p.engine_id == e.id, ErrorCode::InvalidRequest, "the prefix was made by another engine");
  const int64_t Ls = p.state.n_tokens;
  // Encode and validate every question before running anything.
  KEV_ASSIGN_OR_RETURN(EncodedQuestions q, encode_questions(e, questions, Ls));
  Answers out = empty_answers(q, Ls, p.original_length, p.truncated);
  std::lock_guard<std::mutex> lock(e.mu);
  KEV_TRY(score_passes(e, p.state, questions, q, 0, out));
  out.latency_ms = ms_since(t0);
  return out;
}

Result<PrefixAndAnswers> Engine::prefill_and_evaluate(std::string_view state_text, const Questions& questions) {
  KEV_ASSIGN_OR_RETURN(EncodedState enc, impl_->encoder.encode_state(state_text, impl_->options.truncate_states));
  return prefill_tokens_and_evaluate(std::move(enc.tokens), enc.original_length, enc.truncated, questions);
}

Result<PrefixAndAnswers> Engine::prefill_tokens_and_evaluate(std::vector<int32_t> tokens, int64_t original_length,
                                                             bool truncated, const Questions& questions) {
  const auto t0 = std::chrono::steady_clock::now();
  EngineImpl& e = *impl_;
  KEV_TRY(check_state_tokens(e, tokens, original_length));
  const int64_t Ls = static_cast<int64_t>(tokens.size());
  KEV_ASSIGN_OR_RETURN(EncodedQuestions q, encode_questions(e, questions, Ls));
  Answers out = empty_answers(q, Ls, original_length, truncated);
  std::lock_guard<std::mutex> lock(e.mu);
  // The first pass joins the state pass when the two together are no larger than a pass the limits
  // already allow (so Options::reserve_memory's passes still bound the memory).
  const Limits& lim = e.encoder.limits();
  const ScorePass first = make_pass(q, q.passes.front(), Ls);
  PrefixState state;
  std::vector<float> logits;
  if (Ls + static_cast<int64_t>(first.tokens.size()) <= std::max(lim.max_prefix, lim.pass_token_budget)) {
    KEV_ASSIGN_OR_RETURN(PrefillScore both, e.runner->prefill_and_score(tokens, first));
    state = std::move(both.prefix);
    logits = std::move(both.logits);
    ++e.fused;
  } else {
    KEV_ASSIGN_OR_RETURN(state, e.runner->prefill(tokens));
    KEV_ASSIGN_OR_RETURN(logits, e.runner->score(state, first));
  }
  KEV_TRY(answer_pass(e, questions, q, q.passes.front(), first, logits, out));
  KEV_TRY(score_passes(e, state, questions, q, 1, out));
  out.latency_ms = ms_since(t0);
  return PrefixAndAnswers{Prefix(make_prefix(e, std::move(state), std::move(tokens), original_length, truncated)),
                          std::move(out)};
}

Result<Answers> Engine::system_one(std::string_view state_text, const Questions& questions) {
  KEV_ASSIGN_OR_RETURN(PrefixAndAnswers both, prefill_and_evaluate(state_text, questions));
  return std::move(both.answers);
}

std::vector<OpProfile> Engine::op_profile() const {
  const EngineImpl& e = *impl_;
  std::lock_guard<std::mutex> lock(impl_->mu);
  const OpStats& st = e.runner->op_stats();
  std::vector<OpProfile> out;
  for (size_t i = 0; i < st.calls.size(); ++i) {
    if (st.calls[i] == 0) continue;
    out.push_back({op_name(static_cast<OpKind>(i)), e.backend->info().name, st.calls[i], st.seconds[i] * 1e3,
                   st.flops[i] * 1e-9});
  }
  return out;
}

std::optional<DeviceMemory> Engine::device_memory() const { return impl_->backend->memory(); }

std::string Engine::placement_report() const {
  const EngineImpl& e = *impl_;
  const BackendInfo bi = e.backend->info();
  std::string s = cat("backend: ", bi.name, " (", bi.device, ")\n", "model: ", e.info.architecture, "\n",
                      "weights: ", e.info.dtype, ", ", e.runner->weights().bytes / (1 << 20), " MiB on ", bi.name,
                      "\n", "ops (placement, calls):\n");
  const OpStats& st = e.runner->op_stats();
  for (size_t i = 0; i < st.calls.size(); ++i) {
    if (st.calls[i] == 0) continue;
    s += cat("  ", op_name(static_cast<OpKind>(i)), ": ", bi.name, " (", st.calls[i], ")\n");
  }
  if (const std::optional<DeviceMemory> m = e.backend->memory()) {
    s += cat("device memory: ", m->bytes_in_use >> 20, " MiB in use, ", m->bytes_cached >> 20, " MiB cached, ",
             m->allocations, " allocations\n");
  }
  s += cat("CPU fallbacks: none\n", "state passes: ", e.prefills, " (", e.state_tokens, " tokens); score passes: ",
           e.passes, " (", e.rows, " rows, ", e.row_tokens, " tokens); fused state + score passes: ", e.fused, "\n");
  return s;
}

}  // namespace kev
