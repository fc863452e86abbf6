#include "tokenizer/json_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace bs::json_util {

Result<std::string> read_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    if (errno == ENOENT) return NotFound("{}: no such file", path);
    return InvalidArgument("{}: cannot open: {}", path, std::strerror(errno));
  }
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) data.append(buf, n);
  if (std::ferror(f.get())) return DataLoss("{}: read error", path);
  return data;
}

Result<Json> parse_json_file(const std::string& path) {
  BS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("{}: invalid JSON: {}", path, e.what());
  }
}

}  // namespace bs::json_util
