// The per-op table of a traced pass (op_time_table.h).
#include "backend/op_time_table.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace kev {

void OpTimeTable::add(const std::string& label, double ms) {
  Sum& sum = by_label_[label];
  sum.ms += ms;
  ++sum.calls;
  total_ms_ += ms;
}

void OpTimeTable::print(std::FILE* out, const std::string& header, const char* total_note) const {
  std::vector<std::pair<std::string, Sum>> rows(by_label_.begin(), by_label_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::fprintf(out, "%s, GPU %.3f ms %s\n", header.c_str(), total_ms_, total_note);
  for (const auto& [label, sum] : rows) {
    std::fprintf(out, "  %-44s %4d x %8.1f us = %8.1f us  %5.1f%%\n", label.c_str(), sum.calls,
                 1e3 * sum.ms / sum.calls, 1e3 * sum.ms, total_ms_ > 0 ? 100 * sum.ms / total_ms_ : 0.0);
  }
}

}  // namespace kev
