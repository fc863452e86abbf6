// The drafter half of the model registry: maps a drafter checkpoint's config.json to a family.
//   DFlash    architectures contains "DFlashDraftModel", or (no architectures) a dflash_config
//             that is not DSpark's / DFlash2's
//   DSpark    architectures containing "DSpark" (any case: DeepSpec's "Qwen3DSparkModel"), or
//             model_type "dspark", or (no architectures) a dflash_config and projector_type
//             "dspark" or markov_rank (in dflash_config or at the top level)
//   DFlash2   architectures containing "DFlash2", or (no architectures) a dflash_config and
//             conv_kernel_size or selector_rank (in dflash_config or at the top level)
//   FlashMap  architectures containing "FlashMap", or a config with time_grids /
//             timestep_embed_dim (top level or one object deep)
// Anything else: Unimplemented, naming the architecture. This is the only place that maps a
// config to a drafter class.
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "io/json_file.h"
#include "models/drafter.h"
#include "models/drafters/dflash.h"
#include "models/drafters/dflash2.h"
#include "models/drafters/dspark.h"
#include "models/drafters/flashmap.h"

namespace bs {
namespace {

using nlohmann::json;

bool has_key_shallow(const json& j, const char* key) {
  if (!j.is_object()) return false;
  if (j.contains(key)) return true;
  for (const auto& [k, v] : j.items()) {
    if (v.is_object() && v.contains(key)) return true;
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<Drafter>> load_drafter(const std::string& dir, const CausalLM& target,
                                              const DrafterOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return NotFound("drafter directory '{}' does not exist", dir);
  }
  const std::string file = (fs::path(dir) / "config.json").string();
  if (!fs::exists(file, ec)) return NotFound("drafter config '{}' does not exist", file);
  BS_ASSIGN_OR_RETURN(json config, io::read_json_file(file));
  if (!config.is_object()) {
    return InvalidArgument("{}: expected a JSON object, got {}", file, io::json_type_name(config));
  }
  BS_ASSIGN_OR_RETURN(std::vector<std::string> archs,
                      io::get_string_list_or_empty(config, "architectures", file));
  auto arch_has = [&](std::string_view needle, bool exact) {
    return std::any_of(archs.begin(), archs.end(), [&](const std::string& a) {
      return exact ? a == needle : a.find(needle) != std::string::npos;
    });
  };
  const std::string arch_list =
      archs.empty() ? "(none)" : fmt::format("{}", fmt::join(archs, ", "));

  if (arch_has("DFlashDraftModel", true)) return load_dflash(dir, config, target, options);
  if (names_dspark(config)) return load_dspark(dir, config, target, options);
  if (arch_has("DFlash2", false)) return load_dflash2(dir, config, target, options);
  if (arch_has("FlashMap", false) || has_key_shallow(config, "time_grids") ||
      has_key_shallow(config, "timestep_embed_dim")) {
    if (options.fp8_weights) {
      return InvalidArgument(
          "{}: FP8 drafter weights (--drafter-fp8) are implemented for DFlash drafters only, and "
          "this is a FlashMap drafter",
          dir);
    }
    return load_flashmap(dir, config, target, options);
  }
  if (archs.empty() && io::has_field(config, "dflash_config")) {
    const json& d = config["dflash_config"];
    // A key in dflash_config or at the top level (the loaders read both).
    const auto has = [&](const char* key) {
      return (d.is_object() && d.contains(key)) || config.contains(key);
    };
    const auto is_dspark = [](const json& c) {
      return c.is_object() && c.contains("projector_type") && c["projector_type"] == "dspark";
    };
    const bool dspark = is_dspark(d) || is_dspark(config) || has("markov_rank");
    const bool dflash2 = has("conv_kernel_size") || has("selector_rank");
    if (dspark) return load_dspark(dir, config, target, options);
    if (dflash2) return load_dflash2(dir, config, target, options);
    return load_dflash(dir, config, target, options);
  }
  return Unimplemented(
      "{}: unsupported drafter architecture '{}' (supported: DFlashDraftModel, DSparkDraftModel, "
      "DFlash2DraftModel, FlashMap)",
      file, arch_list);
}

}  // namespace bs
