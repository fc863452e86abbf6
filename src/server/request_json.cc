#include "server/request_json.h"

#include <fmt/format.h>

namespace bs::server {

namespace {

// Thrown by the parse callback at the first array or object deeper than the limit.
struct TooDeep {};

template <typename Json>
Result<Json> parse_limited(std::string_view body, const RequestLimits& limits, std::string* field) {
  std::string key;  // the last top-level key seen
  if (field) field->clear();
  const auto fail = [&](std::string message) -> Status {
    if (field) *field = key;
    return InvalidArgument("{}", message);
  };
  if (body.size() > limits.max_bytes) {
    return fail(fmt::format("request body of {} bytes is larger than the limit of {} bytes",
                            body.size(), limits.max_bytes));
  }
  // `depth`: the containers enclosing the event's value (the body object: 0). The callback runs
  // before the parser descends, so a too-deep document stops at its first level past the limit.
  const typename Json::parser_callback_t check = [&](int depth, nlohmann::json::parse_event_t event,
                                                     Json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) &&
        depth + 1 > limits.max_depth) {
      throw TooDeep{};
    }
    if (event == Event::key && depth == 1 && parsed.is_string())
      key = parsed.template get<std::string>();
    return true;
  };
  try {
    return Json::parse(body.begin(), body.end(), check);
  } catch (const TooDeep&) {
    return fail(
        fmt::format("request JSON nests arrays/objects deeper than the limit of {} levels{}",
                    limits.max_depth, key.empty() ? "" : fmt::format(" (in '{}')", key)));
  } catch (const nlohmann::json::out_of_range& e) {  // 406: a number beyond a double
    return fail(fmt::format("{}number out of range: {}", key.empty() ? "" : key + ": ", e.what()));
  } catch (const nlohmann::json::exception& e) {
    return fail(fmt::format("request body is not valid JSON: {}", e.what()));
  }
}

}  // namespace

Result<nlohmann::json> parse_request_json(std::string_view body, const RequestLimits& limits,
                                          std::string* field) {
  return parse_limited<nlohmann::json>(body, limits, field);
}

Result<nlohmann::ordered_json> parse_request_json_ordered(std::string_view body,
                                                          const RequestLimits& limits,
                                                          std::string* field) {
  return parse_limited<nlohmann::ordered_json>(body, limits, field);
}

}  // namespace bs::server
