// render_chat_template: renders chat templates through blockspec's interpreter, for the
// differential test against Jinja2 (tools/goldens/diff_chat_templates.py).
//
//   render_chat_template TEMPLATE.jinja CONTEXT.json   # prints the text, or the error (exit 1)
//   render_chat_template --batch CASES.json            # one JSON result per line
//
// CONTEXT: {"messages": [...], "add_generation_prompt": bool, "bos_token": "...",
// "eos_token": "...", "extra": {...}}; "tools" and other kwargs go in "extra", as with
// ChatTemplate::render. CASES: {"cases": [{"template": PATH, ...CONTEXT}, ...]}; each output line
// is {"text": ...} or {"error": ..., "syntax": bool}. strftime_now reads the date the goldens use
// (2024-07-26 14:05:09), so templates that print today's date compare too.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "golden/golden_clock.h"
#include "tokenizer/chat_template_context.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_parser.h"

namespace {

using json = nlohmann::ordered_json;  // templates see dicts in their key order, as in Python

bool read_text(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

std::string string_or_empty(const json& c, const char* key) {
  auto it = c.find(key);
  return it != c.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Renders one case: {"text": ...} or {"error": ..., "syntax": bool}.
json render_case(const std::string& source, const json& c) {
  std::unique_ptr<bs::jinja::Template> tmpl;
  try {
    tmpl = bs::jinja::parse(source);
  } catch (const bs::jinja::Error& e) {
    return {{"error", "line " + std::to_string(e.line) + ": " + e.what()}, {"syntax", true}};
  }
  const json empty_list = json::array(), empty_object = json::object();
  const json& messages = c.contains("messages") ? c["messages"] : empty_list;
  const json& extra = c.contains("extra") ? c["extra"] : empty_object;
  const bool agp = c.value("add_generation_prompt", false);
  bs::jinja::RenderOptions opt;
  opt.now = bs::golden::golden_now;
  try {
    const auto vars = bs::chat_template_variables(messages, agp, string_or_empty(c, "bos_token"),
                                                  string_or_empty(c, "eos_token"), extra);
    return {{"text", bs::jinja::render(*tmpl, vars, opt)}};
  } catch (const bs::jinja::Error& e) {
    return {{"error", "line " + std::to_string(e.line) + ": " + e.what()}, {"syntax", false}};
  }
}

int batch(const std::string& path) {
  std::string text;
  if (!read_text(path, text)) {
    std::cerr << "cannot read " << path << "\n";
    return 2;
  }
  const json cases = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!cases.is_object() || !cases.contains("cases") || !cases["cases"].is_array()) {
    std::cerr << path << ": expected {\"cases\": [...]}\n";
    return 2;
  }
  std::map<std::string, std::string> sources;
  for (const json& c : cases["cases"]) {
    const std::string tpath = string_or_empty(c, "template");
    auto it = sources.find(tpath);
    if (it == sources.end()) {
      std::string src;
      if (!read_text(tpath, src)) {
        std::cout << json{{"error", "cannot read " + tpath}, {"syntax", false}}.dump() << "\n";
        continue;
      }
      it = sources.emplace(tpath, std::move(src)).first;
    }
    std::cout << render_case(it->second, c).dump(-1, ' ', false, json::error_handler_t::replace)
              << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--batch") return batch(argv[2]);
  if (argc != 3) {
    std::cerr << "usage: render_chat_template TEMPLATE.jinja CONTEXT.json\n"
                 "       render_chat_template --batch CASES.json\n";
    return 2;
  }
  std::string source, context;
  if (!read_text(argv[1], source) || !read_text(argv[2], context)) {
    std::cerr << "cannot read " << argv[1] << " or " << argv[2] << "\n";
    return 2;
  }
  const json c = json::parse(context, nullptr, /*allow_exceptions=*/false);
  if (!c.is_object()) {
    std::cerr << argv[2] << ": not a JSON object\n";
    return 2;
  }
  const json r = render_case(source, c);
  if (r.contains("error")) {
    std::cerr << "error: " << r["error"].get<std::string>() << "\n";
    return 1;
  }
  std::cout << r["text"].get<std::string>();
  return 0;
}
