// The /v1/systemone response body (KEV_SPEC.md §8) with the parts the public format_response cannot
// know by itself: output_tokens needs the base tokenizer, and the truncation fields depend on whether
// truncation is enabled, not on whether this state was cut.
//
//   KEV_ASSIGN_OR_RETURN(int64_t out, count_output_tokens(tokenizer, request, answers));
//   std::string body = format_response(request, answers, {.output_tokens = out, .truncation_enabled = true});
//
// Numbers in the body (probabilities, confidences, scores) are rounded to 4 decimals as Python's
// round(x, 4) does; latency_ms to 2 decimals. Answers keep full precision until this point.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kev/kev.h"
#include "text/tokenizer.h"

namespace kev {

struct ResponseExtras {
  std::optional<int64_t> output_tokens;  // absent: usage.output_tokens is left out of the body
  bool truncation_enabled = false;       // adds truncated, usage.state_tokens, usage.state_tokens_used
};

std::string format_response(const Request& request, const Answers& answers, const ResponseExtras& extras);

// The "answers" object exactly as it appears in the response body: what output_tokens counts.
std::string serialise_answers(const Request& request, const Answers& answers);
// Base-tokenizer tokens of serialise_answers (no escaping: the text is never fed to the model).
Result<int64_t> count_output_tokens(const Tokenizer& tokenizer, const Request& request, const Answers& answers);

// Python's round(value, decimals): the double nearest to `value` correctly rounded to that many
// decimals (ties of the exact binary value go to even).
double round_decimals(double value, int decimals);

}  // namespace kev
