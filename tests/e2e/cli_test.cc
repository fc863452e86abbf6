// The blockspec CLI as a user runs it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct CliRun {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};

CliRun run(const std::string& args, const std::string& env = "") {
  // One stderr file per call: ctest runs the tests of this file in parallel processes.
  static int counter = 0;
  const std::string err_file = std::string(BS_BINARY_DIR) + "/cli_test_stderr_" +
                               std::to_string(getpid()) + "_" + std::to_string(counter++) + ".txt";
  const std::string cmd =
      env + (env.empty() ? "" : " ") + BS_BINARY_DIR + "/blockspec " + args + " 2>" + err_file;
  CliRun r{};
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (FILE* f = fopen(err_file.c_str(), "r")) {
    while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) r.err.append(buf.data(), n);
    fclose(f);
  }
  std::remove(err_file.c_str());
  return r;
}

const std::string kModel = std::string(BS_SOURCE_DIR) + "/models/stories260K";

TEST(Cli, GreedyStoryFromBos) {
  // The model's known greedy story (llama2.c reference runner, upstream doc/stories260K.md).
  const CliRun r = run("generate --model " + kModel +
                       " --no-drafter --prompt '' --max-tokens 100 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(
      r.out.rfind("Once upon a time, there was a little girl named Lily. She loved to play outside "
                  "in the park.",
                  0),
      0u)
      << r.out;
  EXPECT_NE(r.err.find("100 generated"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST(Cli, GreedyContinuesAPrompt) {
  const CliRun r = run("generate --model " + kModel +
                       " --no-drafter --prompt 'Once upon a time' --max-tokens 30");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(", there was a little girl named Lily.", 0), 0u) << r.out;
}

// --verify-budget auto (verify-length scheduling) leaves greedy output unchanged; the summary
// gives the speculative step's five phase times.
TEST(Cli, VerifyBudgetKeepsGreedyOutputAndPhasesAreReported) {
  const std::string base = "generate --model " + kModel + " --drafter " + kModel +
                           "-dflash --prompt 'Tom had a red' --max-tokens 60";
  const CliRun off = run(base + " --verify-budget off");
  const CliRun on = run(base + " --verify-budget auto");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  ASSERT_EQ(on.exit_code, 0) << on.err;
  EXPECT_EQ(on.out, off.out);
  for (const char* phase : {"propose ", "verify ", "accept + read-back ", "commit ", "observe "}) {
    EXPECT_NE(on.err.find(phase), std::string::npos) << phase << " in " << on.err;
  }
}

// The reply continues the prompt's text: its first word keeps its leading space, as vLLM and
// llama.cpp print it (SentencePiece's decoder strips one leading space of the whole text only).
TEST(Cli, TheReplyKeepsTheLeadingSpaceOfItsFirstWord) {
  for (const char* drafter : {"--no-drafter", ""}) {
    const CliRun r = run("generate --model " + kModel + " " + drafter +
                         " --prompt 'Tom had a red' --max-tokens 3");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, " ball.\n") << drafter;
  }
}

TEST(Cli, TokenizePrintsIds) {
  const CliRun r = run("tokenize --model " + kModel + " 'Tom had a red'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 274 287 381 261 352 266\n");
}

TEST(Cli, SeededSamplingIsReproducible) {
  const std::string args = "generate --model " + kModel +
                           " --no-drafter --prompt 'The dog' --max-tokens 40 --temperature 1 "
                           "--top-p 0.9 --seed 11";
  const CliRun a = run(args), b = run(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}

TEST(Cli, BadInputIsAClearError) {
  CliRun r = run("generate --model /nonexistent/model --prompt hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;

  r = run("generate --model " + kModel + " --no-such-flag");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no-such-flag"), std::string::npos) << r.err;

  r = run("generate --model " + kModel + " --temperature -1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("temperature"), std::string::npos) << r.err;

  r = run("generate --model " + kModel + " --max-tokens abc");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("max-tokens"), std::string::npos) << r.err;

  // stories260K has a 512-token context window.
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += "the dog ran ";
  r = run("generate --model " + kModel + " --no-drafter --prompt '" + long_prompt + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("prompt too long"), std::string::npos) << r.err;
}

// User errors: one readable line naming the flag or command, exit code 1.
TEST(Cli, UserErrorsAreReadableAndExitWith1) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"generate --max-tokens 0", "--max-tokens: must be at least 1, got 0"},
      {"generate --top-p 2", "--top-p: must be between 0 and 1, got 2"},
      {"generate --threads x", "--threads: must be a number (at least 0), got 'x'"},
      {"generate --verify-budget maybe", "--verify-budget: must be auto or off, got 'maybe'"},
      {"serve --port 70000", "--port: must be between 0 and 65535, got 70000"},
      {"generat --prompt hi", "unknown command 'generat'; did you mean 'generate'?"},
      {"serv", "unknown command 'serv'; did you mean 'serve'?"},
      {"frobnicate", "unknown command 'frobnicate'; the commands are generate, tokenize"},
      {"", "a command is required: generate, tokenize"},
      {"generate --no-such-flag", "no-such-flag"},
      {"tokenize hi", "--model is required"},
      {"generate --model /nonexistent/model", "/nonexistent/model"},
      {"generate --logit-bias 5", "--logit-bias '5': expected TOKEN_ID:BIAS"},
      {"generate --logit-bias -1:2", "--logit-bias '-1:2': expected TOKEN_ID:BIAS"},
      {"generate --logit-bias 5:up", "--logit-bias '5:up': expected TOKEN_ID:BIAS"},
      {"generate --logit-bias 5:200", "logit_bias value of token 5 must be in [-100, 100]"},
      {"generate --logit-bias 999:1", "logit_bias token id 999 out of range [0, 512)"},
      {"generate --repetition-penalty 0", "repetition_penalty must be a finite number > 0"},
  };
  for (const Case& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    EXPECT_LT(r.err.size(), 300u) << c.args << ": " << r.err;  // no 309-digit ranges
  }
  EXPECT_EQ(run("--version").exit_code, 0);
  EXPECT_EQ(run("generate --help").exit_code, 0);
}

// Generation also ends at the context window (512 tokens for stories260K): the CLI says so
// before, in one line, and the summary says why it stopped.
TEST(Cli, MaxTokensPastTheContextWindowIsNamed) {
  const std::string args =
      "generate --model " + kModel + " --no-drafter --ignore-eos --prompt 'Tom had a red' ";
  const CliRun r = run(args + "--max-tokens 1000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--max-tokens 1000 is more than the context window leaves: the model's "
                       "window is 512 tokens and the prompt takes 7, so generation stops at the "
                       "window, after at most 506 tokens\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("506 generated (stopped at the context window)"), std::string::npos)
      << r.err;
  const CliRun fits = run(args + "--max-tokens 20");
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_EQ(fits.err.find("context window"), std::string::npos) << fits.err;
}

// A model whose weights cannot fit is refused before loading, with the sizes (here the memory
// available is set by BLOCKSPEC_AVAILABLE_MEMORY; stories260K takes 1,040,128 B in F32).
TEST(Cli, AModelThatCannotFitIsRefusedBeforeLoading) {
  const std::string expected =
      "blockspec: error: " + kModel +
      ": the model does not fit in memory: its weights take 1015.8 KiB (F32 on the cpu backend), "
      "257.1 MiB with a margin for the runtime, and 1.0 MiB is available (set by "
      "BLOCKSPEC_AVAILABLE_MEMORY); raise or unset BLOCKSPEC_AVAILABLE_MEMORY\n";
  CliRun r =
      run("generate --device cpu --no-drafter --model " + kModel, "BLOCKSPEC_AVAILABLE_MEMORY=1M");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, expected);
  EXPECT_EQ(r.out, "");
  // (timeout: a serve that did start would never exit)
  r = run("serve --device cpu --port 0 --model " + kModel,
          "BLOCKSPEC_AVAILABLE_MEMORY=1M timeout 60");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the model does not fit in memory"), std::string::npos) << r.err;
  // Enough: it loads and runs, silently (no progress lines for a fast load).
  r = run("generate --device cpu --no-drafter --max-tokens 3 --prompt 'Tom had a red' --model " +
              kModel,
          "BLOCKSPEC_AVAILABLE_MEMORY=1G");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("load"), std::string::npos) << r.err;
}

// serve sizes its KV cache before it listens: a size that cannot fit is refused up front.
TEST(Cli, ServeRefusesAKvCacheThatDoesNotFit) {
  // At a utilization of 1e-6 the process may hold a few kB or MB: less than it already uses.
  CliRun r = run("serve --port 0 --memory-utilization 0.000001");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no memory left for a KV cache"), std::string::npos) << r.err;
  r = run("serve --port 0 --kv-cache-tokens 1000000000000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--kv-cache-tokens"), std::string::npos) << r.err;
  r = run("serve --port 0 --gpu-memory-utilization 1.5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("memory-utilization"), std::string::npos) << r.err;
}

TEST(Cli, ChatWrapsThePromptInTheTemplate) {
  CliRun r = run("generate --model " + kModel + " --no-drafter --chat --prompt hi");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;

  // stories260K with a chat template: --chat equals the rendered text as a plain prompt (the
  // template writes BOS itself, the plain prompt gets it from the tokenizer: no second BOS).
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(BS_BINARY_DIR) / ("cli_chat_model_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(kModel, dir);
  std::ofstream(dir / "chat_template.jinja")
      << "{{ bos_token }}{% for m in messages %}{{ m.role | capitalize }}: {{ m.content }} "
         "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}";
  const std::string common = "generate --no-drafter --max-tokens 12 --model " + dir.string();
  const CliRun chat = run(common + " --chat --prompt 'Once upon a time'");
  const CliRun plain = run(common + " --prompt 'User: Once upon a time Assistant:'");
  fs::remove_all(dir);
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(chat.out, plain.out);
  EXPECT_NE(chat.err.find("prompt"), std::string::npos);
}

// --print-prompt prints the text generate would tokenize (with --chat the rendered template,
// --chat-template-kwargs its variables) and exits without loading the model or generating.
TEST(Cli, ChatPrintPromptAndTemplateKwargs) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(BS_BINARY_DIR) / ("cli_chat_kwargs_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(kModel) / f, dir / f);  // no weights: --print-prompt loads none
  }
  std::ofstream(dir / "chat_template.jinja")
      << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
         "{% if add_generation_prompt %}<assistant>{% endif %}"
         "{% if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}";
  const std::string common = "generate --model " + dir.string() + " --prompt 'Tell a story'";
  CliRun r = run(common + " --chat --print-prompt");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<user>Tell a story<assistant>\n");
  EXPECT_EQ(r.err, "");
  r = run(common + " --chat --print-prompt --chat-template-kwargs '{\"enable_thinking\": false}'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<user>Tell a story<assistant><no_think>\n");
  r = run(common + " --print-prompt");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Tell a story\n");
  for (const char* bad : {"'{enable_thinking: false}'", "'[1]'", "''"}) {
    r = run(common + " --chat --print-prompt --chat-template-kwargs " + bad);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find("--chat-template-kwargs"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  r = run(common + " --print-prompt --chat-template-kwargs '{}'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("needs --chat"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

}  // namespace
