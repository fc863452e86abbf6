// Subcommands that live in their own files register here; main() dispatches to them.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace bs::cli {

// `blockspec bench ...` (bench.cc).
void register_bench(CLI::App& app);
// Runs whichever registered subcommand was parsed; 1 when none.
int run_registered(CLI::App& app);

// `blockspec serve ...` (serve.cc). run_serve_if_parsed: false when serve was not parsed.
void register_serve(CLI::App& app);
bool run_serve_if_parsed(int* rc);

// The model and drafter folders a command uses: without --model, the embedded stories260K (under
// $BLOCKSPEC_MODELS or the source tree's models/) and its best shipped drafter unless
// --drafter or --no-drafter says otherwise (model_dirs.cc).
struct ModelDirs {
  std::string model;
  std::string drafter;  // empty: plain decoding
};
ModelDirs resolve_model_dirs(const std::string& model, const std::string& drafter, bool no_drafter);

}  // namespace bs::cli
