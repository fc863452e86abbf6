// Engine-side acceptance evaluation on a prompt set (tools/train/eval_prompts.json): tau and
// per-position acceptance of a drafter at a given temperature, and wall-clock speed of plain vs
// speculative decoding on the same prompts. Results go to docs/BENCHMARKS.md.
//
//   eval_acceptance --model DIR --drafter DIR --prompts FILE [--n 32] [--max-new 192]
//                   [--temperature 0] [--seed 0] [--flashmap-steps N] [--noise-scale S]
//                   [--device cpu|cuda|auto] [--drafter-fp8]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "io/json_file.h"
#include "models/drafter.h"
#include "models/registry.h"

int main(int argc, char** argv) {
  std::string model, drafter_dir, prompts_path, device = "cpu";
  int n = 32, max_new = 192, threads = 1, flashmap_steps = 0;
  float temperature = 0, noise_scale = 1;
  uint64_t seed = 0;
  bool drafter_fp8 = false;
  CLI::App app{"Acceptance and speed of a drafter on a prompt set"};
  app.add_option("--model", model)->required();
  app.add_option("--drafter", drafter_dir)->required();
  app.add_option("--prompts", prompts_path)->required();
  app.add_option("--n", n);
  app.add_option("--max-new", max_new);
  app.add_option("--temperature", temperature);
  app.add_option("--seed", seed);
  app.add_option("--threads", threads);
  app.add_option("--device", device, "cpu (default), cuda or auto");
  app.add_option("--flashmap-steps", flashmap_steps);
  app.add_option("--noise-scale", noise_scale);
  app.add_flag("--drafter-fp8", drafter_fp8, "DFlash weights in FP8 (one scale per row)");
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const bs::Status& s) {
    fmt::print(stderr, "error: {}\n", s.message());
    return 1;
  };
  auto made = bs::make_backend(device, threads);
  if (!made.ok()) return fail(made.status());
  auto backend = std::move(*made);
  auto target = bs::load_target(model, *backend);
  if (!target.ok()) return fail(target.status());
  auto drafter = bs::load_drafter(drafter_dir, **target,
                                  {.flashmap_steps = flashmap_steps,
                                   .flashmap_noise_scale = noise_scale,
                                   .fp8_weights = drafter_fp8});
  if (!drafter.ok()) return fail(drafter.status());
  auto doc = bs::io::read_json_file(prompts_path);
  if (!doc.ok()) return fail(doc.status());
  const auto& prompts = (*doc)["prompts"];

  int64_t steps = 0, accepted = 0, tokens_plain = 0, tokens_spec = 0;
  double plain_s = 0, spec_s = 0;
  std::vector<int64_t> offered, acc;
  for (int i = 0; i < n && i < static_cast<int>(prompts.size()); ++i) {
    const std::vector<int32_t> ids = prompts[i]["ids"].get<std::vector<int32_t>>();
    bs::GenerateOptions opt;
    opt.max_tokens = max_new;
    opt.sampling = {.temperature = temperature, .seed = seed + static_cast<uint64_t>(i)};
    bs::GenerateStats ps, ss;
    auto plain = bs::generate_plain(**target, ids, opt, nullptr, &ps);
    auto spec = bs::generate_speculative(**target, **drafter, ids, opt, nullptr, &ss);
    if (!plain.ok()) return fail(plain.status());
    if (!spec.ok()) return fail(spec.status());
    if (temperature == 0 && *plain != *spec) {
      fmt::print(stderr, "error: prompt {}: speculative output differs from plain\n", i);
      return 1;
    }
    steps += ss.steps;
    accepted += ss.accepted;
    tokens_plain += ps.generated_tokens;
    tokens_spec += ss.generated_tokens;
    plain_s += ps.decode_seconds;
    spec_s += ss.decode_seconds;
    offered.resize(ss.position_offered.size());
    acc.resize(ss.position_accepted.size());
    for (size_t k = 0; k < offered.size(); ++k) {
      offered[k] += ss.position_offered[k];
      acc[k] += ss.position_accepted[k];
    }
  }
  std::string per_pos;
  for (size_t k = 0; k < offered.size(); ++k) {
    per_pos += fmt::format("{}{:.2f}", k ? " " : "",
                           offered[k] ? static_cast<double>(acc[k]) / offered[k] : 0.0);
  }
  const double tps_plain = tokens_plain / plain_s, tps_spec = tokens_spec / spec_s;
  fmt::print("drafter {} T={} prompts {} steps {}: tau {:.2f}\n", (*drafter)->family(), temperature,
             n, steps, static_cast<double>(accepted + steps) / steps);
  fmt::print("per-position acceptance: {}\n", per_pos);
  fmt::print("decode tokens/s: plain {:.0f}, speculative {:.0f}, speedup {:.2f}x\n", tps_plain,
             tps_spec, tps_spec / tps_plain);
  return 0;
}
