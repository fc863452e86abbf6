// safetensors checkpoints: a read-only, memory-mapped reader (single file or sharded index) and a
// writer for tests and tools.
//
// File format: [u64 little-endian header length N][N bytes JSON header, space padded][data].
// The header maps tensor name -> {"dtype", "shape", "data_offsets": [begin, end)} with offsets
// relative to the start of the data section, plus an optional "__metadata__" string map.
// Every header field is validated on open; errors name the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/mapped_file.h"

namespace bs::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first; [] for a scalar
  // Points into the read-only mapping, valid while the owning Checkpoint lives. Not necessarily
  // aligned to the element size (the format does not require it): copy or convert, don't cast.
  const void* data = nullptr;
  size_t nbytes = 0;  // numel() * dtype_size(dtype)
  std::string file;   // path of the .safetensors file holding it

  int64_t numel() const;
};

// Formats a shape as "[a,b,c]".
std::string shape_to_string(const std::vector<int64_t>& shape);

// One checkpoint: every tensor of a directory (one file or several shards). Move-only; owns the
// mappings, so TensorInfo pointers and data stay valid until it is destroyed.
class Checkpoint {
 public:
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  ~Checkpoint();

  // Opens `dir`/model.safetensors; else `dir`/model.safetensors.index.json (sharded: weight_map
  // names the shard of each tensor); else the single *.safetensors file in `dir`. A path to a
  // .safetensors file is opened as that file.
  static Result<Checkpoint> open(const std::string& dir);
  // Opens one .safetensors file; dir() is then the file's path.
  static Result<Checkpoint> open_file(const std::string& path);

  bool has(std::string_view name) const;
  // NotFound "tensor 'x' not found in <dir>".
  Result<const TensorInfo*> get(std::string_view name) const;
  // Also checks the shape: InvalidArgument "tensor 'x' in <file> has shape [a,b], expected [c,d]".
  Result<const TensorInfo*> get(std::string_view name, std::vector<int64_t> expected_shape) const;

  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  const std::string& dir() const { return dir_; }
  // "__metadata__" of the file; for shards, the union over shards (first shard wins on conflict).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The files mapped (one, or one per shard).
  std::vector<std::string> files() const;

 private:
  Checkpoint() = default;
  // Maps one file and adds its tensors; duplicate names (across shards) are an error.
  Status add_file(const std::string& path);
  static Result<Checkpoint> open_index(const std::string& dir, const std::string& index_path);

  std::string dir_;
  std::vector<MappedFile> files_;  // moving a MappedFile keeps its address range
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype_size bytes
};

// Writes a .safetensors file the way the reference writer does: data laid out by descending
// element size, then name (so every tensor is aligned to its element size), header padded with
// spaces to a multiple of 8 bytes. Rejects duplicate or empty names and negative dims.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace bs::io
