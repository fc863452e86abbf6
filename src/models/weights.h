// Loads checkpoint tensors into backend weight storage with shape checks that name the tensor.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"

namespace bs {

class LoadProgress;  // models/weight_budget.h

class WeightLoader {
 public:
  // `prefix` is prepended to every name ("model." for HF targets, "" for drafters). `progress`
  // (optional) counts every tensor loaded.
  WeightLoader(const io::Checkpoint& ckpt, Backend& backend, std::string prefix = "",
               LoadProgress* progress = nullptr)
      : ckpt_(ckpt), backend_(backend), prefix_(std::move(prefix)), progress_(progress) {}

  // Loads prefix+name, requiring exactly `shape`.
  Result<Tensor> load(const std::string& name, std::vector<int64_t> shape) const;
  // Like load, but an absent tensor yields an undefined Tensor.
  Result<Tensor> load_optional(const std::string& name, std::vector<int64_t> shape) const;
  // Loads several tensors stacked along dim 0 as one weight (fused projections: q/k/v rows in
  // one matrix, so one GEMM computes all three). Each part must have exactly its shape in
  // `shapes`; every shape must agree past dim 0.
  Result<Tensor> load_stacked(const std::vector<std::string>& names,
                              const std::vector<std::vector<int64_t>>& shapes) const;
  bool has(const std::string& name) const { return ckpt_.has(prefix_ + name); }
  const io::Checkpoint& checkpoint() const { return ckpt_; }

 private:
  const io::Checkpoint& ckpt_;
  Backend& backend_;
  std::string prefix_;
  LoadProgress* progress_;
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
