// A synthetic tiny model (kev_export --synthetic tiny --seed 7) written once per test program into a
// temporary directory and removed at exit.
#pragma once

#include <string>

namespace kev::test {

const std::string& tiny_model_dir();

}  // namespace kev::test
