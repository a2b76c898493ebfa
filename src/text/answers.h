// Answer maths (KEV_SPEC.md §7): per-question softmax over the options' logits in double, then the
// type's answer (noul p(yes), choice first argmax + confidence, score expected level + confidence).
//
//   KEV_ASSIGN_OR_RETURN(Answer a, make_answer(question, logits));   // logits in option order
//
// Contracts: logits.size() must equal the question's option count (else Internal); a non-finite logit
// is an Internal error naming the question and option (the model produced it, not the caller).
// Probabilities are kept at full precision; rounding happens only when a response is serialised.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kev/kev.h"
#include "kev/result.h"

namespace kev {

// Softmax with max subtraction, in double. The result sums to 1 up to rounding; it is not
// renormalised a second time.
std::vector<double> softmax(std::span<const double> logits);

// D_L = (1/L) sum_i |i - (L-1)/2| = floor(L^2/4) / L: the mean distance from the middle level, which
// normalises the score confidence.
double score_spread(int64_t levels);

Result<Answer> make_answer(const Question& question, std::span<const double> logits);

}  // namespace kev
