#include "text/response.h"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <variant>

#include "common/check.h"

namespace kev {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kAnswerDecimals = 4;
constexpr int kLatencyDecimals = 2;

double r4(double value) { return round_decimals(value, kAnswerDecimals); }

const Question* find_question(const Request& request, const std::string& id) {
  for (const Question& q : request.questions) {
    if (q.id == id) return &q;
  }
  return nullptr;
}

Json probabilities_object(const Answer& answer) {
  Json out = Json::object();
  for (std::size_t j = 0; j < answer.probabilities.size() && j < answer.option_keys.size(); ++j) {
    out[answer.option_keys[j]] = r4(answer.probabilities[j]);
  }
  return out;
}

Json answer_json(const Request& request, const Answer& answer) {
  return std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        Json out = Json::object();
        if constexpr (std::is_same_v<T, NoulAnswer>) {
          out["type"] = "noul";
          out["noul"] = r4(value.yes);
        } else if constexpr (std::is_same_v<T, ChoiceAnswer>) {
          out["type"] = "choice";
          out["choice"] = value.choice;
          out["confidence"] = r4(value.confidence);
          out["probabilities"] = probabilities_object(answer);
        } else {
          out["type"] = "score";
          out["score"] = r4(value.score);
          Json legend = Json::object();
          if (const Question* q = find_question(request, answer.id); q != nullptr) {
            if (const auto* score = std::get_if<Score>(&q->body)) {
              for (std::size_t i = 0; i < score->levels.size(); ++i) legend[std::to_string(i)] = score->levels[i];
            }
          }
          out["legend"] = std::move(legend);
          out["probabilities"] = probabilities_object(answer);
          out["confidence"] = r4(value.confidence);
        }
        return out;
      },
      answer.value);
}

Json answers_json(const Request& request, const Answers& answers) {
  Json out = Json::object();
  for (const Answer& answer : answers.answers) out[answer.id] = answer_json(request, answer);
  return out;
}

// Strings come from callers and may hold invalid UTF-8; replace such bytes instead of throwing.
std::string dump(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

double round_decimals(double value, int decimals) {
  if (!std::isfinite(value)) return value;
  // Fixed-precision to_chars is exact decimal rounding of the binary value, as Python's round().
  char buf[400];
  const auto res = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed, decimals);
  if (res.ec != std::errc()) return value;
  double rounded = value;
  std::from_chars(buf, res.ptr, rounded);
  return rounded;
}

std::string serialise_answers(const Request& request, const Answers& answers) {
  return dump(answers_json(request, answers));
}

Result<int64_t> count_output_tokens(const Tokenizer& tokenizer, const Request& request, const Answers& answers) {
  KEV_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tokenizer.encode(serialise_answers(request, answers)));
  return static_cast<int64_t>(ids.size());
}

std::string format_response(const Request& request, const Answers& answers, const ResponseExtras& extras) {
  Json body = Json::object();
  body["model"] = request.model;
  body["answers"] = answers_json(request, answers);
  Json usage = Json::object();
  usage["input_tokens"] = answers.usage.input_tokens;
  if (extras.output_tokens) usage["output_tokens"] = *extras.output_tokens;
  if (extras.truncation_enabled) {
    usage["state_tokens"] = answers.usage.state_tokens;
    usage["state_tokens_used"] = answers.usage.state_tokens_used;
  }
  body["usage"] = std::move(usage);
  body["latency_ms"] = round_decimals(answers.latency_ms, kLatencyDecimals);
  if (extras.truncation_enabled) body["truncated"] = answers.usage.truncated;
  return dump(body);
}

std::string format_response(const Request& request, const Answers& answers) {
  return format_response(request, answers, ResponseExtras{std::nullopt, answers.usage.truncated});
}

}  // namespace kev
