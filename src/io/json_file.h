// Reading JSON files and typed fields with errors that name the file and the field.
//
// Every getter takes the object holding the field, the field's key, and a `file` label used only in
// messages (a path, optionally followed by where in the file: "config.json (rope_scaling)").
// "Required" getters fail when the field is missing or null; the `_or` variants return the default
// then. A field that is present with the wrong type is always an error, never silently defaulted.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace bs::io {

// Parses the whole file. NotFound (naming the path) when it does not exist or cannot be opened;
// InvalidArgument naming the file, the byte offset and the parser's message for malformed JSON.
Result<nlohmann::json> read_json_file(const std::string& path);

// Parses `text`; `file` is the label used in error messages.
Result<nlohmann::json> parse_json(std::string_view text, std::string_view file);

// True when `j` is an object holding `field` with a non-null value.
bool has_field(const nlohmann::json& j, std::string_view field);

// Integers: JSON integers, or floats with an integral value (4096.0). Range: int64.
Result<int64_t> get_int(const nlohmann::json& j, std::string_view field, std::string_view file);
Result<int64_t> get_int_or(const nlohmann::json& j, std::string_view field, std::string_view file,
                           int64_t default_value);

// Numbers (integer or float), as double.
Result<double> get_float(const nlohmann::json& j, std::string_view field, std::string_view file);
Result<double> get_float_or(const nlohmann::json& j, std::string_view field, std::string_view file,
                            double default_value);

Result<std::string> get_string(const nlohmann::json& j, std::string_view field,
                               std::string_view file);
Result<std::string> get_string_or(const nlohmann::json& j, std::string_view field,
                                  std::string_view file, std::string default_value);

Result<bool> get_bool(const nlohmann::json& j, std::string_view field, std::string_view file);
Result<bool> get_bool_or(const nlohmann::json& j, std::string_view field, std::string_view file,
                         bool default_value);

// A list of integers. A bare integer is accepted as a one-element list when `allow_scalar`
// (Hugging Face writes `"eos_token_id": 2` and `"eos_token_id": [1, 2]` alike).
Result<std::vector<int64_t>> get_int_list(const nlohmann::json& j, std::string_view field,
                                          std::string_view file, bool allow_scalar = false);
// Missing or null gives an empty list.
Result<std::vector<int64_t>> get_int_list_or_empty(const nlohmann::json& j, std::string_view field,
                                                   std::string_view file,
                                                   bool allow_scalar = false);

// A list of strings; missing or null gives an empty list.
Result<std::vector<std::string>> get_string_list_or_empty(const nlohmann::json& j,
                                                          std::string_view field,
                                                          std::string_view file);

// Short human name of a JSON value's type for messages: "string", "array", "null", ...
std::string_view json_type_name(const nlohmann::json& j);

}  // namespace bs::io
