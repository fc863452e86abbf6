#include "models/blocks/weights.h"

#include <fmt/format.h>

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

Result<std::string> resolve_tensor_name(const io::Checkpoint& ckpt,
                                        std::initializer_list<std::string> spellings,
                                        std::string_view why) {
  std::string tried;
  for (const std::string& n : spellings) {
    if (ckpt.has(n)) return n;
    if (ckpt.has("model." + n)) return "model." + n;
    tried += fmt::format("{}'{}' (or 'model.{}')", tried.empty() ? "" : ", ", n, n);
  }
  return NotFound("{}: tensor {} is missing{}", ckpt.dir(), tried,
                  why.empty() ? "" : fmt::format(" (needed by {})", why));
}

Result<const io::TensorInfo*> WeightLoader::info(std::initializer_list<std::string> spellings,
                                                 std::vector<int64_t> shape, std::string_view why) {
  BS_ASSIGN_OR_RETURN(const std::string name, resolve(spellings, why));
  BS_ASSIGN_OR_RETURN(const io::TensorInfo* t, ckpt_.get(name));
  if (t->shape != shape) {
    return InvalidArgument("{}: tensor '{}' has shape {}, expected {}{}", t->file, name,
                           io::shape_to_string(t->shape), io::shape_to_string(shape),
                           why.empty() ? "" : fmt::format(" ({})", why));
  }
  if (t->dtype == DType::kI32 || t->dtype == DType::kI64 || t->dtype == DType::kU8) {
    return InvalidArgument("{}: tensor '{}' has dtype {}, expected a float type", t->file, name,
                           dtype_name(t->dtype));
  }
  used_.insert(name);
  return t;
}

Result<Tensor> WeightLoader::load_any(std::initializer_list<std::string> spellings,
                                      std::vector<int64_t> shape, std::string_view why) {
  BS_ASSIGN_OR_RETURN(const io::TensorInfo* t, info(spellings, std::move(shape), why));
  Tensor w = upload(backend_, t->dtype, t->data, t->shape);
  if (progress_) progress_->add(static_cast<int64_t>(t->nbytes));
  return w;
}

Result<std::vector<float>> WeightLoader::host(const std::string& name, std::vector<int64_t> shape) {
  BS_ASSIGN_OR_RETURN(const io::TensorInfo* t, info({name}, std::move(shape)));
  std::vector<float> out(static_cast<size_t>(t->numel()));
  convert_to_f32(t->dtype, t->data, out.data(), out.size());
  return out;
}

Result<Tensor> WeightLoader::load_stacked(const std::vector<std::string>& names,
                                          const std::vector<std::vector<int64_t>>& shapes) {
  BS_CHECK(!names.empty() && names.size() == shapes.size());
  std::vector<const io::TensorInfo*> parts;
  std::vector<int64_t> stacked = shapes[0];
  stacked[0] = 0;
  bool same_dtype = true;
  for (size_t i = 0; i < names.size(); ++i) {
    BS_ASSIGN_OR_RETURN(const io::TensorInfo* t, info({names[i]}, shapes[i]));
    BS_CHECK(shapes[i].size() == stacked.size() &&
             std::equal(shapes[i].begin() + 1, shapes[i].end(), stacked.begin() + 1));
    parts.push_back(t);
    same_dtype = same_dtype && t->dtype == parts[0]->dtype;
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

}  // namespace bs
