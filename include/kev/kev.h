// kev/kev.h — the kev-native public API: run Kev decision models natively.
//
//   #include "kev/kev.h"
//   auto engine = kev::Engine::load("models/kev-0.8b", {.backend = "cpu"});
//   if (!engine) return fail(engine.status());
//   kev::Questions qs = {{"refund", kev::Noul{"Does the customer ask for a refund?", "", ""}},
//                        {"team", kev::Choice{"Which team?", {{"billing", "Payments"}, {"tech", ""}}}}};
//   auto prefix = engine->prefill("I was charged twice for invoice 4411.");   // state pass, once
//   auto answers = engine->evaluate(*prefix, qs);                              // any number of times
//   for (const kev::Answer& a : answers->answers) ...                          // request order
//
// Ownership: an Engine owns the model weights and its backend; a Prefix owns its snapshot (device
// memory) and keeps the engine's backend alive, so it may outlive the Engine object that made it.
// Concurrency: calls on one Engine are serialised internally (one pass at a time); any thread may call.
// A Prefix is immutable once made: evaluate() never writes to it, and many may coexist.
// Nothing here exposes tensor, CUDA or Dawn types.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kev/result.h"

namespace kev {

// ---- Questions ------------------------------------------------------------------------------------
// All texts are already rendered (see render_json_text for JSON values). Options are built as
// KEV_SPEC.md §4.2 describes.

// Yes/no. Options "no[: if_false]", "yes[: if_true]". Answer: p(yes).
struct Noul {
  std::string instructions;
  std::string if_false;  // criteria.false; empty = plain "no"
  std::string if_true;   // criteria.true; empty = plain "yes"
};

// One of 1..255 named options ("name" or "name: description"). Answer: the first argmax.
struct Choice {
  std::string instructions;
  std::vector<std::pair<std::string, std::string>> options;  // (name, description); names unique
};

// Ordered levels 0..L-1 (1..255), each option is the level's description. Answer: expected level.
struct Score {
  std::string instructions;
  std::vector<std::string> levels;
};

struct Question {
  std::string id;  // unique within a request; never shown to the model
  std::variant<Noul, Choice, Score> body;
};
using Questions = std::vector<Question>;

// ---- Answers --------------------------------------------------------------------------------------

struct NoulAnswer {
  double yes = 0;  // p(yes)
};
struct ChoiceAnswer {
  std::string choice;       // first argmax
  double confidence = 0;    // (p_max - 1/K) / (1 - 1/K), 1 when K = 1
};
struct ScoreAnswer {
  double score = 0;         // sum_i i * p_i
  double confidence = 0;    // max(0, 1 - sum_i p_i |i - mode| / D_L), D_L = floor(L^2/4)/L; 1 when L = 1
};

struct Answer {
  std::string id;
  std::variant<NoulAnswer, ChoiceAnswer, ScoreAnswer> value;
  std::vector<std::string> option_keys;  // noul: "false","true"; choice: names; score: "0".."L-1"
  std::vector<double> probabilities;     // softmax over this question's options, full double precision
  std::vector<double> logits;            // z_j = (kappa_j . u) / 16 / T, as computed (fp32 widened)
};

struct Usage {
  int64_t input_tokens = 0;       // Ls + sum of row lengths
  int64_t state_tokens = 0;       // state tokens before any truncation (incl. the state delimiter)
  int64_t state_tokens_used = 0;  // Ls
  bool truncated = false;
};

struct Answers {
  std::vector<Answer> answers;  // request order
  Usage usage;
  double latency_ms = 0;        // model time of this call (tokenisation + passes + answer maths)
};

// ---- Limits and options ---------------------------------------------------------------------------

// Limits are configuration, not constants. Defaults are the ExecuTorch example's; serving() is the
// upstream HTTP server's profile.
struct Limits {
  int64_t max_prefix = 384;          // state tokens including the state delimiter
  int64_t max_context = 1024;        // state + one question row
  int64_t max_questions = 0;         // per pass; 0 = no cap besides the token budget
  int64_t max_options = 255;         // per question
  int64_t pass_token_budget = 4096;  // row tokens packed into one score pass (a single row may exceed it)
  static Limits serving() { return Limits{8192, 8192, 0, 255, 16384}; }
};

struct Options {
  std::string backend = "cpu";     // "cpu" | "cuda" | "webgpu"
  Limits limits;                   // overrides the model file's limits when override_limits is true
  bool override_limits = false;
  bool truncate_states = false;    // keep the first max_prefix tokens instead of refusing long states
  double temperature = 0;          // > 0 overrides the model's T (1.0 gives raw logits)
  int threads = 0;                 // CPU worker threads; 0 = hardware concurrency
  int device = 0;                  // CUDA device ordinal
  bool cuda_graphs = true;         // CUDA: replay recurring passes as CUDA graphs
  // CUDA, bf16 exports: the GEMM operands. "f16" (weights converted to FP16 at load, x rounded to FP16
  // after a per-row power-of-two scale), "bf16x2" (x as two BF16 halves: 2x the GEMM FLOPs) or "bf16"
  // (x rounded to BF16); docs/numerics.md gives each one's measured error.
  std::string cuda_gemm = "f16";
  std::string adapter;             // WebGPU adapter: name substring or type ("discrete", "cpu"); "" = default
  bool profile_ops = false;        // time every op (waits for the device after each; slows passes)
  // Take the device memory the limits can need at load: Engine::load runs the largest passes the
  // limits allow (a prefill of max_prefix tokens, a score pass of the whole token budget over it, and
  // one row of max_context − 1 tokens when that is longer) with throw-away tokens, so the activation
  // arena, the backend's per-pass scratch and a snapshot's worth of blocks are in the backend's pool
  // before the first request, and an out-of-memory fails the load, not a request
  // (docs/architecture.md, Memory). Costs those passes' time at load; meant for GPU backends.
  bool reserve_memory = false;
  // Loading an upstream checkpoint directory (head.pt + adapter or full weights) instead of an exported
  // model: the HF base it was trained on (not needed for full weights), and the LoRA user scale s.
  // Such a load uses `limits` when override_limits, else the Limits defaults.
  std::string base_dir;
  double lora_scale = 1.0;
};

// ---- Engine ---------------------------------------------------------------------------------------

// A GPU backend's device memory (Engine::device_memory). Bytes are the pool's block sizes.
struct DeviceMemory {
  size_t bytes_in_use = 0;   // held now: weights, snapshots, the activation arena, per-pass scratch
  size_t bytes_cached = 0;   // freed blocks the pool keeps for reuse
  uint64_t allocations = 0;  // blocks (cuda) or buffers (webgpu) taken from the driver since load
};

// Time spent per op kind over all passes so far (filled when Options::profile_ops is set).
struct OpProfile {
  std::string op;        // e.g. "matmul", "gated_delta_rule"
  std::string backend;   // where it ran
  uint64_t calls = 0;
  double ms = 0;         // wall time including the device wait
  double gflop = 0;      // floating-point work, for ops whose count is defined (matmul, attention)
};

class Engine;
struct EngineImpl;
struct PrefixImpl;

// The immutable state snapshot produced by Engine::prefill. Move-only.
class Prefix {
 public:
  Prefix(Prefix&&) noexcept;
  Prefix& operator=(Prefix&&) noexcept;
  ~Prefix();
  int64_t state_tokens() const;  // Ls
  bool truncated() const;
  const std::vector<int32_t>& tokens() const;
  // Hash of the snapshot's bytes as stored on the device (read back); equal hashes = identical state.
  Result<uint64_t> content_hash() const;

 private:
  friend class Engine;
  explicit Prefix(std::unique_ptr<PrefixImpl> impl);
  std::unique_ptr<PrefixImpl> impl_;
};

// What Engine::prefill_and_evaluate returns: the snapshot it made and the answers over it.
struct PrefixAndAnswers {
  Prefix prefix;
  Answers answers;
};

struct ModelInfo {
  std::string name;            // model.json "name" or the directory name
  std::string architecture;    // e.g. "qwen3_5 d=1024 layers=24 (18 GDN + 6 attention)"
  std::string checkpoint_id;   // "sha256:..." of head.pt, or "" for synthetic models
  std::string dtype;           // weight dtype on the backend
  std::string backend;
  std::string device;          // the backend's device description, e.g. "x86-64, 2 threads, ..."
  double temperature = 1;
  Limits limits;
};

class Engine {
 public:
  // Loads an exported model directory (model.json + weights.safetensors + tokenizer.json), or an
  // upstream Kev checkpoint directory (head.pt + LoRA adapter over options.base_dir, or full weights).
  static Result<Engine> load(const std::string& path, const Options& options);

  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  // The state pass: tokenises `state_text` (plain text; see render_json_text) and snapshots it.
  Result<Prefix> prefill(std::string_view state_text);
  // The state pass over state ids tokenised elsewhere as prefill() would (the state delimiter first, at
  // most max_prefix ids, each in the vocabulary; InvalidRequest otherwise), for callers that tokenise
  // off the engine's lock, such as kev_server's request threads. `original_length` and `truncated`
  // are what that encoding reported (Answers::usage gives them back).
  Result<Prefix> prefill_tokens(std::vector<int32_t> tokens, int64_t original_length, bool truncated);
  // Any number of questions; split into passes by the token budget and max_questions.
  Result<Answers> evaluate(const Prefix& prefix, const Questions& questions);
  // prefill(state) then evaluate(prefix, questions), with the state pass and the first score pass run
  // as one forward pass when both together are no longer than the limits' largest pass (state tokens
  // + that pass's row tokens <= max(max_prefix, pass_token_budget)): the weights stream once for both.
  // Answers and snapshot equal the separate calls' bit for bit where the backend's matmul is
  // row-invariant (cpu, webgpu); on cuda they differ by the GEMMs' rounding (docs/numerics.md).
  Result<PrefixAndAnswers> prefill_and_evaluate(std::string_view state_text, const Questions& questions);
  // prefill_and_evaluate over state ids tokenised elsewhere (as prefill_tokens).
  Result<PrefixAndAnswers> prefill_tokens_and_evaluate(std::vector<int32_t> tokens, int64_t original_length,
                                                       bool truncated, const Questions& questions);
  // evaluate(prefill(state), questions), run as prefill_and_evaluate.
  Result<Answers> system_one(std::string_view state_text, const Questions& questions);

  const ModelInfo& info() const;
  // Which op ran on which backend in the passes so far, and token counts.
  std::string placement_report() const;
  std::vector<OpProfile> op_profile() const;
  // The backend's device memory counters (cuda: its pool; webgpu: the buffers it created and holds, no
  // cache); nullopt for the CPU backend.
  std::optional<DeviceMemory> device_memory() const;

 private:
  explicit Engine(std::unique_ptr<EngineImpl> impl);
  std::unique_ptr<EngineImpl> impl_;
};

// ---- The /v1/systemone JSON contract ---------------------------------------------------------------

// A parsed POST /v1/systemone body: the state rendered to text, questions in request order.
struct Request {
  std::string model = "kev-latest";
  std::string state_text;
  Questions questions;
};

// Renders any JSON value as Kev does (KEV_SPEC.md §4.1): strings verbatim, objects as "key: value"
// lines, arrays as "- " items, floats as Python repr.
Result<std::string> render_json_text(std::string_view json_value);
// Parses and validates a request body; errors name the field and the limit.
Result<Request> parse_request(std::string_view json_body, int64_t max_options = 255);
// The response body (probabilities, confidences and scores rounded to 4 decimals).
std::string format_response(const Request& request, const Answers& answers);

}  // namespace kev
