// Before a model loads: do its weights fit in the memory the backend allocates from? And while it
// loads: progress on stderr for loads a user waits for.
//
//   BS_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(dir));
//   BS_RETURN_IF_ERROR(check_checkpoint_fits(dir, ckpt, backend));  // before any upload
//
// A model that cannot fit is refused with the sizes in the message instead of being killed by
// the kernel's OOM killer half-way through the load (an 8B model on a 24 GB machine: ~45 s).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/status.h"
#include "io/safetensors.h"

namespace bs {

// Bytes `ckpt`'s tensors take once uploaded (Backend::upload_weight): matrices (rank >= 2) in
// `matrix_dtype` (the backend's activation dtype: F32 on the CPU, BF16 on CUDA), vectors in F32.
int64_t uploaded_weight_bytes(const io::Checkpoint& ckpt, DType matrix_dtype);

// A model's weights as a backend will hold them.
struct WeightFootprint {
  int64_t bytes = 0;
  std::string how;  // e.g. "F32 on the cpu backend"
};
WeightFootprint weights_held_by(const io::Checkpoint& ckpt, const Backend& backend);

// The memory weights may take, and where the figure comes from (for messages).
struct AvailableMemory {
  int64_t bytes = 0;
  std::string source;  // e.g. "RAM available (MemAvailable)", "free GPU memory"
  std::string remedy;  // what a user can do when a model does not fit
};

// Backend::memory_info().free, or the environment variable BLOCKSPEC_AVAILABLE_MEMORY (bytes,
// optionally with a K, M, G or T suffix of powers of 1024) when set: an override for limits the
// check cannot see (e.g. a container's) and for tests. InvalidArgument when the variable is not
// such a size.
Result<AvailableMemory> available_memory(const Backend& backend);

// The weights plus a margin for the runtime (activations, scratch, allocator slack: 256 MiB + 10%
// of the weights; the KV cache is sized separately) must fit in `available`. OutOfMemory names the
// model, both sizes and the remedy otherwise. Pure: unit-testable with any numbers.
Status check_weights_fit(const std::string& model, const WeightFootprint& weights,
                         const AvailableMemory& available);

// The check for one checkpoint about to be loaded to `backend` (available_memory, then
// check_weights_fit); `what` names it in the message.
Status check_checkpoint_fits(const std::string& what, const io::Checkpoint& ckpt,
                             const Backend& backend);

// "1.5 GiB", "12.0 MiB", "512 B".
std::string format_bytes(int64_t bytes);

// Load progress on stderr. Silent for the first second (small models load faster; tests never
// see it); then one line rewritten in place on a terminal, or a line every 5 s otherwise, and a
// last line with the total when anything was shown.
class LoadProgress {
 public:
  LoadProgress(std::string what, int64_t tensors, int64_t bytes);
  ~LoadProgress();
  LoadProgress(const LoadProgress&) = delete;
  LoadProgress& operator=(const LoadProgress&) = delete;

  // One tensor of `bytes` (as stored in the checkpoint) loaded.
  void add(int64_t bytes);

 private:
  using Clock = std::chrono::steady_clock;
  void print(bool last);

  std::string what_;
  int64_t total_tensors_, total_bytes_;
  int64_t tensors_ = 0, bytes_ = 0;
  bool terminal_;
  bool shown_ = false;
  Clock::time_point start_, last_print_;
};

}  // namespace bs
