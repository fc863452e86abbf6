#include "io/safetensors.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "io/json_file.h"

namespace bs::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The reference reader's limit on the JSON header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_u64_le(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Safetensors dtypes that exist in the format but that blockspec does not load.
bool is_known_unsupported_dtype(std::string_view s) {
  static constexpr std::string_view kKnown[] = {
      "F64",  "I8",      "I16", "U16",     "U32",     "U64", "BOOL",        "F8_E5M2",
      "E8M0", "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};
  return std::find(std::begin(kKnown), std::end(kKnown), s) != std::end(kKnown);
}

// Reads a non-negative integer element of a JSON array.
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    *out = static_cast<uint64_t>(x);
    return true;
  }
  return false;
}

std::string dump_short(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Validates one header entry and fills `out`. `data` is the start of the data section.
Status parse_entry(const std::string& name, const json& e, const std::string& path,
                   const uint8_t* data, uint64_t data_size, TensorInfo* out) {
  auto err = [&](std::string_view what) {
    return InvalidArgument("tensor '{}' in {}: {}", name, path, what);
  };
  if (!e.is_object()) return err(fmt::format("entry must be an object, got {}", dump_short(e)));
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!e.contains(key)) return err(fmt::format("missing '{}'", key));
  }
  const json& jd = e["dtype"];
  if (!jd.is_string()) return err(fmt::format("'dtype' must be a string, got {}", dump_short(jd)));
  const std::string dname = jd.get<std::string>();
  DType dtype;
  if (!parse_dtype(dname, &dtype)) {
    if (is_known_unsupported_dtype(dname)) {
      return Unimplemented("tensor '{}' in {}: dtype '{}' is not supported", name, path, dname);
    }
    return err(fmt::format("unknown dtype '{}'", dname));
  }

  const json& js = e["shape"];
  if (!js.is_array()) return err(fmt::format("'shape' must be a list, got {}", dump_short(js)));
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  for (const json& d : js) {
    if (!d.is_number_integer()) {
      return err(fmt::format("'shape' must hold integers, got {}", dump_short(js)));
    }
    if (!d.is_number_unsigned() && d.get<int64_t>() < 0) {
      return err(fmt::format("negative dimension in shape {}", dump_short(js)));
    }
    const uint64_t u = d.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (u != 0 && numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / u)) {
      return err(fmt::format("shape {} overflows", dump_short(js)));
    }
    numel *= u;
    shape.push_back(static_cast<int64_t>(u));
  }
  const uint64_t esize = dtype_size(dtype);
  if (numel > std::numeric_limits<uint64_t>::max() / esize) {
    return err(fmt::format("shape {} overflows", dump_short(js)));
  }
  const uint64_t nbytes = numel * esize;

  const json& jo = e["data_offsets"];
  uint64_t begin = 0, end = 0;
  if (!jo.is_array() || jo.size() != 2 || !as_u64(jo[0], &begin) || !as_u64(jo[1], &end)) {
    return err(fmt::format("'data_offsets' must be [begin, end] with non-negative integers, got {}",
                           dump_short(jo)));
  }
  if (begin > end) {
    return err(fmt::format("data_offsets [{}, {}] have begin > end", begin, end));
  }
  if (end > data_size) {
    return DataLoss(
        "tensor '{}' in {}: data_offsets [{}, {}] reach past the end of the data section "
        "({} bytes; file truncated?)",
        name, path, begin, end, data_size);
  }
  if (end - begin != nbytes) {
    return err(fmt::format("data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", begin, end,
                           end - begin, dname, shape_to_string(shape), nbytes));
  }
  out->name = name;
  out->dtype = dtype;
  out->shape = std::move(shape);
  out->data = data + begin;
  out->nbytes = static_cast<size_t>(nbytes);
  out->file = path;
  return Status::Ok();
}

}  // namespace

int64_t TensorInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Status Checkpoint::add_file(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  MappedFile file = std::move(mapped).value();
  const uint8_t* base = file.data();
  const uint64_t size = file.size();
  if (size < 8) {
    return DataLoss("{}: file is {} bytes, too short for a safetensors header (8-byte length)",
                    path, size);
  }
  const uint64_t n = read_u64_le(base);
  if (n > kMaxHeaderBytes) {
    return InvalidArgument("{}: header length {} is larger than the {} byte limit", path, n,
                           kMaxHeaderBytes);
  }
  if (n > size - 8) {
    return DataLoss("{}: header length {} is larger than the rest of the file ({} bytes)", path, n,
                    size - 8);
  }
  const std::string_view text(reinterpret_cast<const char*>(base + 8), n);
  if (text.empty() || text.front() != '{') {
    return InvalidArgument("{}: header is not a JSON object (it must start with '{{')", path);
  }

  // Parse, noting duplicate top-level keys (a plain parse would keep the last silently).
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && parsed.is_string()) {
      if (!seen.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), cb);
  } catch (const json::parse_error& e) {
    return InvalidArgument("{}: header is not valid JSON (byte {} of the header): {}", path, e.byte,
                           e.what());
  } catch (const std::exception& e) {
    return InvalidArgument("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!header.is_object()) {
    return InvalidArgument("{}: header must be a JSON object, got {}", path,
                           json_type_name(header));
  }
  if (!duplicate.empty()) {
    return InvalidArgument("{}: tensor '{}' appears twice in the header", path, duplicate);
  }

  const uint8_t* data = base + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<TensorInfo> infos;
  infos.reserve(header.size());
  std::map<std::string, std::string> metadata;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;
      if (!it->is_object()) {
        return InvalidArgument("{}: '__metadata__' must be an object of strings, got {}", path,
                               dump_short(*it));
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return InvalidArgument("{}: '__metadata__' value of '{}' must be a string, got {}", path,
                                 m.key(), dump_short(*m));
        }
        metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorInfo info;
    BS_RETURN_IF_ERROR(parse_entry(it.key(), *it, path, data, data_size, &info));
    infos.push_back(std::move(info));
  }

  // Byte ranges may come in any order but must not overlap (empty tensors overlap nothing).
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : infos) {
    if (t.nbytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* prev = by_offset[i - 1];
    const TensorInfo* cur = by_offset[i];
    const auto* prev_end = static_cast<const uint8_t*>(prev->data) + prev->nbytes;
    if (static_cast<const uint8_t*>(cur->data) < prev_end) {
      return InvalidArgument("{}: tensors '{}' and '{}' overlap in the data section", path,
                             prev->name, cur->name);
    }
  }

  for (TensorInfo& t : infos) {
    if (tensors_.count(t.name) != 0) {
      return InvalidArgument("tensor '{}' appears in both {} and {}", t.name,
                             tensors_.find(t.name)->second.file, path);
    }
  }
  for (TensorInfo& t : infos) {
    std::string key = t.name;
    tensors_.emplace(std::move(key), std::move(t));
  }
  for (auto& [k, v] : metadata) metadata_.emplace(k, v);  // first file wins
  files_.push_back(std::move(file));
  return Status::Ok();
}

Result<Checkpoint> Checkpoint::open_file(const std::string& path) {
  Checkpoint ck;
  ck.dir_ = path;
  BS_RETURN_IF_ERROR(ck.add_file(path));
  return ck;
}

Result<Checkpoint> Checkpoint::open_index(const std::string& dir, const std::string& index_path) {
  BS_ASSIGN_OR_RETURN(json index, read_json_file(index_path));
  if (!index.is_object()) {
    return InvalidArgument("{}: expected a JSON object, got {}", index_path, json_type_name(index));
  }
  auto wm = index.find("weight_map");
  if (wm == index.end() || wm->is_null()) {
    return InvalidArgument("{}: missing required field 'weight_map'", index_path);
  }
  if (!wm->is_object()) {
    return InvalidArgument("{}: field 'weight_map' must be an object, got {}", index_path,
                           json_type_name(*wm));
  }
  if (wm->empty()) return InvalidArgument("{}: 'weight_map' is empty", index_path);

  // Shard file names, in order of first appearance.
  std::vector<std::string> shards;
  std::map<std::string, std::string> shard_of;  // tensor -> shard file name
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) {
      return InvalidArgument("{}: weight_map entry for tensor '{}' must be a file name, got {}",
                             index_path, it.key(), dump_short(*it));
    }
    const std::string shard = it->get<std::string>();
    const fs::path sp(shard);
    bool escapes = shard.empty() || sp.is_absolute();
    for (const auto& part : sp) escapes = escapes || part == "..";
    if (escapes) {
      return InvalidArgument(
          "{}: weight_map entry for tensor '{}' names shard '{}', which is not "
          "a file inside {}",
          index_path, it.key(), shard, dir);
    }
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
    shard_of[it.key()] = shard;
  }

  Checkpoint ck;
  ck.dir_ = dir;
  std::map<std::string, std::string> shard_path;
  for (const std::string& shard : shards) {
    const std::string p = (fs::path(dir) / shard).string();
    std::error_code ec;
    if (!fs::exists(p, ec)) {
      return NotFound("shard '{}' listed in {} not found: {}", shard, index_path, p);
    }
    Status st = ck.add_file(p);
    if (!st.ok()) return st.with_context(fmt::format("loading shard listed in {}", index_path));
    shard_path[shard] = p;
  }
  for (const auto& [name, shard] : shard_of) {
    auto t = ck.tensors_.find(name);
    if (t == ck.tensors_.end() || t->second.file != shard_path[shard]) {
      return DataLoss("tensor '{}' listed in {} is not in its shard {}", name, index_path,
                      shard_path[shard]);
    }
  }
  return ck;
}

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) return NotFound("checkpoint not found: {}", dir);
  if (fs::is_regular_file(st)) return open_file(dir);
  if (!fs::is_directory(st)) {
    return InvalidArgument("{} is neither a directory nor a .safetensors file", dir);
  }

  const fs::path d(dir);
  const fs::path single = d / "model.safetensors";
  if (fs::exists(single, ec)) {
    BS_ASSIGN_OR_RETURN(Checkpoint ck, open_file(single.string()));
    ck.dir_ = dir;
    return ck;
  }
  const fs::path index = d / "model.safetensors.index.json";
  if (fs::exists(index, ec)) return open_index(dir, index.string());

  // Fall back to the one *.safetensors (or the one *.safetensors.index.json) in the directory.
  std::vector<std::string> files, indexes;
  for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    auto ends_with = [&](std::string_view suffix) {
      return name.size() > suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".safetensors")) files.push_back(name);
    if (ends_with(".safetensors.index.json")) indexes.push_back(name);
  }
  if (ec) return InvalidArgument("cannot list {}: {}", dir, ec.message());
  std::sort(files.begin(), files.end());
  if (indexes.size() == 1) return open_index(dir, (d / indexes[0]).string());
  if (files.size() == 1) {
    BS_ASSIGN_OR_RETURN(Checkpoint ck, open_file((d / files[0]).string()));
    ck.dir_ = dir;
    return ck;
  }
  if (files.empty()) {
    return NotFound("no model.safetensors, model.safetensors.index.json or *.safetensors in {}",
                    dir);
  }
  return InvalidArgument(
      "{} holds {} .safetensors files ({}) but no model.safetensors.index.json to say which "
      "to load",
      dir, files.size(), fmt::join(files, ", "));
}

bool Checkpoint::has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

Result<const TensorInfo*> Checkpoint::get(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return NotFound("tensor '{}' not found in {}", name, dir_);
  return &it->second;
}

Result<const TensorInfo*> Checkpoint::get(std::string_view name,
                                          std::vector<int64_t> expected_shape) const {
  BS_ASSIGN_OR_RETURN(const TensorInfo* t, get(name));
  if (t->shape != expected_shape) {
    return InvalidArgument("tensor '{}' in {} has shape {}, expected {}", name, t->file,
                           shape_to_string(t->shape), shape_to_string(expected_shape));
  }
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (const MappedFile& f : files_) out.push_back(f.path());
  return out;
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  std::vector<uint64_t> sizes(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgument("{}: invalid tensor name '{}'", path, t.name);
    }
    if (!names.insert(t.name).second) {
      return InvalidArgument("{}: tensor '{}' given twice", path, t.name);
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return InvalidArgument("{}: tensor '{}' has negative dimension in shape {}", path, t.name,
                               shape_to_string(t.shape));
      }
      const auto u = static_cast<uint64_t>(d);
      if (u != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / u) {
        return InvalidArgument("{}: tensor '{}' shape {} overflows", path, t.name,
                               shape_to_string(t.shape));
      }
      numel *= u;
    }
    sizes[i] = numel * dtype_size(t.dtype);
    if (sizes[i] > 0 && t.data == nullptr) {
      return InvalidArgument("{}: tensor '{}' has no data", path, t.name);
    }
  }

  // Reference order: descending element size, then name.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t sa = dtype_size(tensors[a].dtype), sb = dtype_size(tensors[b].dtype);
    if (sa != sb) return sa > sb;
    return tensors[a].name < tensors[b].name;
  });

  std::string header;
  try {
    json h = json::object();
    if (!metadata.empty()) h["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (size_t i : order) {
      const TensorToWrite& t = tensors[i];
      h[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                   {"shape", t.shape},
                   {"data_offsets", {offset, offset + sizes[i]}}};
      offset += sizes[i];
    }
    header = h.dump();
  } catch (const std::exception& e) {
    return InvalidArgument("{}: cannot encode header: {}", path, e.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return InvalidArgument("cannot create {}: {}", path, std::strerror(errno));
  uint8_t len[8];
  write_u64_le(header.size(), len);
  bool ok = std::fwrite(len, 1, 8, f) == 8 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (size_t i : order) {
    if (!ok) break;
    if (sizes[i] > 0) ok = std::fwrite(tensors[i].data, 1, sizes[i], f) == sizes[i];
  }
  const int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) return DataLoss("cannot write {}: {}", path, std::strerror(errno));
  if (!ok) return DataLoss("cannot write {}: {}", path, std::strerror(err));
  return Status::Ok();
}

}  // namespace bs::io
