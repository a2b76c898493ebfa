#include "text/answers.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <variant>

#include "common/check.h"
#include "text/encode.h"

namespace kev {
namespace {

// First maximum, as upstream's argmax.
std::size_t first_argmax(const std::vector<double>& p) {
  return static_cast<std::size_t>(std::max_element(p.begin(), p.end()) - p.begin());
}

}  // namespace

std::vector<double> softmax(std::span<const double> logits) {
  std::vector<double> p(logits.size());
  if (logits.empty()) return p;
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (std::size_t j = 0; j < logits.size(); ++j) {
    p[j] = std::exp(logits[j] - max);
    sum += p[j];
  }
  for (double& v : p) v /= sum;
  return p;
}

double score_spread(int64_t levels) { return static_cast<double>(levels * levels / 4) / static_cast<double>(levels); }

Result<Answer> make_answer(const Question& question, std::span<const double> logits) {
  Answer answer;
  answer.id = question.id;
  answer.option_keys = option_keys(question);
  KEV_CHECK(logits.size() == answer.option_keys.size(), ErrorCode::Internal, "question \"", question.id, "\" has ",
            answer.option_keys.size(), " options but ", logits.size(), " logits");
  KEV_CHECK(!logits.empty(), ErrorCode::Internal, "question \"", question.id, "\" has no options");
  for (std::size_t j = 0; j < logits.size(); ++j) {
    KEV_CHECK(std::isfinite(logits[j]), ErrorCode::Internal, "non-finite logit ", logits[j], " for question \"",
              question.id, "\" option ", j, " (", answer.option_keys[j], ")");
  }
  answer.logits.assign(logits.begin(), logits.end());
  answer.probabilities = softmax(logits);
  const std::vector<double>& p = answer.probabilities;
  const std::size_t best = first_argmax(p);
  const auto k = static_cast<double>(p.size());

  std::visit(
      [&](const auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, Noul>) {
          answer.value = NoulAnswer{p[1]};
        } else if constexpr (std::is_same_v<T, Choice>) {
          // p_max >= 1/K exactly; the clamp only removes a rounding-level negative for a flat p.
          const double confidence = p.size() == 1 ? 1.0 : std::max(0.0, (p[best] - 1 / k) / (1 - 1 / k));
          answer.value = ChoiceAnswer{body.options[best].first, confidence};
        } else {
          double score = 0;
          double distance = 0;
          for (std::size_t i = 0; i < p.size(); ++i) {
            score += static_cast<double>(i) * p[i];
            distance += p[i] * std::abs(static_cast<double>(i) - static_cast<double>(best));
          }
          const auto levels = static_cast<int64_t>(p.size());
          const double confidence = levels == 1 ? 1.0 : std::max(0.0, 1 - distance / score_spread(levels));
          answer.value = ScoreAnswer{score, confidence};
        }
      },
      question.body);
  return answer;
}

}  // namespace kev
