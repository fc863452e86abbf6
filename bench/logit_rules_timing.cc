// Host time of one sequence's logits-processing rules per step (engine/logit_processing:
// LogitProcessing::add_rules, which a penalized request runs every decode or verify step) after a
// long prompt: repetition and frequency penalties, a prompt of --prompt random token ids from a
// --vocab vocabulary, one new output token a step. Results go to docs/BENCHMARKS.md ("Serving host
// work on the CPU").
//
//   logit_rules_timing [--prompt 8192] [--steps 500] [--vocab 151936] [--seed 1]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <random>
#include <vector>

#include "engine/logit_processing.h"

int main(int argc, char** argv) {
  int64_t prompt_tokens = 8192, steps = 500, vocab = 151936;
  uint32_t seed = 1;
  CLI::App app{"Host time of LogitProcessing::add_rules per step"};
  app.add_option("--prompt", prompt_tokens, "Prompt tokens")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", steps, "Steps (one output token each)")->check(CLI::Range(1, 100000));
  app.add_option("--vocab", vocab, "Vocabulary size")->check(CLI::Range(2, 1 << 22));
  app.add_option("--seed", seed, "Random seed");
  CLI11_PARSE(app, argc, argv);

  bs::GenerateOptions o;
  o.sampling.repetition_penalty = 1.1f;
  o.sampling.frequency_penalty = 0.2f;
  std::mt19937 rng(seed);
  auto token = [&] { return static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)); };
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens)), committed;
  for (int32_t& t : prompt) t = token();
  bs::detail::LogitProcessing rules(o, prompt);
  std::vector<bs::sampling::LogitRules> out;
  size_t listed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    committed.push_back(token());
    out.clear();
    rules.add_rules(committed, 0, 16, &out);
    listed += out[0].tokens.size();
  }
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("add_rules: {:.2f} us a step ({} steps; {} tokens named on average)\n",
             us / static_cast<double>(steps), steps, listed / static_cast<size_t>(steps));
}
