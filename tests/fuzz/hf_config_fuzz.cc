// Fuzzes config.json parsing (parse_transformer_config): any JSON document is either a config or
// an error Status, never an exception or a crash.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto doc = nlohmann::json::parse(bs::fuzz::as_text(data, size), nullptr,
                                         /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  auto cfg = bs::io::parse_transformer_config(doc, "config.json");
  if (cfg.ok()) (void)bs::io::rope_type_name(cfg->rope.type);
  return 0;
}
