// Model block: the weight loader. Every model (target, DFlash family, FlashMap) reads its
// tensors through it: names as given or under "model." (Hugging Face targets keep all but lm_head
// there; drafter exports spell names either way), shape and dtype checks whose errors name the
// tensor, fused (stacked) projections, and a record of the names consumed.
#pragma once

#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"

namespace bs {

class LoadProgress;  // models/weight_budget.h

// The checkpoint name of the first present spelling, each tried as given, then under "model.".
// NotFound names every spelling (and `why`: the config key that asks for the tensor, if any).
Result<std::string> resolve_tensor_name(const io::Checkpoint& ckpt,
                                        std::initializer_list<std::string> spellings,
                                        std::string_view why = {});

class WeightLoader {
 public:
  // `progress` (optional) counts every tensor loaded.
  WeightLoader(const io::Checkpoint& ckpt, Backend& backend, LoadProgress* progress = nullptr)
      : ckpt_(ckpt), backend_(backend), progress_(progress) {}

  Result<std::string> resolve(std::initializer_list<std::string> spellings,
                              std::string_view why = {}) const {
    return resolve_tensor_name(ckpt_, spellings, why);
  }
  bool has(const std::string& name) const { return resolve({name}).ok(); }

  // Loads a float tensor requiring exactly `shape` (errors name the tensor, the file and `why`).
  Result<Tensor> load(const std::string& name, std::vector<int64_t> shape,
                      std::string_view why = {}) {
    return load_any({name}, std::move(shape), why);
  }
  Result<Tensor> load_any(std::initializer_list<std::string> spellings, std::vector<int64_t> shape,
                          std::string_view why = {});
  // Like load, but an absent tensor yields an undefined Tensor.
  Result<Tensor> load_optional(const std::string& name, std::vector<int64_t> shape) {
    return has(name) ? load(name, std::move(shape)) : Tensor();
  }
  // Several tensors stacked along dim 0 as one weight (fused projections: q/k/v rows in one
  // matrix, so one GEMM computes all three). Each part must have exactly its shape in `shapes`;
  // every shape must agree past dim 0.
  Result<Tensor> load_stacked(const std::vector<std::string>& names,
                              const std::vector<std::vector<int64_t>>& shapes);
  // A float tensor converted to fp32 on the host (for load-time folds).
  Result<std::vector<float>> host(const std::string& name, std::vector<int64_t> shape);

  // The checked entry of a float tensor, recorded as used.
  Result<const io::TensorInfo*> info(std::initializer_list<std::string> spellings,
                                     std::vector<int64_t> shape, std::string_view why = {});
  void mark_used(const std::string& full_name) { used_.insert(full_name); }
  // Full checkpoint names consumed so far (leftover checks).
  const std::set<std::string>& used() const { return used_; }

 private:
  const io::Checkpoint& ckpt_;
  Backend& backend_;
  LoadProgress* progress_;
  std::set<std::string> used_;
};

// A dense projection weight [m, k] as loaded, or after to_fp8() as FP8 rows only
// (Backend::quantize_fp8_rows; the loaded tensor is released unless something else holds it).
struct DenseWeight {
  Tensor w;       // [m, k] as loaded; undefined once quantized
  Fp8Weight fp8;  // q [m, k] F8E4M3 + scale [m] once quantized

  void to_fp8(Backend& backend) {
    fp8 = backend.quantize_fp8_rows(w);
    w = Tensor();
  }
  // y[n, m] = x[n, k] · weightᵀ; with accumulate, y += that.
  void apply(Backend& backend, const Tensor& y, const Tensor& x, bool accumulate = false) const {
    if (fp8.defined()) {
      backend.matmul_fp8(y, x, fp8, accumulate);
    } else {
      backend.matmul(y, x, w, nullptr, accumulate);
    }
  }
};

// Uploads host data of shape `shape` (any rank up to 4) as a weight.
Tensor upload(Backend& backend, DType dtype, const void* data, const std::vector<int64_t>& shape);

}  // namespace bs
