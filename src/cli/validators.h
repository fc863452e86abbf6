// Range checks for command-line options whose messages a user can read, e.g.
// "--max-tokens: must be at least 1, got 0" (CLI11's PositiveNumber / NonNegativeNumber print
// their range as two 309-digit numbers).
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <limits>
#include <string>

#include "engine/generate.h"

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

// --verify-budget auto|off (GenerateOptions::verify_budget, docs/DFLASH.md).
inline CLI::Option* add_verify_budget_option(CLI::App* app, VerifyBudget* out) {
  return app
      ->add_option_function<std::string>(
          "--verify-budget",
          [out](const std::string& v) {
            *out = v == "auto" ? VerifyBudget::kAuto : VerifyBudget::kOff;
          },
          "Verify-length scheduling across a batch step (DSpark Algorithm 1): auto or off "
          "(default: off, every draft verified)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto" || v == "off") return {};
            return fmt::format("must be auto or off, got '{}'", v);
          },
          "auto|off"));
}

// The speculative step's phase times of `st` (GenerateStats), in milliseconds.
inline std::string phase_times(const GenerateStats& st) {
  return fmt::format(
      "propose {:.1f} ms, verify {:.1f} ms, accept + read-back {:.1f} ms, commit "
      "{:.1f} ms, observe {:.1f} ms",
      st.draft_seconds * 1e3, st.verify_seconds * 1e3, st.accept_seconds * 1e3,
      st.commit_seconds * 1e3, st.observe_seconds * 1e3);
}

}  // namespace bs::cli
