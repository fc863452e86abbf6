#include "models/drafters/draft_draws.h"

#include <fmt/format.h>

#include "models/blocks/weights.h"

namespace bs {

Result<Tensor> load_module_tensor(const io::Checkpoint& ckpt, Backend& backend,
                                  std::initializer_list<std::string> spellings,
                                  std::vector<int64_t> shape, std::string_view why) {
  return WeightLoader(ckpt, backend).load_any(spellings, std::move(shape), why);
}

bool has_module_tensor(const io::Checkpoint& ckpt, std::initializer_list<std::string> spellings) {
  return resolve_tensor_name(ckpt, spellings).ok();
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
