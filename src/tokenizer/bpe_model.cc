#include "tokenizer/bpe_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <mutex>

#include "tokenizer/unicode.h"

namespace bs {

using json_util::Json;
using json_util::JsonPath;

namespace {

constexpr char32_t kDirectChars = 0x800;  // code points with a direct id table
constexpr size_t kLinearMergeMax = 24;    // words up to this many symbols skip the heap

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

// Open-addressing hash table: (left id, right id) → (rank, merged id).
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key;
    uint32_t rank;
    int32_t id;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<Slot> slots;
  uint64_t mask = 0;

  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  void init(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots.assign(cap, Slot{kEmpty, 0, 0});
    mask = cap - 1;
  }
  void insert_or_assign(uint64_t key, uint32_t rank, int32_t id) {
    for (uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty || slots[i].key == key) {
        slots[i] = Slot{key, rank, id};
        return;
      }
    }
  }
  const Slot* find(uint64_t key) const {
    for (uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// Direct-mapped cache of encoded words with striped locks: a colliding word simply evicts.
struct BpeModel::WordCache {
  static constexpr size_t kSlots = 1 << 15;
  static constexpr size_t kStripes = 64;
  static constexpr size_t kMaxWordBytes = 128;
  struct Slot {
    uint64_t hash = 0;
    std::string key;
    std::vector<int32_t> ids;
  };
  std::vector<Slot> slots = std::vector<Slot>(kSlots);
  std::array<std::mutex, kStripes> locks;

  bool lookup(std::string_view word, uint64_t h, std::vector<int32_t>& out) {
    const size_t i = h & (kSlots - 1);
    std::lock_guard<std::mutex> lock(locks[i % kStripes]);
    const Slot& s = slots[i];
    if (s.hash != h || s.key != word) return false;
    out.insert(out.end(), s.ids.begin(), s.ids.end());
    return true;
  }
  void store(std::string_view word, uint64_t h, const int32_t* ids, size_t n) {
    const size_t i = h & (kSlots - 1);
    std::lock_guard<std::mutex> lock(locks[i % kStripes]);
    Slot& s = slots[i];
    s.hash = h;
    s.key.assign(word);
    s.ids.assign(ids, ids + n);
  }
};

BpeModel::BpeModel()
    : merges_(std::make_unique<MergeTable>()), cache_(std::make_unique<WordCache>()) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  std::fill(std::begin(byte_char_ids_), std::end(byte_char_ids_), -1);
}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

Result<BpeModel> BpeModel::build(TokenizerJson& tj, const JsonPath& at) {
  const Json* config = json_util::member(tj.doc, "model");
  if (config == nullptr || !config->is_object()) return at.error("must be an object");
  if (!tj.vocab_captured) return at.child("vocab").error("must be an object of token → id");
  if (!tj.merges_captured) return at.child("merges").error("must be an array");
  if (!tj.vocab_error.empty()) return InvalidArgument("{}: {}", at.file, tj.vocab_error);

  BpeModel m;
  BS_ASSIGN_OR_RETURN(m.byte_fallback_, json_util::get_bool(*config, "byte_fallback", at, false));
  BS_ASSIGN_OR_RETURN(m.fuse_unk_, json_util::get_bool(*config, "fuse_unk", at, false));
  BS_ASSIGN_OR_RETURN(m.ignore_merges_, json_util::get_bool(*config, "ignore_merges", at, false));
  BS_ASSIGN_OR_RETURN(m.continuing_subword_prefix_,
                      json_util::get_string(*config, "continuing_subword_prefix", at, ""));
  BS_ASSIGN_OR_RETURN(m.end_of_word_suffix_,
                      json_util::get_string(*config, "end_of_word_suffix", at, ""));
  BS_ASSIGN_OR_RETURN(std::string unk_token, json_util::get_string(*config, "unk_token", at, ""));

  size_t bytes = 0;
  for (const auto& [token, id] : tj.vocab) bytes += token.size();
  m.vocab_.reserve(tj.vocab.size(), bytes);
  constexpr size_t kAhead = 16;  // prefetch distance for the bulk hash-table loops
  for (size_t i = 0; i < tj.vocab.size(); ++i) {
    if (i + kAhead < tj.vocab.size()) m.vocab_.prefetch(tj.vocab[i + kAhead].first);
    m.vocab_.insert(tj.vocab[i].first, static_cast<int32_t>(tj.vocab[i].second));
  }
  tj.vocab.clear();
  tj.vocab.shrink_to_fit();

  m.char_ids_.assign(kDirectChars, -1);
  std::string s;
  for (char32_t cp = 0; cp < kDirectChars; ++cp) {
    s.clear();
    unicode::append_utf8(s, cp);
    m.char_ids_[cp] = m.vocab_.find(s);
  }
  for (int b = 0; b < 256; ++b) {
    m.byte_ids_[b] = m.vocab_.find(fmt::format("<0x{:02X}>", b));
    m.byte_char_ids_[b] = m.char_ids_[unicode::byte_to_code_point(static_cast<unsigned char>(b))];
  }
  if (!unk_token.empty()) m.unk_id_ = m.vocab_.find(unk_token);

  // Merges: rank = position; a repeated pair keeps its last rank (as HF tokenizers do).
  const std::string& prefix = m.continuing_subword_prefix_;
  m.merges_->init(tj.merges.size());
  std::string merged;
  std::string ahead;
  for (size_t rank = 0; rank < tj.merges.size(); ++rank) {
    if (rank + kAhead < tj.merges.size()) {
      const auto& [pa, pb] = tj.merges[rank + kAhead];
      m.vocab_.prefetch(pa);
      m.vocab_.prefetch(pb);
      ahead.assign(pa).append(pb);
      m.vocab_.prefetch(ahead);
    }
    const auto& [a, b] = tj.merges[rank];
    const int32_t ida = m.vocab_.find(a);
    const int32_t idb = m.vocab_.find(b);
    merged = a;
    if (!prefix.empty() && b.compare(0, prefix.size(), prefix) == 0) {
      merged.append(b, prefix.size());
    } else {
      merged.append(b);
    }
    const int32_t idm = m.vocab_.find(merged);
    if (ida < 0 || idb < 0 || idm < 0) {
      const std::string& missing = ida < 0 ? a : idb < 0 ? b : merged;
      return at.child("merges").index(rank).error(
          fmt::format("refers to '{}', which is not in model.vocab", missing));
    }
    m.merges_->insert_or_assign(pair_key(ida, idb), static_cast<uint32_t>(rank), idm);
  }
  m.merge_count_ = tj.merges.size();
  tj.merges.clear();
  tj.merges.shrink_to_fit();
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const int32_t id = vocab_.find(token);
  return id < 0 ? std::nullopt : std::optional<int32_t>(id);
}

std::optional<std::string_view> BpeModel::id_to_token(int32_t id) const {
  bool found = false;
  const std::string_view token = vocab_.token(id, &found);
  return found ? std::optional<std::string_view>(token) : std::nullopt;
}

// Splits a word into initial symbols: one per character (with continuing-subword prefix /
// end-of-word suffix), byte tokens for unknown characters under byte_fallback, else unk.
void BpeModel::word_symbols(std::string_view word, bool raw_bytes, Scratch& scratch) const {
  auto& symbols = scratch.symbols;
  symbols.clear();
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Scratch::Symbol{id, n - 1, n + 1});
  };
  const bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  if (raw_bytes && !affixes) {
    // Byte-level: every byte is one character of the mapped word.
    for (char c : word) {
      const int32_t id = byte_char_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) {
        add(id);
      } else if (unk_id_ >= 0 && !(fuse_unk_ && !symbols.empty() && symbols.back().id == unk_id_)) {
        add(unk_id_);
      }
    }
  } else {
    if (raw_bytes) {  // map first, then take the general path
      scratch.mapped.clear();
      for (char c : word) {
        unicode::append_utf8(scratch.mapped, unicode::byte_to_code_point(c));
      }
      word = scratch.mapped;
    }
    bool pending_unk = false;
    auto flush_unk = [&] {
      if (pending_unk) add(unk_id_);
      pending_unk = false;
    };
    std::string affixed;
    size_t pos = 0;
    while (pos < word.size()) {
      const size_t start = pos;
      const char32_t cp = unicode::next_code_point(word, pos);
      const std::string_view ch = word.substr(start, pos - start);
      int32_t id;
      if (!affixes) {
        id = cp < kDirectChars ? char_ids_[cp] : vocab_.find(ch);
      } else {
        affixed.clear();
        if (start > 0) affixed.append(continuing_subword_prefix_);
        affixed.append(ch);
        if (pos == word.size()) affixed.append(end_of_word_suffix_);
        id = vocab_.find(affixed);
      }
      if (id >= 0) {
        flush_unk();
        add(id);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
        if (all) {
          flush_unk();
          for (char c : ch) add(byte_ids_[static_cast<unsigned char>(c)]);
          continue;
        }
      }
      if (unk_id_ >= 0) {
        if (!fuse_unk_) flush_unk();
        pending_unk = true;
      }
    }
    flush_unk();
  }
  if (!symbols.empty()) symbols.back().next = -1;
}

void BpeModel::merge_word(Scratch& scratch) const {
  auto& symbols = scratch.symbols;
  // A word of characters the vocabulary lacks, with no unk token, has no symbols at all.
  if (symbols.empty()) return;
  if (symbols.size() <= kLinearMergeMax) {
    // Short words: rescan the few candidate pairs instead of maintaining a heap. Same order:
    // lowest rank first, leftmost on ties.
    uint32_t rank[kLinearMergeMax];
    int32_t merged[kLinearMergeMax];
    auto update = [&](int32_t i) {
      const int32_t j = symbols[i].next;
      const auto* m = j < 0 ? nullptr : merges_->find(pair_key(symbols[i].id, symbols[j].id));
      rank[i] = m == nullptr ? UINT32_MAX : m->rank;
      merged[i] = m == nullptr ? -1 : m->id;
    };
    for (size_t i = 0; i < symbols.size(); ++i) update(static_cast<int32_t>(i));
    for (;;) {
      int32_t best = -1;
      for (int32_t i = 0; i >= 0; i = symbols[i].next) {
        if (rank[i] != UINT32_MAX && (best < 0 || rank[i] < rank[best])) best = i;
      }
      if (best < 0) break;
      const int32_t j = symbols[best].next;
      symbols[best].id = merged[best];
      symbols[best].next = symbols[j].next;
      if (symbols[j].next >= 0) symbols[symbols[j].next].prev = best;
      if (symbols[best].prev >= 0) update(symbols[best].prev);
      update(best);
    }
    return;
  }

  auto& heap = scratch.heap;
  auto& dead = scratch.dead;
  // Min-heap on (rank, position): the lowest-ranked pair, leftmost on ties.
  auto after = [](const Scratch::Candidate& a, const Scratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto consider = [&](int32_t i) {
    const int32_t j = symbols[i].next;
    if (j < 0) return;
    if (const auto* m = merges_->find(pair_key(symbols[i].id, symbols[j].id))) {
      heap.push_back(Scratch::Candidate{m->rank, i});
      std::push_heap(heap.begin(), heap.end(), after);
    }
  };
  heap.clear();
  dead.assign(symbols.size(), 0);
  for (size_t i = 0; i + 1 < symbols.size(); ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const Scratch::Candidate top = heap.back();
    heap.pop_back();
    const int32_t i = top.pos;
    if (dead[i]) continue;
    const int32_t j = symbols[i].next;
    if (j < 0) continue;
    const auto* m = merges_->find(pair_key(symbols[i].id, symbols[j].id));
    if (m == nullptr || m->rank != top.rank) continue;  // stale: the pair has changed
    symbols[i].id = m->id;
    dead[j] = 1;
    symbols[i].next = symbols[j].next;
    if (symbols[j].next >= 0) symbols[symbols[j].next].prev = i;
    if (symbols[i].prev >= 0) consider(symbols[i].prev);
    consider(i);
  }
}

void BpeModel::encode_word(std::string_view word, bool raw_bytes, Scratch& scratch,
                           std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    int32_t id;
    if (raw_bytes) {
      scratch.mapped.clear();
      for (char c : word) unicode::append_utf8(scratch.mapped, unicode::byte_to_code_point(c));
      id = vocab_.find(scratch.mapped);
    } else {
      id = vocab_.find(word);
    }
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() == 1 && raw_bytes && byte_char_ids_[static_cast<unsigned char>(word[0])] >= 0 &&
      continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
    out.push_back(byte_char_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  const uint64_t h = cacheable ? TokenTable::hash(word) : 0;
  if (cacheable && cache_->lookup(word, h, out)) return;
  word_symbols(word, raw_bytes, scratch);
  merge_word(scratch);
  const size_t first = out.size();
  const auto& symbols = scratch.symbols;
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    out.push_back(symbols[i].id);
  }
  if (cacheable) cache_->store(word, h, out.data() + first, out.size() - first);
}

}  // namespace bs
