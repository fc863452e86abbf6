// Fuzzes rendering the repository's real chat templates (tests/data/chat_templates: Qwen3, QwQ,
// DeepSeek-R1-Distill, Mistral, Phi-3.5) with client-controlled input: the input is a JSON document
// {"messages": [...], ...} as a chat request carries it; its other members become template
// variables (chat_template_kwargs). Errors are Status values, never exceptions or crashes.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/chat_template.h"

namespace {

constexpr int kMaxDepth = 64;

std::vector<std::unique_ptr<bs::ChatTemplate>> load_templates() {
  std::vector<std::unique_ptr<bs::ChatTemplate>> out;
  for (const char* name : {"qwen3", "qwq_32b", "deepseek_r1_distill_qwen", "mistral_7b_v0_1",
                           "mistral_nemo", "phi3_5"}) {
    std::ifstream in(std::string(BS_SOURCE_DIR) + "/tests/data/chat_templates/" + name + ".jinja");
    std::stringstream ss;
    ss << in.rdbuf();
    auto t = bs::ChatTemplate::parse(ss.str(), "<s>", "</s>");
    if (!t.ok() || ss.str().empty()) std::abort();
    out.push_back(std::move(*t));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto templates = load_templates();
  // Nesting is bounded as the server's request parser bounds it (issue 18): deeper documents never
  // reach a template.
  bool too_deep = false;
  auto doc = nlohmann::ordered_json::parse(
      bs::fuzz::as_text(data, size),
      [&](int depth, nlohmann::ordered_json::parse_event_t, nlohmann::ordered_json&) {
        too_deep = too_deep || depth > kMaxDepth;
        return true;
      },
      /*allow_exceptions=*/false);
  if (too_deep || doc.is_discarded() || !doc.is_object()) return 0;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (auto it = doc.find("messages"); it != doc.end()) {
    messages = *it;
    doc.erase(it);
  }
  const bool add_generation_prompt = size % 2 == 0;
  for (const auto& t : templates) (void)t->render(messages, add_generation_prompt, doc);
  return 0;
}
