// Subcommands that live in their own files register here; main() dispatches to them.
#pragma once

#include <CLI/CLI.hpp>

namespace bs::cli {

// `blockspec bench ...` (bench.cc).
void register_bench(CLI::App& app);
// Runs whichever registered subcommand was parsed; 1 when none.
int run_registered(CLI::App& app);

}  // namespace bs::cli
