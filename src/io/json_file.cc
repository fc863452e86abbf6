#include "io/json_file.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace bs::io {

using nlohmann::json;

namespace {

Status missing(std::string_view field, std::string_view file) {
  return InvalidArgument("{}: missing required field '{}'", file, field);
}

Status wrong_type(std::string_view field, std::string_view file, std::string_view expected,
                  const json& v) {
  return InvalidArgument("{}: field '{}' must be {}, got {} {}", file, field, expected,
                         json_type_name(v),
                         v.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 80));
}

// Looks `field` up; nullptr when `j` is not an object, the field is absent, or it is null.
const json* find_field(const json& j, std::string_view field) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

Status require_object(const json& j, std::string_view file) {
  if (j.is_object()) return Status::Ok();
  return InvalidArgument("{}: expected a JSON object, got {}", file, json_type_name(j));
}

Result<int64_t> as_int(const json& v, std::string_view field, std::string_view file) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgument("{}: field '{}' value {} is out of range", file, field, u);
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 is exactly representable; anything at or above it does not fit.
    if (std::isfinite(d) && d == std::floor(d) && d >= -9223372036854775808.0 &&
        d < 9223372036854775808.0) {
      return static_cast<int64_t>(d);
    }
    return wrong_type(field, file, "an integer", v);
  }
  return wrong_type(field, file, "an integer", v);
}

}  // namespace

std::string_view json_type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "object";
    case json::value_t::array:
      return "array";
    case json::value_t::string:
      return "string";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
      return "integer";
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::binary:
      return "binary";
    case json::value_t::discarded:
      return "invalid";
  }
  return "unknown";
}

Result<json> parse_json(std::string_view text, std::string_view file) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    return InvalidArgument("{}: invalid JSON (byte {}): {}", file, e.byte, e.what());
  } catch (const std::exception& e) {
    return InvalidArgument("{}: cannot parse JSON: {}", file, e.what());
  }
}

Result<json> read_json_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) return NotFound("file not found: {}", path);
  if (std::filesystem::is_directory(st)) {
    return InvalidArgument("{}: is a directory, expected a JSON file", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open {}: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLoss("{}: read error", path);
  return parse_json(ss.str(), path);
}

bool has_field(const json& j, std::string_view field) { return find_field(j, field) != nullptr; }

Result<int64_t> get_int(const json& j, std::string_view field, std::string_view file) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return missing(field, file);
  return as_int(*v, field, file);
}

Result<int64_t> get_int_or(const json& j, std::string_view field, std::string_view file,
                           int64_t default_value) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return default_value;
  return as_int(*v, field, file);
}

Result<double> get_float(const json& j, std::string_view field, std::string_view file) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return missing(field, file);
  if (!v->is_number()) return wrong_type(field, file, "a number", *v);
  return v->get<double>();
}

Result<double> get_float_or(const json& j, std::string_view field, std::string_view file,
                            double default_value) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return default_value;
  if (!v->is_number()) return wrong_type(field, file, "a number", *v);
  return v->get<double>();
}

Result<std::string> get_string(const json& j, std::string_view field, std::string_view file) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return missing(field, file);
  if (!v->is_string()) return wrong_type(field, file, "a string", *v);
  return v->get<std::string>();
}

Result<std::string> get_string_or(const json& j, std::string_view field, std::string_view file,
                                  std::string default_value) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return default_value;
  if (!v->is_string()) return wrong_type(field, file, "a string", *v);
  return v->get<std::string>();
}

Result<bool> get_bool(const json& j, std::string_view field, std::string_view file) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return missing(field, file);
  if (!v->is_boolean()) return wrong_type(field, file, "a boolean", *v);
  return v->get<bool>();
}

Result<bool> get_bool_or(const json& j, std::string_view field, std::string_view file,
                         bool default_value) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return default_value;
  if (!v->is_boolean()) return wrong_type(field, file, "a boolean", *v);
  return v->get<bool>();
}

namespace {

Result<std::vector<int64_t>> int_list_from(const json& v, std::string_view field,
                                           std::string_view file, bool allow_scalar) {
  std::vector<int64_t> out;
  if (v.is_number() && allow_scalar) {
    BS_ASSIGN_OR_RETURN(int64_t x, as_int(v, field, file));
    out.push_back(x);
    return out;
  }
  if (!v.is_array()) return wrong_type(field, file, "a list of integers", v);
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    auto x = as_int(v[i], fmt::format("{}[{}]", field, i), file);
    if (!x.ok()) return x.status();
    out.push_back(*x);
  }
  return out;
}

}  // namespace

Result<std::vector<int64_t>> get_int_list(const json& j, std::string_view field,
                                          std::string_view file, bool allow_scalar) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return missing(field, file);
  return int_list_from(*v, field, file, allow_scalar);
}

Result<std::vector<int64_t>> get_int_list_or_empty(const json& j, std::string_view field,
                                                   std::string_view file, bool allow_scalar) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  if (v == nullptr) return std::vector<int64_t>{};
  return int_list_from(*v, field, file, allow_scalar);
}

Result<std::vector<std::string>> get_string_list_or_empty(const json& j, std::string_view field,
                                                          std::string_view file) {
  BS_RETURN_IF_ERROR(require_object(j, file));
  const json* v = find_field(j, field);
  std::vector<std::string> out;
  if (v == nullptr) return out;
  if (!v->is_array()) return wrong_type(field, file, "a list of strings", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    if (!e.is_string()) return wrong_type(fmt::format("{}[{}]", field, i), file, "a string", e);
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace bs::io
