#include "support/tiny_model.h"

#include <filesystem>
#include <mutex>

#include <unistd.h>

#include <gtest/gtest.h>

#include "model/synthetic.h"

namespace kev::test {

const std::string& tiny_model_dir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    dir = (std::filesystem::temp_directory_path() / ("kev-test-tiny-" + std::to_string(::getpid()))).string();
    SyntheticOptions o;
    o.kind = "tiny";
    o.seed = 7;
    o.tokenizer_path = KEV_QWEN3_TOKENIZER;
    o.out_dir = dir;
    const Status st = write_synthetic_model(o);
    if (!st.ok()) ADD_FAILURE() << "cannot write the synthetic tiny model: " << st.to_string();
    std::atexit([] { std::filesystem::remove_all(dir); });
  });
  return dir;
}

}  // namespace kev::test
