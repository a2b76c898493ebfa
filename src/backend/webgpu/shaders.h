// The WGSL kernels of src/backend/webgpu/*.wgsl, embedded at build time by cmake/webgpu.cmake (one
// entry per file, named by the file's stem).
#pragma once

#include <cstddef>
#include <string_view>

namespace kev::webgpu {

struct WgslSource {
  const char* name;  // file stem, e.g. "gated_delta_net"
  const char* code;
};

extern const WgslSource kWgslSources[];
extern const size_t kWgslSourceCount;

// The source of `name`, or null.
const char* find_wgsl(std::string_view name);

}  // namespace kev::webgpu
