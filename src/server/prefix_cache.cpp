#include "server/prefix_cache.h"

#include "common/hash.h"

namespace kev {

size_t PrefixKeyHash::operator()(const PrefixKey& key) const {
  const uint64_t h = fnv1a64(key.tokens.data(), key.tokens.size() * sizeof(int32_t));
  return static_cast<size_t>(h ^ (fnv1a64(key.model) * 1099511628211ull));
}

PrefixCache::PrefixCache(PrefixCacheLimits limits) : limits_(limits) {}

std::shared_ptr<const Prefix> PrefixCache::find(const PrefixKey& key) {
  const auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->prefix;
}

void PrefixCache::insert(PrefixKey key, std::shared_ptr<const Prefix> prefix) {
  const auto n = static_cast<int64_t>(key.tokens.size());
  if (limits_.max_entries == 0 || n > limits_.max_tokens) return;
  if (const auto it = index_.find(key); it != index_.end()) {
    tokens_ -= static_cast<int64_t>(it->second->key.tokens.size());
    order_.erase(it->second);
    index_.erase(it);
  }
  while (!order_.empty() && (order_.size() >= limits_.max_entries || tokens_ + n > limits_.max_tokens)) {
    evict_oldest();
  }
  order_.push_front(Entry{std::move(key), std::move(prefix)});
  index_.emplace(order_.front().key, order_.begin());
  tokens_ += n;
}

void PrefixCache::evict_oldest() {
  tokens_ -= static_cast<int64_t>(order_.back().key.tokens.size());
  index_.erase(order_.back().key);
  order_.pop_back();
}

}  // namespace kev
