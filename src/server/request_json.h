// Request bodies as JSON, parsed under limits that are checked while parsing, so no deep or
// oversized document is ever built, copied or destroyed (docs/SERVER.md, "Limits"). Every route
// that reads a JSON body goes through parse_request_json; the fuzz harness of the OpenAI request
// parser calls it too.
//
//   std::string field;
//   auto req = parse_request_json(body, {.max_depth = 64}, &field);
//   if (!req.ok()) ...;  // 400: req.status().message(), `field` the top-level key concerned
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace bs::server {

struct RequestLimits {
  // The deepest nesting of arrays and objects; the body's own object is level 1.
  int max_depth = 64;
  // The largest body in bytes (`serve --max-request-bytes`; HTTP answers 413 before parsing).
  size_t max_bytes = size_t{16} << 20;
};

// Parses `body` as one JSON value. InvalidArgument naming the problem when it is not valid JSON,
// is longer than limits.max_bytes, nests deeper than limits.max_depth (detected at the first
// level too deep: nothing deeper is read), or holds a number beyond a double's range (1e400).
// *field (when given) is set to the top-level object key under which the problem was found
// (empty when none).
Result<nlohmann::json> parse_request_json(std::string_view body, const RequestLimits& limits,
                                          std::string* field = nullptr);
// The same, keeping every object's key order (chat templates see it).
Result<nlohmann::ordered_json> parse_request_json_ordered(std::string_view body,
                                                          const RequestLimits& limits,
                                                          std::string* field = nullptr);

}  // namespace bs::server
