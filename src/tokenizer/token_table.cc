#include "tokenizer/token_table.h"

#include <cstring>

namespace bs {

uint64_t TokenTable::hash(std::string_view s) {
  // 8 bytes at a time, multiply-xorshift mixing (tokens are short).
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

void TokenTable::reserve(size_t tokens, size_t bytes) {
  arena_.reserve(bytes);
  size_t cap = 16;
  while (cap < 2 * tokens) cap <<= 1;
  if (cap > slots_.size()) rehash(cap);
}

void TokenTable::rehash(size_t capacity) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{0, -1, 0, 0});
  const size_t mask = capacity - 1;
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    size_t i = hash(text(s)) & mask;
    while (slots_[i].id >= 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void TokenTable::insert(std::string_view token, int32_t id) {
  if (id < 0) return;
  if (2 * (count_ + 1) > slots_.size()) rehash(slots_.empty() ? 16 : 2 * slots_.size());
  if (static_cast<size_t>(id) >= spans_.size()) {
    spans_.resize(static_cast<size_t>(id) + 1, {kNoToken, 0});
  }
  const uint64_t h = hash(token);
  const auto tag = static_cast<uint32_t>(h >> 32);
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  for (; slots_[i].id >= 0; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.tag == tag && text(s) == token) {
      s.id = id;  // repeated token: the last id wins
      if (spans_[id].first == kNoToken) spans_[id] = {s.offset, s.length};
      return;
    }
  }
  const auto offset = static_cast<uint32_t>(arena_.size());
  const auto length = static_cast<uint32_t>(token.size());
  arena_.append(token);
  slots_[i] = Slot{tag, id, offset, length};
  ++count_;
  if (spans_[id].first == kNoToken) spans_[id] = {offset, length};
}

int32_t TokenTable::find(std::string_view token) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash(token);
  const auto tag = static_cast<uint32_t>(h >> 32);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.id < 0) return -1;
    if (s.tag == tag && s.length == token.size() &&
        std::memcmp(arena_.data() + s.offset, token.data(), token.size()) == 0) {
      return s.id;
    }
  }
}

std::string_view TokenTable::token(int32_t id, bool* found) const {
  const bool ok = id >= 0 && id < id_limit() && spans_[id].first != kNoToken;
  if (found != nullptr) *found = ok;
  return ok ? std::string_view(arena_).substr(spans_[id].first, spans_[id].second)
            : std::string_view();
}

}  // namespace bs
