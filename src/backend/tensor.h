// Tensor: a typed, row-major, contiguous view of backend memory. Views share ownership of
// their storage, so a slice keeps its parent buffer alive.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>

#include "core/check.h"
#include "core/dtype.h"

namespace bs {

enum class Device : uint8_t { kCpu, kCuda };

class Tensor {
 public:
  static constexpr int kMaxDims = 4;

  Tensor() = default;
  Tensor(std::shared_ptr<void> storage, void* data, DType dtype, Device device,
         std::initializer_list<int64_t> shape)
      : storage_(std::move(storage)), data_(data), dtype_(dtype), device_(device) {
    set_shape(shape);
  }

  bool defined() const { return data_ != nullptr; }
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t dim(int i) const { return shape_[i < 0 ? ndim_ + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= shape_[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  // Elements of one leading-dimension row.
  int64_t row_numel() const { return ndim_ == 0 ? 1 : numel() / shape_[0]; }

  // Rows [begin, begin + count) of the leading dimension.
  Tensor rows(int64_t begin, int64_t count) const {
    BS_CHECK(ndim_ >= 1 && begin >= 0 && count >= 0 && begin + count <= shape_[0]);
    Tensor t = *this;
    t.data_ = static_cast<char*>(data_) + begin * row_numel() * dtype_size(dtype_);
    t.shape_[0] = count;
    return t;
  }
  // Same elements, new shape (one dimension may be -1).
  Tensor view(std::initializer_list<int64_t> shape) const {
    Tensor t = *this;
    t.set_shape(shape);
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < t.ndim_; ++i) {
      if (t.shape_[i] == -1) {
        infer = i;
      } else {
        known *= t.shape_[i];
      }
    }
    if (infer >= 0) t.shape_[infer] = known == 0 ? 0 : numel() / known;
    BS_CHECK(t.numel() == numel());
    return t;
  }

 private:
  void set_shape(std::initializer_list<int64_t> shape) {
    BS_CHECK(shape.size() <= kMaxDims);
    ndim_ = static_cast<int>(shape.size());
    int i = 0;
    for (int64_t d : shape) shape_[i++] = d;
    for (; i < kMaxDims; ++i) shape_[i] = 1;
  }

  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{1, 1, 1, 1};
};

}  // namespace bs
