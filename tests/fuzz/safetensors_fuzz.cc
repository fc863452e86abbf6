// Fuzzes the safetensors reader (header JSON, dtypes, shapes, offsets, overlaps): the input is a
// whole .safetensors file, opened through a memfd (no disk), and every tensor's bytes are read so
// that an offset past the mapping is an ASan report.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto ck = bs::io::Checkpoint::open_file(path);
  if (ck.ok()) {
    uint64_t sum = 0;
    for (const std::string& name : ck->names()) {
      auto t = ck->get(name);
      if (!t.ok()) std::abort();  // names() lists what get() finds
      const auto* p = static_cast<const uint8_t*>((*t)->data);
      if ((*t)->nbytes != static_cast<size_t>((*t)->numel()) * bs::dtype_size((*t)->dtype)) {
        std::abort();
      }
      for (size_t i = 0; i < (*t)->nbytes; ++i) sum += p[i];
    }
    (void)ck->metadata();
    if (sum == 0x5eed) (void)0;
  }
  close(fd);
  return 0;
}
