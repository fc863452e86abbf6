#!/usr/bin/env python3
"""Differential test of blockspec's chat template interpreter against Jinja2.

For every *.jinja template in a folder, renders a set of conversations (the goldens' conversations
of make_chat_template_goldens.py plus a few more: content as a list of parts, None content, tool
calls without ids, enable_thinking with reasoning, ...) with add_generation_prompt true and false,
once with Jinja2 in transformers' environment (make_chat_template_goldens.make_env) and once with
build/render_chat_template (tools/chat_template/render_chat_template.cc), and reports mismatches:
texts that differ, or one side failing where the other renders. Both failing is a match (a
template that raises on purpose, or inputs it does not support). A template with a NAME.json
beside it renders with those variables instead (e.g. feature tests with their own context).

  ninja -C build render_chat_template
  python3 tools/goldens/diff_chat_templates.py /tmp/difft/templates [--bin build/render_chat_template]
      [--show N] [--only SUBSTRING] [--convs NAME,...] [--json OUT.json]
"""

import argparse
import collections
import copy
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_chat_template_goldens as goldens  # noqa: E402

ROOT = goldens.ROOT

USER_PARTS = {"role": "user", "content": [{"type": "text", "text": "Describe this:"},
                                          {"type": "image"},
                                          {"type": "text", "text": "briefly."}]}
SYSTEM_PARTS = {"role": "system", "content": [{"type": "text", "text": "Be terse."}]}
ASSISTANT_NONE = {"role": "assistant", "content": None,
                  "tool_calls": [{"type": "function",
                                  "function": {"name": "search",
                                               "arguments": {"query": "x", "tags": []}}}]}
REASONING = {"role": "assistant", "content": "Paris.", "reasoning_content": "Capital of France."}

RICH_TOOL = {  # nested schema: enum, defaults, arrays of objects, anyOf, numbers
    "type": "function",
    "function": {
        "name": "book_flight",
        "description": "Book a flight.\nReturns a confirmation id.",
        "parameters": {
            "type": "object",
            "properties": {
                "passengers": {"type": "array", "items": {
                    "type": "object", "properties": {"name": {"type": "string"},
                                                     "age": {"type": "integer", "minimum": 0}},
                    "required": ["name"]}},
                "class": {"type": "string", "enum": ["economy", "business"], "default": "economy"},
                "max_price": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None},
                "flexible": {"type": "boolean", "default": False},
            },
            "required": ["passengers"],
        },
    },
}
RICH_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call99999", "type": "function",
     "function": {"name": "book_flight",
                  "arguments": {"passengers": [{"name": "Zoë", "age": 7}], "class": "business",
                                "max_price": 1234.5, "flexible": True, "note": None,
                                "ratio": 1e-07, "big": 10000000000000000.0}}}]}
BARE_FUNCTION = {"name": "ping", "description": "Ping a host.",
                 "parameters": {"type": "object", "properties": {"host": {"type": "string"}}}}

EXTRA_CONVERSATIONS = {
    "rich_tool_call": ([goldens.SYSTEM, {"role": "user", "content": "Book it."}, RICH_CALL,
                        {"role": "tool", "tool_call_id": "call99999", "name": "book_flight",
                         "content": [{"type": "text", "text": "{\"id\": \"X1\"}"}]}],
                       {"tools": [RICH_TOOL, BARE_FUNCTION]}),
    "prefill_last_assistant": ([goldens.USER1, {"role": "assistant", "content": "The capital is"}],
                               {"continue_final_message": True}),
    "documents": ([goldens.USER1], {"documents": [{"title": "Paris", "text": "Paris is the capital."},
                                                  {"text": "No title here."}]}),
    "thinking_keys": ([goldens.SYSTEM, goldens.USER1,
                       {"role": "assistant", "content": "Paris.", "thinking": "France -> Paris.",
                        "reasoning": "France -> Paris."}, goldens.USER2],
                      {"reasoning_effort": "low", "model_identity": "You are a test model.",
                       "thinking": True, "tools_in_user_message": True}),
    "user_none_content": ([{"role": "user", "content": None}], {}),
    "named_messages": ([{"role": "system", "content": "Sys", "name": "root"},
                        {"role": "user", "content": "Hi", "name": "alice"},
                        {"role": "assistant", "content": "Hello alice", "name": "bot"},
                        {"role": "user", "content": "Bye", "name": "alice"}], {}),
    "content_parts": ([SYSTEM_PARTS, USER_PARTS], {}),
    "content_parts_multi": ([USER_PARTS, {"role": "assistant", "content": [
        {"type": "text", "text": "A cat."}]}, goldens.USER2], {}),
    "tool_call_no_id_none_content": ([goldens.USER1, ASSISTANT_NONE,
                                      {"role": "tool", "content": "nothing"}],
                                     {"tools": [goldens.SEARCH_TOOL]}),
    "reasoning_thinking_false": ([goldens.USER1, REASONING, goldens.USER2],
                                 {"enable_thinking": False}),
    "reasoning_thinking_true": ([goldens.SYSTEM, goldens.USER1, REASONING, goldens.USER2],
                                {"enable_thinking": True, "tools": [goldens.WEATHER_TOOL]}),
    "tools_multi_turn": ([goldens.SYSTEM, goldens.USER1, goldens.TOOL_CALL, goldens.TOOL_RESULT,
                          {"role": "assistant", "content": "21 C."}, goldens.USER2],
                         {"tools": [goldens.WEATHER_TOOL, goldens.SEARCH_TOOL],
                          "reasoning_effort": "high", "builtin_tools": ["browser", "python"]}),
    "whitespace_content": ([{"role": "user", "content": "  spaced  \n\n"},
                            {"role": "assistant", "content": "\n ok \n"},
                            {"role": "user", "content": "\n"}], {}),
}


def conversations():
    convs = dict(goldens.CONVERSATIONS)
    convs.update(EXTRA_CONVERSATIONS)
    return convs


def jinja_render(env, source, messages, agp, bos, eos, extra):
    variables = {"messages": copy.deepcopy(messages), "tools": extra.get("tools"),
                 "documents": extra.get("documents"), "add_generation_prompt": agp,
                 "bos_token": bos, "eos_token": eos}
    variables.update(copy.deepcopy(extra))
    return goldens.render_case(env, source, variables)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "render_chat_template"))
    ap.add_argument("--show", type=int, default=3, help="mismatches shown per template")
    ap.add_argument("--only", default="", help="templates whose name contains this")
    ap.add_argument("--json", default="", help="write every mismatch here")
    ap.add_argument("--convs", default="", help="comma-separated conversation names (default all)")
    args = ap.parse_args()

    env = goldens.make_env()
    bos, eos = "<s>", "</s>"
    names = sorted(f for f in os.listdir(args.folder) if f.endswith(".jinja") and args.only in f)
    cases, expected = [], []
    for name in names:
        path = os.path.join(args.folder, name)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        convs = conversations()
        ctx_path = path[:-len(".jinja")] + ".json"
        if os.path.exists(ctx_path):  # a template with its own variables renders with those only
            with open(ctx_path, encoding="utf-8") as f:
                ctx = json.load(f)
            convs = {"own_context": (ctx.pop("messages", []), ctx)}
        for conv, (messages, extra) in convs.items():
            if args.convs and conv not in args.convs.split(",") and conv != "own_context":
                continue
            for agp in (True, False):
                expected.append(jinja_render(env, source, messages, agp, bos, eos, extra))
                cases.append({"template": path, "name": name, "conv": conv, "agp": agp,
                              "messages": messages, "add_generation_prompt": agp,
                              "bos_token": bos, "eos_token": eos, "extra": extra})

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False)
        batch = f.name
    try:
        proc = subprocess.run([args.bin, "--batch", batch], capture_output=True, timeout=600)
    finally:
        os.unlink(batch)
    lines = proc.stdout.decode("utf-8", "replace").split("\n")[:-1]  # not splitlines: U+2028
    if proc.returncode != 0 or len(lines) != len(cases):
        print(f"render_chat_template failed (rc {proc.returncode}, {len(lines)} of {len(cases)} "
              f"results): {proc.stderr.decode()[-2000:]}")
        return 2

    per_template = collections.OrderedDict((n, []) for n in names)
    kinds = collections.Counter()
    for case, want, line in zip(cases, expected, lines):
        got = json.loads(line)
        if "expected" in want and "text" in got and want["expected"] == got["text"]:
            continue
        if "error" in want and "error" in got:
            continue
        if "expected" in want and "text" in got:
            kind = "text"
        elif "expected" in want:
            kind = "cpp_error"
        else:
            kind = "cpp_renders"
        kinds[kind] += 1
        per_template[case["name"]].append((case, want, got, kind))

    bad = [(n, m) for n, m in per_template.items() if m]
    for name, mismatches in bad:
        print(f"== {name}: {len(mismatches)} mismatches")
        for case, want, got, kind in mismatches[:args.show]:
            print(f"  -- {case['conv']} agp={case['agp']} [{kind}]")
            if kind == "text":
                w, g = want["expected"], got["text"]
                i = next((k for k in range(min(len(w), len(g))) if w[k] != g[k]),
                         min(len(w), len(g)))
                print(f"     at {i}: jinja2 {w[max(0, i - 60):i + 80]!r}")
                print(f"     at {i}: cpp    {g[max(0, i - 60):i + 80]!r}")
            elif kind == "cpp_error":
                print(f"     cpp error: {got['error']}")
            else:
                print(f"     jinja2 error: {want['error']}")
    n_ok = len(cases) - sum(kinds.values())
    print(f"\n{len(names)} templates, {len(cases)} renders: {n_ok} match, "
          f"{sum(kinds.values())} mismatch ({dict(kinds)}); "
          f"{len(names) - len(bad)} templates match on every conversation")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([{"template": c["name"], "conv": c["conv"], "agp": c["agp"], "kind": k,
                        "jinja2": w, "cpp": g} for _, ms in bad for c, w, g, k in ms], f,
                      ensure_ascii=False, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
