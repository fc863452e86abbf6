#include "models/weights.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "models/weight_budget.h"

namespace bs {

Tensor upload(Backend& backend, DType dtype, const void* data, const std::vector<int64_t>& s) {
  switch (s.size()) {
    case 1:
      return backend.upload_weight(dtype, data, {s[0]});
    case 2:
      return backend.upload_weight(dtype, data, {s[0], s[1]});
    case 3:
      return backend.upload_weight(dtype, data, {s[0], s[1], s[2]});
    case 4:
      return backend.upload_weight(dtype, data, {s[0], s[1], s[2], s[3]});
    default:
      return backend.upload_weight(dtype, data, {static_cast<int64_t>(1)});
  }
}

Result<Tensor> WeightLoader::load(const std::string& name, std::vector<int64_t> shape) const {
  BS_ASSIGN_OR_RETURN(const io::TensorInfo* info, ckpt_.get(prefix_ + name, shape));
  Tensor t = upload(backend_, info->dtype, info->data, info->shape);
  if (progress_) progress_->add(static_cast<int64_t>(info->nbytes));
  return t;
}

Result<Tensor> WeightLoader::load_stacked(const std::vector<std::string>& names,
                                          const std::vector<std::vector<int64_t>>& shapes) const {
  BS_CHECK(!names.empty() && names.size() == shapes.size());
  std::vector<const io::TensorInfo*> parts;
  std::vector<int64_t> stacked = shapes[0];
  stacked[0] = 0;
  bool same_dtype = true;
  for (size_t i = 0; i < names.size(); ++i) {
    BS_ASSIGN_OR_RETURN(const io::TensorInfo* info, ckpt_.get(prefix_ + names[i], shapes[i]));
    BS_CHECK(shapes[i].size() == stacked.size() &&
             std::equal(shapes[i].begin() + 1, shapes[i].end(), stacked.begin() + 1));
    parts.push_back(info);
    same_dtype = same_dtype && info->dtype == parts[0]->dtype;
    stacked[0] += shapes[i][0];
  }
  // One host buffer in the checkpoint's dtype (fp32 when the parts disagree), uploaded once.
  const DType dtype = same_dtype ? parts[0]->dtype : DType::kF32;
  size_t total = 0;
  for (const auto* p : parts) total += static_cast<size_t>(p->numel()) * dtype_size(dtype);
  std::vector<unsigned char> host(total);
  size_t off = 0;
  for (const auto* p : parts) {
    if (same_dtype) {
      std::memcpy(host.data() + off, p->data, p->nbytes);
    } else {
      convert_to_f32(p->dtype, p->data, reinterpret_cast<float*>(host.data() + off),
                     static_cast<size_t>(p->numel()));
    }
    off += static_cast<size_t>(p->numel()) * dtype_size(dtype);
  }
  Tensor t = upload(backend_, dtype, host.data(), stacked);
  if (progress_) {
    for (const auto* p : parts) progress_->add(static_cast<int64_t>(p->nbytes));
  }
  return t;
}

Result<Tensor> WeightLoader::load_optional(const std::string& name,
                                           std::vector<int64_t> shape) const {
  if (!has(name)) return Tensor();
  return load(name, std::move(shape));
}

}  // namespace bs
