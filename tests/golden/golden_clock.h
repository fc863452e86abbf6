// The clock of the chat-template goldens: tools/goldens/make_chat_template_goldens.py's NOW
// (2024-07-26 14:05:09), the time strftime_now formats in chat_template_test and in
// tools/chat_template/render_chat_template (the differential test against Jinja2).
#pragma once

#include <ctime>

namespace bs::golden {

inline std::tm golden_now() {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 14;
  t.tm_min = 5;
  t.tm_sec = 9;
  const std::time_t x = timegm(&t);
  gmtime_r(&x, &t);  // fills the weekday and day of the year
  return t;
}

}  // namespace bs::golden
