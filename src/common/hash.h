// FNV-1a, 64-bit: a small stable hash for identities that must not change between runs or machines
// (a snapshot's bytes, a synthetic tensor's seed). Not for security.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kev {

inline uint64_t fnv1a64(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

inline uint64_t fnv1a64(std::string_view s) { return fnv1a64(s.data(), s.size()); }

}  // namespace kev
