// PrefixCache: the server's LRU of state snapshots, so a state seen recently skips its state pass.
//
//   PrefixCache cache({.max_entries = 16, .max_tokens = 65536});
//   PrefixKey key{model_key, state_tokens};
//   std::shared_ptr<const Prefix> p = cache.find(key);          // nullptr on a miss; a hit becomes newest
//   if (!p) { p = make(...); cache.insert(std::move(key), p); } // evicts the oldest entries to fit
//
// Keyed by the state's token ids (after any truncation) plus a model key (checkpoint id + backend), so
// two texts that tokenise alike share an entry and two models never do. Bounded both by entries and by
// the total state tokens of the entries. Entries are shared_ptrs: a Prefix evicted while a batch still
// uses it lives until that batch ends.
// Thread-safety: none; the model worker is its only user.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kev/kev.h"

namespace kev {

struct PrefixKey {
  std::string model;            // checkpoint id + backend name
  std::vector<int32_t> tokens;  // the state's ids as the state pass sees them
  bool operator==(const PrefixKey&) const = default;
};

struct PrefixKeyHash {
  size_t operator()(const PrefixKey& key) const;
};

struct PrefixCacheLimits {
  size_t max_entries = 16;     // 0 disables the cache
  int64_t max_tokens = 65536;  // sum of the entries' state tokens; a longer state is never cached
};

class PrefixCache {
 public:
  explicit PrefixCache(PrefixCacheLimits limits);

  std::shared_ptr<const Prefix> find(const PrefixKey& key);
  // Replaces an entry with the same key. Does nothing when the state alone exceeds the limits.
  void insert(PrefixKey key, std::shared_ptr<const Prefix> prefix);

  size_t entries() const { return order_.size(); }
  int64_t tokens() const { return tokens_; }

 private:
  struct Entry {
    PrefixKey key;
    std::shared_ptr<const Prefix> prefix;
  };
  void evict_oldest();

  PrefixCacheLimits limits_;
  std::list<Entry> order_;  // newest first
  std::unordered_map<PrefixKey, std::list<Entry>::iterator, PrefixKeyHash> index_;
  int64_t tokens_ = 0;
};

}  // namespace kev
