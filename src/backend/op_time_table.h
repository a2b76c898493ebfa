// The per-op table of a traced pass (KEV_CUDA_TRACE=ops, KEV_WEBGPU_TRACE=ops): GPU times summed per
// label, printed largest first with calls, mean, total and share of the pass.
//
//   OpTimeTable t;
//   t.add("add_rms_norm", 0.0071);   // ms
//   t.print(stderr, "kev-cuda-trace pass 8 ops: 257 commands", "back to back");
//   // kev-cuda-trace pass 8 ops: 257 commands, GPU 3.181 ms back to back
//   //   add_rms_norm                                   46 x      7.1 us =    328.0 us   10.3%
#pragma once

#include <cstdio>
#include <map>
#include <string>

namespace kev {

class OpTimeTable {
 public:
  void add(const std::string& label, double ms);
  double total_ms() const { return total_ms_; }
  // `header`, the summed GPU time and what it covers (`total_note`), then one line per label.
  void print(std::FILE* out, const std::string& header, const char* total_note) const;

 private:
  struct Sum {
    double ms = 0;
    int calls = 0;
  };
  std::map<std::string, Sum> by_label_;
  double total_ms_ = 0;
};

}  // namespace kev
