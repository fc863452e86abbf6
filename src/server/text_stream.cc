#include "server/text_stream.h"

#include <algorithm>
#include <utility>

namespace bs::server {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop,
                       std::span<const int32_t> context, TextStreamOptions options)
    : decoder_(tokenizer, options.skip_special_tokens, context),
      include_stop_(options.include_stop),
      min_tokens_(options.min_tokens) {
  for (auto& s : stop) {
    if (!s.empty()) stop_.push_back(std::move(s));
  }
}

std::string TextStream::push(int32_t id) {
  if (stopped_) return {};
  pending_ += decoder_.push(id);
  ++pushed_;
  return release();
}

std::string TextStream::finish() {
  if (stopped_) return {};
  pending_ += decoder_.flush();
  std::string out = release();
  if (!stopped_) out += std::exchange(pending_, {});
  return out;
}

std::string TextStream::release() {
  // Earliest stop string occurrence in the pending text (held-back text never contains a
  // whole stop string, so no match is missed across pushes).
  size_t cut = std::string::npos, matched = 0;
  // Before min_tokens tokens nothing matches (vLLM checks stop strings only from then on).
  for (size_t i = 0; i < stop_.size() && pushed_ >= min_tokens_; ++i) {
    const size_t at = pending_.find(stop_[i]);
    if (at < cut) cut = at, matched = stop_[i].size();  // the earliest; the first listed on a tie
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, include_stop_ ? cut + matched : cut);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& s : stop_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

TokenTexts::TokenTexts(const Tokenizer& tokenizer, std::span<const int32_t> context)
    : decoder_(tokenizer, /*skip_special_tokens=*/false, context) {}

std::string TokenTexts::text(int32_t id) const {
  // A copy of the decoder takes the token and gives everything it holds (what the context held
  // is dropped by the decoder unless the token changed it, e.g. completed a character).
  StreamDecoder d = decoder_;
  std::string out = d.push(id);
  out += d.flush();
  return out;
}

void TokenTexts::commit(int32_t id) { decoder_.add_context({&id, 1}); }

}  // namespace bs::server
