// The ExecuTorch example's default request (KEV_SPEC.md §10 kev_runner) and a readable dump of an
// encoding, for `kev_runner --encode-only` and for debugging layouts.
//
//   Request demo = default_demo_request();
//   std::cout << format_encoding(state, rows, ids, &tokenizer);
#pragma once

#include <string>
#include <vector>

#include "kev/kev.h"
#include "text/encode.h"
#include "text/tokenizer.h"

namespace kev {

inline constexpr const char* kDemoStateText =
    "I was charged twice for invoice 4411. Please refund the duplicate charge.";

// State kDemoStateText; questions department (choice billing/technical/sales), refund_requested (noul),
// duplicate_charge (noul), in that order.
Request default_demo_request();

// One block for the state and one per row: token ids (with each token's text when `tokenizer` is not
// null; line breaks and tabs escaped), the position range, and the close/decide offsets both
// row-relative and absolute. `question_ids[k]` names rows[k]; missing names print as "#k".
std::string format_encoding(const EncodedState& state, const std::vector<EncodedRow>& rows,
                            const std::vector<std::string>& question_ids, const Tokenizer* tokenizer);

}  // namespace kev
