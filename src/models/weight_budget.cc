#include "models/weight_budget.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace bs {

namespace {

constexpr std::string_view kOverrideVariable = "BLOCKSPEC_AVAILABLE_MEMORY";

// "24G", "24 GiB", "1.5T", "123456" → bytes; -1 when it is not such a size.
int64_t parse_size(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || value < 0) return -1;
  std::string_view unit(end, text.data() + text.size() - end);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  double scale = 1;
  if (!unit.empty()) {
    const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(unit.front())));
    const std::string_view units = "KMGT";
    const size_t k = units.find(u);
    if (k == std::string_view::npos) return -1;
    for (size_t i = 0; i <= k; ++i) scale *= 1024;
    unit.remove_prefix(1);
    if (unit == "iB" || unit == "ib" || unit == "B" || unit == "b") unit = {};
    if (!unit.empty()) return -1;
  }
  const double bytes = value * scale;
  if (bytes > 9e18) return -1;
  return static_cast<int64_t>(bytes);
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.1f} GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

int64_t uploaded_weight_bytes(const io::Checkpoint& ckpt, DType matrix_dtype) {
  int64_t total = 0;
  for (const auto& name : ckpt.names()) {
    const auto info = ckpt.get(name);
    if (!info.ok()) continue;
    const DType dtype = (*info)->shape.size() >= 2 ? matrix_dtype : DType::kF32;
    total += (*info)->numel() * static_cast<int64_t>(dtype_size(dtype));
  }
  return total;
}

WeightFootprint weights_held_by(const io::Checkpoint& ckpt, const Backend& backend) {
  const DType matrices = backend.activation_dtype();
  return {.bytes = uploaded_weight_bytes(ckpt, matrices),
          .how = matrices == DType::kF32 ? fmt::format("F32 on the {} backend", backend.name())
                                         : fmt::format("{} matrices on the {} backend",
                                                       dtype_name(matrices), backend.name())};
}

Result<AvailableMemory> available_memory(const Backend& backend) {
  if (const char* env = std::getenv(kOverrideVariable.data()); env != nullptr && *env != '\0') {
    const int64_t bytes = parse_size(env);
    if (bytes < 0) {
      return InvalidArgument("{}='{}': expected a size in bytes, e.g. 24G or 25769803776",
                             kOverrideVariable, env);
    }
    return AvailableMemory{.bytes = bytes,
                           .source = fmt::format("available (set by {})", kOverrideVariable),
                           .remedy = fmt::format("raise or unset {}", kOverrideVariable)};
  }
  const MemoryInfo mem = backend.memory_info();
  const std::string override_hint =
      fmt::format("or set {} to override this check", kOverrideVariable);
  if (backend.device() == Device::kCpu) {
    return AvailableMemory{
        .bytes = mem.free,
        .source =
            fmt::format("available in RAM (MemAvailable, of {} total)", format_bytes(mem.total)),
        .remedy = fmt::format("free memory, use a smaller model or a GPU (--device cuda), {}",
                              override_hint)};
  }
  return AvailableMemory{
      .bytes = mem.free,
      .source = fmt::format("free on the GPU (of {} total)", format_bytes(mem.total)),
      .remedy = fmt::format("free GPU memory (other processes hold some?), use a smaller model, {}",
                            override_hint)};
}

Status check_weights_fit(const std::string& model, const WeightFootprint& weights,
                         const AvailableMemory& available) {
  const int64_t need = weights.bytes + weights.bytes / 10 + (int64_t{256} << 20);
  if (need <= available.bytes) return Status::Ok();
  return OutOfMemory(
      "{}: the model does not fit in memory: its weights take {} ({}), {} with a margin for the "
      "runtime, and {} is {}; {}",
      model, format_bytes(weights.bytes), weights.how, format_bytes(need),
      format_bytes(available.bytes), available.source, available.remedy);
}

Status check_checkpoint_fits(const std::string& what, const io::Checkpoint& ckpt,
                             const Backend& backend) {
  BS_ASSIGN_OR_RETURN(AvailableMemory memory, available_memory(backend));
  return check_weights_fit(what, weights_held_by(ckpt, backend), memory);
}

LoadProgress::LoadProgress(std::string what, int64_t tensors, int64_t bytes)
    : what_(std::move(what)),
      total_tensors_(tensors),
      total_bytes_(bytes),
      terminal_(isatty(STDERR_FILENO) != 0),
      start_(Clock::now()),
      last_print_(start_) {}

LoadProgress::~LoadProgress() {
  if (shown_) print(/*last=*/true);
}

void LoadProgress::add(int64_t bytes) {
  ++tensors_;
  bytes_ += bytes;
  const auto now = Clock::now();
  if (now - start_ < std::chrono::seconds(1)) return;
  const auto every = terminal_ ? std::chrono::milliseconds(250) : std::chrono::milliseconds(5000);
  if (shown_ && now - last_print_ < every) return;
  last_print_ = now;
  shown_ = true;
  print(/*last=*/false);
}

void LoadProgress::print(bool last) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  const std::string line =
      last ? fmt::format("loaded {}: {} tensors, {} in {:.1f} s", what_, tensors_,
                         format_bytes(bytes_), seconds)
           : fmt::format("loading {}: {}/{} tensors, {} / {} ({:.0f}%)", what_, tensors_,
                         total_tensors_, format_bytes(bytes_), format_bytes(total_bytes_),
                         total_bytes_ > 0 ? 100.0 * bytes_ / total_bytes_ : 100.0);
  // On a terminal the line is rewritten in place ("\33[K" clears what a longer line left).
  if (terminal_) {
    std::fprintf(stderr, "\r%s\33[K%s", line.c_str(), last ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace bs
