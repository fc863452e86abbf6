#include "backend/backend.h"

#ifdef BLOCKSPEC_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace bs {

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  if (device == "cuda" || device == "auto") {
#ifdef BLOCKSPEC_HAS_CUDA
    std::string why;
    if (cuda::device_available(&why)) return cuda::make_cuda_backend(0);
    if (device == "auto") return make_cpu_backend(threads);
    return FailedPrecondition("device 'cuda': {}", why);
#else
    if (device == "auto") return make_cpu_backend(threads);
    return Unimplemented("device 'cuda': this build of blockspec has no CUDA backend");
#endif
  }
  return InvalidArgument("unknown device '{}' (expected cpu, cuda or auto)", device);
}

}  // namespace bs
