// kev_runner: answer a Kev request with a model, or show how it is encoded.
//   kev_runner --model DIR [--base DIR] [--lora-scale S] [--state TEXT | --state-file F] [--questions F.json] [--request F.json]
//              [--backend cpu|cuda|webgpu] [--max-prefix N] [--max-context N] [--truncate-states]
//              [--json] [--report]
//   kev_runner --encode-only [--model DIR | --tokenizer tokenizer.json] [same request options]
// With no request it runs the default demo request (the refund ticket of KEV_SPEC.md §10).
// Exit codes: 0 success, 1 error (one line on stderr), 2 usage.
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend_options.h"
#include "kev/kev.h"
#include "io/json_util.h"
#include "model/checkpoint_import.h"
#include "model/model_file.h"
#include "text/demo.h"
#include "text/encode.h"
#include "text/response.h"
#include "text/tokenizer.h"

namespace {

int fail(const kev::Status& st) {
  std::cerr << "kev_runner: " << st.to_string() << "\n";
  return 1;
}

// Builds the request from the options: --request, else --state/--state-file + --questions, else the demo.
kev::Result<kev::Request> build_request(const std::string& request_file, const std::string& state,
                                        const std::string& state_file, const std::string& questions_file,
                                        int64_t max_options) {
  if (!request_file.empty()) {
    auto body = kev::read_text_file(request_file);
    if (!body) return body.status();
    return kev::parse_request(*body, max_options);
  }
  kev::Request demo = kev::default_demo_request();
  std::string state_text = demo.state_text;
  if (!state_file.empty()) {
    auto text = kev::read_text_file(state_file);
    if (!text) return text.status();
    state_text = *text;
  } else if (!state.empty()) {
    state_text = state;
  }
  if (questions_file.empty()) {
    demo.state_text = state_text;
    return demo;
  }
  auto questions = kev::read_text_file(questions_file);
  if (!questions) return questions.status();
  const std::string body = "{\"state\": " + nlohmann::json(state_text).dump() + ", \"questions\": " + *questions + "}";
  return kev::parse_request(body, max_options);
}

void print_human(const kev::Answers& answers) {
  for (const kev::Answer& a : answers.answers) {
    if (const auto* n = std::get_if<kev::NoulAnswer>(&a.value)) {
      std::cout << a.id << ": " << n->yes << "\n";
    } else if (const auto* c = std::get_if<kev::ChoiceAnswer>(&a.value)) {
      std::cout << a.id << ": " << c->choice << " (confidence " << c->confidence << ")\n";
      for (size_t j = 0; j < a.option_keys.size(); ++j)
        std::cout << "  " << a.option_keys[j] << ": " << a.probabilities[j] << "\n";
    } else if (const auto* s = std::get_if<kev::ScoreAnswer>(&a.value)) {
      std::cout << a.id << ": " << s->score << " (confidence " << s->confidence << ")\n";
      for (size_t j = 0; j < a.option_keys.size(); ++j)
        std::cout << "  " << a.option_keys[j] << ": " << a.probabilities[j] << "\n";
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kev_runner: answer Kev questions about a state"};
  std::string model_dir, tokenizer_path = KEV_DEFAULT_TOKENIZER, state, state_file, questions_file, request_file;
  kev::Options options;
  int64_t max_prefix = 0, max_context = 0;
  bool json = false, report = false, encode_only = false;
  app.add_option("--model", model_dir, "exported model directory (kev_export), or an upstream checkpoint (head.pt)");
  app.add_option("--base", options.base_dir, "HF base model directory, for an upstream LoRA checkpoint");
  app.add_option("--lora-scale", options.lora_scale, "LoRA scale s for an upstream checkpoint")->default_val(1.0);
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json for --encode-only without --model");
  app.add_option("--state", state, "state text");
  app.add_option("--state-file", state_file, "file holding the state text");
  app.add_option("--questions", questions_file, "JSON file: the \"questions\" object of a /v1/systemone request");
  app.add_option("--request", request_file, "JSON file: a whole /v1/systemone request body");
  kev::tools::add_backend_options(app, options);
  app.add_option("--max-prefix", max_prefix, "state token limit (default: the model's)");
  app.add_option("--max-context", max_context, "state + row token limit (default: the model's)");
  app.add_flag("--truncate-states", options.truncate_states, "cut long states to max-prefix instead of refusing");
  app.add_flag("--json", json, "print the /v1/systemone response body");
  app.add_flag("--report", report, "print op placement and token counts");
  app.add_flag("--encode-only", encode_only, "print the token rows, positions and readout offsets; run no model");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (model_dir.empty() && !encode_only) {
    std::cerr << "kev_runner: --model DIR is required (or use --encode-only)\n" << app.help();
    return 2;
  }

  kev::Limits limits;
  kev::SpecialIds model_ids{};
  bool have_model_ids = false;
  if (!model_dir.empty() && kev::is_checkpoint_dir(model_dir)) {
    // An upstream checkpoint loads with the default limits; its tokenizer is the base model's.
    tokenizer_path = (options.base_dir.empty() ? model_dir : options.base_dir) + "/tokenizer.json";
  } else if (!model_dir.empty()) {
    auto model = kev::read_model_file(model_dir);
    if (!model) return fail(model.status());
    limits = model->kev.limits;
    model_ids = model->kev.special_ids;
    have_model_ids = true;
    tokenizer_path = model->tokenizer_path();
  }
  if (max_prefix > 0) limits.max_prefix = max_prefix;
  if (max_context > 0) limits.max_context = max_context;
  options.limits = limits;
  options.override_limits = max_prefix > 0 || max_context > 0;

  auto request = build_request(request_file, state, state_file, questions_file, limits.max_options);
  if (!request) return fail(request.status());

  if (encode_only) {
    auto tokenizer = kev::Tokenizer::load(tokenizer_path);
    if (!tokenizer) return fail(tokenizer.status());
    auto ids = kev::resolve_special_ids(*tokenizer);
    if (!ids) return fail(ids.status());
    if (have_model_ids) {
      if (kev::Status st = kev::check_special_ids(*ids, model_ids); !st.ok()) return fail(st);
    }
    kev::Encoder encoder(*tokenizer, *ids, limits);
    auto enc_state = encoder.encode_state(request->state_text, options.truncate_states);
    if (!enc_state) return fail(enc_state.status());
    std::vector<kev::EncodedRow> rows;
    std::vector<std::string> names;
    for (const kev::Question& q : request->questions) {
      auto row = encoder.encode_question(q, static_cast<int64_t>(enc_state->tokens.size()));
      if (!row) return fail(row.status());
      rows.push_back(std::move(*row));
      names.push_back(q.id);
    }
    std::cout << kev::format_encoding(*enc_state, rows, names, &*tokenizer);
    return 0;
  }

  auto engine = kev::Engine::load(model_dir, options);
  if (!engine) return fail(engine.status());
  auto answers = engine->system_one(request->state_text, request->questions);
  if (!answers) return fail(answers.status());

  if (json) {
    auto tokenizer = kev::Tokenizer::load(tokenizer_path);
    if (!tokenizer) return fail(tokenizer.status());
    auto out_tokens = kev::count_output_tokens(*tokenizer, *request, *answers);
    if (!out_tokens) return fail(out_tokens.status());
    std::cout << kev::format_response(*request, *answers, {*out_tokens, options.truncate_states}) << "\n";
  } else {
    print_human(*answers);
  }
  if (report) {
    std::cerr << engine->placement_report() << "input tokens: " << answers->usage.input_tokens
              << " (state " << answers->usage.state_tokens_used << ")\nlatency: " << answers->latency_ms << " ms\n";
  }
  return 0;
}
