#include "backend/logit_rules.h"

#include <algorithm>

#include "core/check.h"

namespace bs::sampling {
namespace {

const TokenRule* find_rule(std::span<const TokenRule> rules, int32_t token) {
  const auto it = std::lower_bound(rules.begin(), rules.end(), token,
                                   [](const TokenRule& e, int32_t t) { return e.token < t; });
  return it != rules.end() && it->token == token ? &*it : nullptr;
}

}  // namespace

void apply_logit_rules(std::span<float> row, int64_t r, const LogitRules& rules,
                       std::span<const int32_t> extra) {
  BS_CHECK(r >= 0 && std::ssize(extra) == r);
  const int64_t v = std::ssize(row);
  auto in_extra = [&](int32_t t) {
    return static_cast<int32_t>(std::count(extra.begin(), extra.end(), t));
  };
  const bool blocking = r < rules.stop_rows;
  for (const TokenRule& e : rules.tokens) {
    if (e.token < 0 || e.token >= v) continue;  // e.g. a stop id outside the vocabulary
    float& x = row[static_cast<size_t>(e.token)];
    x = rule_logit(x, e.count + in_extra(e.token), e.bias, e.in_prompt != 0,
                   blocking && e.stop != 0, rules.repetition, rules.frequency, rules.presence);
  }
  // The block's own tokens that no rule names: counted by the block alone, once per token.
  for (int64_t j = 0; j < r; ++j) {
    const int32_t t = extra[static_cast<size_t>(j)];
    BS_CHECK(t >= 0 && t < v);
    if (find_rule(rules.tokens, t) != nullptr ||
        std::find(extra.begin(), extra.begin() + j, t) != extra.begin() + j) {
      continue;
    }
    float& x = row[static_cast<size_t>(t)];
    x = rule_logit(x, in_extra(t), 0.0f, false, false, rules.repetition, rules.frequency,
                   rules.presence);
  }
}

}  // namespace bs::sampling
