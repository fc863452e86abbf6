#!/usr/bin/env python3
"""Goldens for chat requests as OpenAI clients send them (src/server/openai.h parse_messages).

The official clients send the messages of a tool loop in the wire format: the assistant's turn
that called tools comes back with "content": null and each call's "arguments" as a JSON string,
tool results carry "tool_call_id", and content may be a list of {"type": "text"} parts. vLLM
normalises these before rendering (vllm/entrypoints/chat_utils.py, "string" content format):

  content None / absent -> "";  a list of text parts -> the texts joined with "\\n"
  assistant tool_calls: function.arguments, when a non-empty string, -> json.loads(arguments)
                        (None or "" -> {})
  tool_call_id, name and the other fields stay on the message

normalize() below re-implements that in a few lines (here an argument string that is not valid
JSON is kept as the string: vLLM answers 400 there, blockspec renders it as sent). Each case is
then rendered by Jinja2 in transformers' environment (make_chat_template_goldens.make_env) with
a real template of tests/data/chat_templates, so the goldens do not come from the C++ code.

Writes tests/data/chat_templates/openai_request_goldens.json: per case the request body (as a
client sends it) and the expected prompt text or error.

  apt-get install -y python3-jinja2
  python3 tools/goldens/make_openai_chat_goldens.py
"""

import copy
import json
import os
import sys

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_template_goldens import ROOT, TEMPLATES, WEATHER_TOOL, SEARCH_TOOL, make_env, render_case  # noqa: E402


def normalize(messages):
    out = []
    for m in copy.deepcopy(messages):
        content = m.get("content")
        if content is None:
            m["content"] = ""
        elif isinstance(content, list):
            m["content"] = "\n".join(part["text"] for part in content)
        calls = m.get("tool_calls")
        if "tool_calls" in m and calls is None:
            del m["tool_calls"]
        for call in calls or []:
            fn = call["function"]
            args = fn.get("arguments")
            if args is None or args == "":
                fn["arguments"] = {}
            elif isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args)
                except ValueError:
                    pass
        out.append(m)
    return out


USER = {"role": "user", "content": "What is the weather in Zürich?"}
CALL = {"id": "call_9f2a", "type": "function",
        "function": {"name": "get_weather",
                     "arguments": "{\"city\": \"Zürich\", \"unit\": \"celsius\", \"days\": 2}"}}
RESULT = {"role": "tool", "tool_call_id": "call_9f2a",
          "content": "{\"temperature\": 21, \"condition\": \"sunny\"}"}

CASES = {
    # The second turn of the standard tool loop (openai npm / Python clients).
    "tool_loop_turn2": {
        "messages": [{"role": "system", "content": "You are a helpful assistant."}, USER,
                     {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT],
        "tools": [WEATHER_TOOL]},
    # The third turn: the final answer, then a new question.
    "tool_loop_turn3": {
        "messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT,
                     {"role": "assistant", "content": "It is 21 °C and sunny."},
                     {"role": "user", "content": "And tomorrow?"}],
        "tools": [WEATHER_TOOL]},
    # content absent (not null), two calls, one with arguments "" and one with nested JSON.
    "two_calls_no_content": {
        "messages": [USER, {"role": "assistant", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
            {"id": "call_2", "type": "function", "function": {
                "name": "search", "arguments": "{\"query\": \"Zürich events\", \"tags\": [\"a\", \"b\"], "
                                               "\"score\": null}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "concert"}],
        "tools": [WEATHER_TOOL, SEARCH_TOOL]},
    # Arguments that are not valid JSON stay the string the client sent.
    "invalid_json_arguments": {
        "messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": "{city: Zürich"}}]},
            RESULT],
        "tools": [WEATHER_TOOL]},
    # Content as a list of text parts, in every role; tool_calls: null is as absent.
    "content_parts": {
        "messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                     {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                  {"type": "text", "text": "world"}]},
                     {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}],
                      "tool_calls": None},
                     {"role": "user", "content": "Bye"}]},
    # Template variables next to a tool loop.
    "tool_loop_no_thinking": {
        "messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT],
        "tools": [WEATHER_TOOL], "chat_template_kwargs": {"enable_thinking": False}},
}

RENDERED_WITH = ["qwen3", "qwq_32b"]


def main():
    out_dir = os.path.join(ROOT, "tests", "data", "chat_templates")
    env = make_env()
    cases = []
    for stem in RENDERED_WITH:
        bos, eos = TEMPLATES[stem]
        with open(os.path.join(out_dir, stem + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        for name, request in CASES.items():
            variables = {"messages": normalize(request["messages"]), "tools": request.get("tools"),
                         "documents": None, "add_generation_prompt": True, "bos_token": bos,
                         "eos_token": eos}
            variables.update(request.get("chat_template_kwargs", {}))
            case = {"name": f"{stem}/{name}", "template": stem + ".jinja", "bos_token": bos,
                    "eos_token": eos, "request": request}
            case.update(render_case(env, source, variables))
            cases.append(case)
    doc = {"generator": "tools/goldens/make_openai_chat_goldens.py",
           "jinja2_version": jinja2.__version__, "cases": cases}
    path = os.path.join(out_dir, "openai_request_goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(cases)} cases ({sum('error' in c for c in cases)} errors)")


if __name__ == "__main__":
    main()
