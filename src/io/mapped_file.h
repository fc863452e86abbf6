// A read-only memory mapping of a whole file (POSIX mmap). Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace bs::io {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // NotFound when the file does not exist; InvalidArgument for a directory; an empty file maps to
  // size() == 0 and data() == nullptr.
  static Result<MappedFile> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  const uint8_t* data_ = nullptr;  // [size_] bytes, page-aligned
  size_t size_ = 0;
  std::string path_;
};

}  // namespace bs::io
