// blockspec command line: generate | tokenize (here); bench | synth | serve (own files).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "cli/validators.h"
#include "engine/generate.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using bs::cli::at_least;
using bs::cli::number_in;

int fail(const bs::Status& status) {
  fmt::print(stderr, "blockspec: error: {}\n", status.message());
  return 1;
}

struct GenerateArgs {
  std::string model;
  std::string drafter;
  bool no_drafter = false;
  std::string prompt;
  int64_t max_tokens = 256;
  bool max_tokens_given = false;  // --max-tokens on the command line
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int top_k = 0;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int64_t min_tokens = 0;
  std::vector<std::string> logit_bias;  // "ID:BIAS"
  std::optional<uint64_t> seed;
  int64_t draft_tokens = 0;
  double draft_confidence_min = 0;
  bs::VerifyBudget verify_budget = bs::VerifyBudget::kOff;
  std::string trace;
  int threads = 0;
  std::string device = "auto";
  int flashmap_steps = 0;
  float flashmap_noise_scale = 1.0f;
  bool ignore_eos = false;
  bool drafter_fp8 = false;
  bool chat = false;
  std::optional<std::string> chat_template_kwargs;  // a JSON object, with --chat
  bool print_prompt = false;
};

// --logit-bias TOKEN_ID:BIAS (the range of the bias: SamplingParams::validate).
bs::Result<std::pair<int32_t, float>> parse_logit_bias(const std::string& entry) {
  const char* end = entry.data() + entry.size();
  const char* colon = std::find(entry.data(), end, ':');
  int32_t id = -1;
  float bias = 0;
  const auto [id_end, id_ec] = std::from_chars(entry.data(), colon, id);
  const auto [bias_end, bias_ec] = colon == end
                                       ? std::from_chars_result{end, std::errc::invalid_argument}
                                       : std::from_chars(colon + 1, end, bias);
  if (id_ec != std::errc() || id_end != colon || bias_ec != std::errc() || bias_end != end ||
      id < 0) {
    return bs::InvalidArgument("--logit-bias '{}': expected TOKEN_ID:BIAS, e.g. 2:-100", entry);
  }
  return std::pair{id, bias};
}

std::string percent_list(const bs::GenerateStats& st) {
  std::string out;
  for (size_t k = 0; k < st.position_offered.size(); ++k) {
    if (st.position_offered[k] == 0) break;
    const double rate =
        static_cast<double>(st.position_accepted[k]) / static_cast<double>(st.position_offered[k]);
    out += fmt::format("{}{:.2f}", k ? " " : "", rate);
  }
  return out;
}

// --chat: the prompt as one user message through the model's chat template, ready for the
// assistant's reply, with --chat-template-kwargs (a JSON object) as template variables. The text
// carries the template's special tokens (BOS included).
bs::Result<std::string> chat_prompt(const std::string& model_dir, const std::string& prompt,
                                    const std::optional<std::string>& kwargs_json) {
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  if (kwargs_json) {
    kwargs = nlohmann::ordered_json::parse(*kwargs_json, nullptr, /*allow_exceptions=*/false);
    if (!kwargs.is_object()) {
      return bs::InvalidArgument(
          "--chat-template-kwargs must be a JSON object such as '{{\"enable_thinking\": false}}', "
          "got '{}'",
          *kwargs_json);
    }
  }
  auto tmpl = bs::ChatTemplate::load(model_dir);
  if (!tmpl.ok()) return tmpl.status().with_context("--chat");
  return (*tmpl)->render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", prompt}}}),
                         /*add_generation_prompt=*/true, kwargs);
}

int run_generate(const GenerateArgs& a) {
  const auto [model_dir, drafter_dir] =
      bs::cli::resolve_model_dirs(a.model, a.drafter, a.no_drafter);

  auto tokenizer = bs::Tokenizer::load(model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  if (a.chat_template_kwargs && !a.chat) {
    return fail(bs::InvalidArgument("--chat-template-kwargs needs --chat"));
  }
  auto chat_text = a.chat ? chat_prompt(model_dir, a.prompt, a.chat_template_kwargs)
                          : bs::Result<std::string>(a.prompt);
  if (!chat_text.ok()) return fail(chat_text.status());
  if (a.print_prompt) {  // the text that would be tokenized, as is; no model is loaded
    std::fwrite(chat_text->data(), 1, chat_text->size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  auto backend = bs::make_backend(a.device, a.threads);
  if (!backend.ok()) return fail(backend.status());
  auto target = bs::load_target(model_dir, **backend);
  if (!target.ok()) return fail(target.status());
  std::unique_ptr<bs::Drafter> drafter;
  if (!drafter_dir.empty()) {
    bs::DrafterOptions dopt{.flashmap_steps = a.flashmap_steps,
                            .flashmap_noise_scale = a.flashmap_noise_scale,
                            .fp8_weights = a.drafter_fp8};
    auto loaded = bs::load_drafter(drafter_dir, **target, dopt);
    if (!loaded.ok()) return fail(loaded.status());
    drafter = std::move(*loaded);
  }

  // A rendered chat template already holds its special tokens: add none again.
  std::vector<int32_t> prompt = (*tokenizer)->encode(*chat_text, /*add_special_tokens=*/!a.chat);
  if (prompt.empty()) {
    if ((*tokenizer)->bos_id() < 0) {
      return fail(bs::InvalidArgument("empty prompt and the tokenizer has no BOS token"));
    }
    prompt.push_back((*tokenizer)->bos_id());
  }

  // Generation also ends at the context window; say so before it happens rather than stop short
  // silently. The last token generated is never fed back, hence the + 1.
  const int64_t window = (*target)->config().max_position_embeddings;
  const int64_t room = window - static_cast<int64_t>(prompt.size()) + 1;
  if (static_cast<int64_t>(prompt.size()) < window && a.max_tokens > room) {
    fmt::print(stderr,
               "blockspec: note: --max-tokens {}{} is more than the context window leaves: the "
               "model's window is {} tokens and the prompt takes {}, so generation stops at the "
               "window, after at most {} tokens\n",
               a.max_tokens, a.max_tokens_given ? "" : " (the default)", window, prompt.size(),
               room);
  }

  bs::GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.sampling = {.temperature = a.temperature,
                  .top_k = a.top_k,
                  .top_p = a.top_p,
                  .min_p = a.min_p,
                  .seed = a.seed,
                  .presence_penalty = a.presence_penalty,
                  .frequency_penalty = a.frequency_penalty,
                  .repetition_penalty = a.repetition_penalty,
                  .min_tokens = a.min_tokens};
  for (const std::string& entry : a.logit_bias) {
    auto bias = parse_logit_bias(entry);
    if (!bias.ok()) return fail(bias.status());
    opt.sampling.logit_bias.push_back(*bias);
  }
  if (!a.ignore_eos) opt.stop_ids = (*tokenizer)->eos_ids();
  opt.draft_tokens = a.draft_tokens;
  opt.draft_confidence_min = a.draft_confidence_min;
  opt.verify_budget = a.verify_budget;
  opt.trace_path = a.trace;
  if (drafter && opt.draft_tokens > drafter->max_drafts()) {
    return fail(bs::InvalidArgument("--draft-tokens {} exceeds the drafter's maximum {}",
                                    opt.draft_tokens, drafter->max_drafts()));
  }

  // The reply continues the prompt's text (e.g. " ball" after "Tom had a red", its space kept).
  bs::StreamDecoder stream(**tokenizer, /*skip_special_tokens=*/true, prompt);
  const auto on_token = [&](int32_t id) {
    const std::string text = stream.push(id);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  bs::GenerateStats st;
  auto out = drafter ? bs::generate_speculative(**target, *drafter, prompt, opt, on_token, &st)
                     : bs::generate_plain(**target, prompt, opt, on_token, &st);
  if (!out.ok()) return fail(out.status());
  const std::string rest = stream.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);

  const double total = st.prefill_seconds + st.decode_seconds;
  fmt::print(
      stderr, "[{} tokens prompt, {} generated{}, {:.1f} tokens/s decode, {:.3f} s total]\n",
      st.prompt_tokens, st.generated_tokens,
      st.finish == bs::FinishReason::kContext ? " (stopped at the context window)" : "",
      st.decode_seconds > 0 ? static_cast<double>(st.generated_tokens) / st.decode_seconds : 0.0,
      total);
  if (drafter) {
    fmt::print(stderr,
               "[{} drafter: acceptance length {:.2f} over {} steps, {}/{} drafts accepted; "
               "per-position acceptance {}; host time {}]\n",
               drafter->family(), st.acceptance_length(), st.steps, st.accepted, st.drafted,
               percent_list(st), bs::cli::phase_times(st));
  }
  return 0;
}

int run_tokenize(const std::string& model_dir, const std::string& text, bool no_special) {
  auto tokenizer = bs::Tokenizer::load(model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  const auto ids = (*tokenizer)->encode(text, !no_special);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += fmt::format("{}{}", i ? " " : "", ids[i]);
  fmt::print("{}\n", line);
  return 0;
}

// Levenshtein distance (ASCII command names).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The error for a command line whose first argument is not a command (CLI11 would say "A
// subcommand is required"): names the closest command when one is close, else lists them.
// Empty when the first argument is an option or a command.
std::string command_error(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  if (argc < 2) return fmt::format("a command is required: {} (blockspec --help)", list);
  const std::string_view word = argv[1];
  if (word.starts_with('-') || std::ranges::find(names, word) != names.end()) return {};
  const std::string* best = nullptr;
  size_t best_distance = 0;
  for (const auto& n : names) {
    const size_t d = edit_distance(word, n);
    if (best == nullptr || d < best_distance) best = &n, best_distance = d;
  }
  // Close: a typo or two, or the start of a command name.
  if (best != nullptr && (best_distance <= std::max<size_t>(2, word.size() / 3) ||
                          (word.size() >= 3 && best->starts_with(word)))) {
    return fmt::format("unknown command '{}'; did you mean '{}'?", word, *best);
  }
  return fmt::format("unknown command '{}'; the commands are {} (blockspec --help)", word, list);
}

struct TokenizeArgs {
  std::string model;
  std::string text;
  bool no_special = false;
};

int parse_and_run(CLI::App& app, int argc, char** argv, CLI::App* gen, GenerateArgs& g,
                  CLI::App* tok, const TokenizeArgs& t) {
  if (const std::string error = command_error(app, argc, argv); !error.empty()) {
    fmt::print(stderr, "blockspec: error: {}\n", error);
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every user error exits 1 (CLI11's own codes vary).
    return app.exit(e) == 0 ? 0 : 1;
  }
  g.max_tokens_given = gen->get_option("--max-tokens")->count() > 0;
  if (gen->parsed()) return run_generate(g);
  if (tok->parsed()) return run_tokenize(t.model, t.text, t.no_special);
  if (int rc = 1; bs::cli::run_serve_if_parsed(&rc)) return rc;
  return bs::cli::run_registered(app);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"blockspec: block-diffusion speculative decoding for LLMs (lossless)"};
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("blockspec: error: {}\nRun with --help for more information.\n", e.what());
  });
  app.set_version_flag("--version", "blockspec 0.1.0");

  GenerateArgs g;
  auto* gen = app.add_subcommand("generate", "Generate a completion and stream it to stdout");
  gen->add_option("--model", g.model,
                  "Target model folder (Hugging Face format); default: the embedded stories260K");
  gen->add_option("--drafter", g.drafter, "Drafter folder (DFlash, DSpark, DFlash2 or FlashMap)");
  gen->add_flag("--no-drafter", g.no_drafter, "Plain autoregressive decoding");
  gen->add_flag("--drafter-fp8", g.drafter_fp8,
                "DFlash drafter weights in FP8 (one scale per row): faster drafting, output "
                "unchanged");
  gen->add_option("--prompt", g.prompt, "Prompt text (empty: start from BOS)");
  gen->add_option("--max-tokens", g.max_tokens, "Tokens to generate")->check(at_least(1));
  gen->add_option("--temperature", g.temperature, "Sampling temperature; 0 = greedy")
      ->check(number_in(0, 100));
  gen->add_option("--top-p", g.top_p, "Nucleus sampling mass")->check(number_in(0, 1));
  gen->add_option("--top-k", g.top_k, "Keep the k most likely tokens; 0 = off")->check(at_least(0));
  gen->add_option("--min-p", g.min_p,
                  "Keep tokens at least this fraction as likely as the most likely; 0 = off")
      ->check(number_in(0, 1));
  gen->add_option("--presence-penalty", g.presence_penalty,
                  "Subtract P from the logit of every token generated so far (OpenAI's)")
      ->check(number_in(-2, 2));
  gen->add_option("--frequency-penalty", g.frequency_penalty,
                  "Subtract F x its count from the logit of every generated token (OpenAI's)")
      ->check(number_in(-2, 2));
  gen->add_option("--repetition-penalty", g.repetition_penalty,
                  "Divide positive / multiply negative logits of prompt and generated tokens by "
                  "R (transformers' / vLLM's); 1 = off");
  gen->add_option("--min-tokens", g.min_tokens, "No end-of-sequence token before this many tokens")
      ->check(at_least(0));
  gen->add_option("--logit-bias", g.logit_bias,
                  "TOKEN_ID:BIAS added to that token's logit (repeatable; -100 bans it)");
  gen->add_option("--seed", g.seed, "Random seed (sampling and drafter noise)");
  gen->add_option("--draft-tokens", g.draft_tokens, "Drafts verified per step (default: block-1)")
      ->check(at_least(1));
  gen->add_option("--draft-confidence-min", g.draft_confidence_min,
                  "DSpark: verify only drafts whose predicted prefix survival is >= P (0 = off)")
      ->check(number_in(0, 1));
  bs::cli::add_verify_budget_option(gen, &g.verify_budget);
  gen->add_option("--trace", g.trace, "Write one JSON line per speculative step to FILE");
  gen->add_option("--threads", g.threads, "CPU threads (default: all cores)")->check(at_least(0));
  gen->add_option("--device", g.device, "cpu, cuda or auto (CUDA when a GPU is present)");
  gen->add_option("--flashmap-steps", g.flashmap_steps,
                  "FlashMap jumps per draft (default: config)")
      ->check(at_least(0));
  gen->add_option("--flashmap-noise-scale", g.flashmap_noise_scale,
                  "FlashMap noise scale (0: deterministic drafts)")
      ->check(at_least(0));
  gen->add_flag("--ignore-eos", g.ignore_eos, "Do not stop at end-of-sequence tokens");
  gen->add_flag("--chat", g.chat,
                "Wrap the prompt as one user message in the model's chat template");
  gen->add_option("--chat-template-kwargs", g.chat_template_kwargs,
                  "With --chat: template variables as a JSON object, e.g. "
                  "'{\"enable_thinking\": false}'");
  gen->add_flag("--print-prompt", g.print_prompt,
                "Print the prompt text (with --chat: the rendered chat template) and exit "
                "without generating");

  TokenizeArgs t;
  auto* tok = app.add_subcommand("tokenize", "Print the token ids of TEXT, space-separated");
  tok->add_option("--model", t.model, "Folder with tokenizer.json")->required();
  tok->add_option("text", t.text, "Text to tokenize")->required();
  tok->add_flag("--no-special", t.no_special, "Do not add BOS/special tokens");

  bs::cli::register_bench(app);
  bs::cli::register_serve(app);

  try {
    return parse_and_run(app, argc, argv, gen, g, tok, t);
  } catch (const std::exception& e) {  // never abort: whatever escaped is reported
    fmt::print(stderr, "blockspec: error: {}\n", e.what());
    return 1;
  }
}
