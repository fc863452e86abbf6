// Small helpers for reading tokenizer JSON files with errors that name the file and the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace bs::json_util {

using Json = nlohmann::json;

// A position in a JSON document, for error messages: "<file>: field 'model.vocab' ...".
struct JsonPath {
  std::string file;
  std::string path;

  JsonPath child(std::string_view key) const {
    return {file, path.empty() ? std::string(key) : path + "." + std::string(key)};
  }
  JsonPath index(size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
  Status error(std::string_view what) const {
    return InvalidArgument("{}: field '{}' {}", file, path.empty() ? "<root>" : path, what);
  }
};

// The member `key` of an object, or nullptr when absent, null, or `obj` is not an object.
inline const Json* member(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline Result<std::string> as_string(const Json& j, const JsonPath& at) {
  if (!j.is_string()) return at.error(fmt::format("must be a string, got {}", j.type_name()));
  return j.get<std::string>();
}

inline Result<int64_t> as_int(const Json& j, const JsonPath& at) {
  if (!j.is_number_integer()) {
    return at.error(fmt::format("must be an integer, got {}", j.type_name()));
  }
  return j.get<int64_t>();
}

inline Result<bool> as_bool(const Json& j, const JsonPath& at) {
  if (!j.is_boolean()) return at.error(fmt::format("must be a boolean, got {}", j.type_name()));
  return j.get<bool>();
}

// Optional typed members: `fallback` when absent or null, an error when of the wrong type.
inline Result<bool> get_bool(const Json& obj, std::string_view key, const JsonPath& at,
                             bool fallback) {
  const Json* j = member(obj, key);
  return j == nullptr ? Result<bool>(fallback) : as_bool(*j, at.child(key));
}

inline Result<std::string> get_string(const Json& obj, std::string_view key, const JsonPath& at,
                                      std::string fallback) {
  const Json* j = member(obj, key);
  return j == nullptr ? Result<std::string>(std::move(fallback)) : as_string(*j, at.child(key));
}

inline Result<int64_t> get_int(const Json& obj, std::string_view key, const JsonPath& at,
                               int64_t fallback) {
  const Json* j = member(obj, key);
  return j == nullptr ? Result<int64_t>(fallback) : as_int(*j, at.child(key));
}

// Required string member.
inline Result<std::string> require_string(const Json& obj, std::string_view key,
                                          const JsonPath& at) {
  const Json* j = member(obj, key);
  if (j == nullptr) return at.child(key).error("is missing");
  return as_string(*j, at.child(key));
}

// Reads a whole file; NotFound when it does not exist.
Result<std::string> read_file(const std::string& path);

// Parses a small JSON file (configs) into a DOM, converting exceptions to Status.
Result<Json> parse_json_file(const std::string& path);

}  // namespace bs::json_util
