#include "models/drafters/draft_draws.h"

#include <fmt/format.h>

#include "models/drafters/dflash.h"
#include "models/weights.h"

namespace bs {

Result<Tensor> load_module_tensor(const io::Checkpoint& ckpt, Backend& backend,
                                  std::initializer_list<std::string> spellings,
                                  std::vector<int64_t> shape, std::string_view why) {
  auto name = drafter_tensor_name(ckpt, spellings);
  if (!name.ok()) return NotFound("{} (needed by {})", name.status().message(), why);
  BS_ASSIGN_OR_RETURN(const io::TensorInfo* info, ckpt.get(*name));
  if (info->shape != shape) {
    return InvalidArgument("{}: tensor '{}' has shape {}, expected {} ({})", ckpt.dir(), *name,
                           io::shape_to_string(info->shape), io::shape_to_string(shape), why);
  }
  return WeightLoader(ckpt, backend, "").load(*name, std::move(shape));
}

bool has_module_tensor(const io::Checkpoint& ckpt, std::initializer_list<std::string> spellings) {
  for (const std::string& n : spellings) {
    if (ckpt.has(n) || ckpt.has("model." + n)) return true;
  }
  return false;
}

void draw_row(Backend& backend, const Tensor& row, const Tensor& out, const DraftDraw& d,
              int64_t j) {
  if (d.filter.temperature <= 0.0f) {
    backend.argmax(out, row);
    return;
  }
  const Tensor q = d.probs.rows(j, 1);
  backend.filtered_probs(q, row, {&d.filter, 1});
  backend.sample_from_probs(out, q, d.uniforms.rows(j, 1));
}

}  // namespace bs
