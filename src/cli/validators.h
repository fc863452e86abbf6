// Range checks for command-line options whose messages a user can read, e.g.
// "--max-tokens: must be at least 1, got 0" (CLI11's PositiveNumber / NonNegativeNumber print
// their range as two 309-digit numbers).
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <limits>
#include <string>

namespace bs::cli {

// Numbers in [min, max]; an infinite bound is no bound.
inline CLI::Validator number_in(double min, double max) {
  const bool has_max = max < std::numeric_limits<double>::infinity();
  const std::string want =
      has_max ? fmt::format("between {} and {}", min, max) : fmt::format("at least {}", min);
  return CLI::Validator(
      [min, max, want](std::string& value) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(value, v) || std::isnan(v)) {
          return fmt::format("must be a number ({}), got '{}'", want, value);
        }
        if (v < min || v > max) return fmt::format("must be {}, got {}", want, value);
        return {};
      },
      has_max ? fmt::format("NUMBER in [{}, {}]", min, max) : fmt::format("NUMBER >= {}", min));
}

inline CLI::Validator at_least(double min) {
  return number_in(min, std::numeric_limits<double>::infinity());
}

}  // namespace bs::cli
