// Compact string → id table: token bytes in one arena, open addressing over ids. Used for the
// BPE vocab (151k entries for Qwen3), where std::unordered_map<std::string, int> costs one
// allocation per token and a cache miss per probe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bs {

class TokenTable {
 public:
  // Adds or replaces the mapping token → id (the last one wins for a repeated token; the first
  // token stays the string of a repeated id).
  void insert(std::string_view token, int32_t id);
  // Id of `token`, or -1.
  int32_t find(std::string_view token) const;
  // Token string of `id`; `found` tells whether the id has one.
  std::string_view token(int32_t id, bool* found = nullptr) const;
  // Hints that `token` will be looked up soon (bulk loops prefetch a few entries ahead).
  void prefetch(std::string_view token) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[hash(token) & (slots_.size() - 1)]);
  }
  // Highest id + 1.
  int32_t id_limit() const { return static_cast<int32_t>(spans_.size()); }
  size_t size() const { return count_; }
  void reserve(size_t tokens, size_t bytes);

  static uint64_t hash(std::string_view s);

 private:
  struct Slot {
    uint32_t tag;     // upper hash bits, to skip most string compares
    int32_t id;       // -1: empty
    uint32_t offset;  // token bytes in arena_
    uint32_t length;
  };
  std::string_view text(const Slot& s) const {
    return std::string_view(arena_).substr(s.offset, s.length);
  }
  void rehash(size_t capacity);

  std::string arena_;                                 // token bytes, concatenated
  std::vector<Slot> slots_;                           // open addressing, linear probing
  std::vector<std::pair<uint32_t, uint32_t>> spans_;  // per id: (offset, length) of its token
  size_t count_ = 0;
  static constexpr uint32_t kNoToken = 0xFFFFFFFFu;
};

}  // namespace bs
