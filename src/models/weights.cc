#include "models/weights.h"

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
  return upload(backend_, info->dtype, info->data, info->shape);
}

Result<Tensor> WeightLoader::load_optional(const std::string& name,
                                           std::vector<int64_t> shape) const {
  if (!has(name)) return Tensor();
  return load(name, std::move(shape));
}

}  // namespace bs
