#!/usr/bin/env python3
"""Goldens for bs::ChatTemplate (src/tokenizer/chat_template.h), rendered by Jinja2 itself.

Renders real model chat templates (tests/data/chat_templates/*.jinja, sources in NOTICE.md) over a
set of conversations, plus one small template per language feature, in the environment Hugging
Face transformers renders chat templates in (re-implemented here in a few lines so the script needs
only Jinja2):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[generation tag, jinja2.ext.loopcontrols])
  globals raise_exception(msg) -> TemplateError, strftime_now(fmt) (fixed date here),
  filter tojson = json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)
  render(messages=..., tools=None, documents=None, add_generation_prompt=..., bos_token=...,
         eos_token=..., **extra)

Writes tests/data/chat_templates/goldens.json: every case with its inputs and either the expected
text or the expected error (kind, message, and the line of syntax errors).

  apt-get install -y python3-jinja2   # Debian 12: Jinja2 3.1
  python3 tools/goldens/make_chat_template_goldens.py [--out tests/data/chat_templates]
"""

import argparse
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.exceptions import TemplateError, TemplateSyntaxError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime.datetime(2024, 7, 26, 14, 5, 9)  # what strftime_now formats
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class GenerationTag(Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_case(env, source, variables):
    """Returns {"expected": text} or {"error": {...}}."""
    try:
        tmpl = env.from_string(source)
    except TemplateSyntaxError as e:
        return {"error": {"kind": "syntax", "line": e.lineno, "message": e.message}}
    try:
        return {"expected": tmpl.render(**variables)}
    except TemplateError as e:
        kind = "raise" if type(e) is TemplateError else type(e).__name__
        return {"error": {"kind": kind, "message": str(e)}}
    except Exception as e:  # Python errors inside the template (TypeError, ...)
        return {"error": {"kind": type(e).__name__, "message": str(e)}}


# ---- real templates and conversations ----

TEMPLATES = {  # file stem -> (bos_token, eos_token) of the model's tokenizer_config.json
    "qwen3": ("", "<|im_end|>"),
    "qwq_32b": ("", "<|im_end|>"),
    "mistral_7b_v0_1": ("<s>", "</s>"),
    "mistral_nemo": ("<s>", "</s>"),
    "phi3_5": ("<s>", "<|endoftext|>"),
    "deepseek_r1_distill_qwen": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "Temperature unit"},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Query text"},
                "tags": {"type": "array", "items": {"type": "string"},
                         "description": "Filter tags"},
                "score": {"type": ["number", "null"], "description": "Minimum score"},
            },
            "required": ["query"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER1 = {"role": "user", "content": "What is the capital of France?"}
ASSISTANT1 = {"role": "assistant", "content": "The capital of France is Paris."}
USER2 = {"role": "user", "content": "And of Germany?"}
TOOL_CALL = {
    "role": "assistant", "content": "",
    "tool_calls": [{"id": "call12345", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": {"city": "Zürich", "unit": "celsius"}}}],
}
TOOL_CALL_STR = {  # arguments as a JSON string (OpenAI wire format; DeepSeek's template needs it)
    "role": "assistant", "content": "",
    "tool_calls": [{"id": "call12345", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": "{\"city\": \"Zürich\", \"unit\": \"celsius\"}"}}],
}
TWO_TOOL_CALLS = {
    "role": "assistant", "content": "Let me check both.",
    "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "call00002", "type": "function",
         "function": {"name": "search", "arguments": {"query": "Paris events", "tags": ["a", "b"],
                                                      "score": 0.5}}},
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
               "content": "{\"temperature\": 21, \"condition\": \"sunny\"}"}

CONVERSATIONS = {
    "user": ([{"role": "user", "content": "Hello!"}], {}),
    "system_user": ([SYSTEM, USER1], {}),
    "multi_turn": ([SYSTEM, USER1, ASSISTANT1, USER2], {}),
    "multi_turn_no_system": ([USER1, ASSISTANT1, USER2, {"role": "assistant", "content": "Berlin."}], {}),
    "non_ascii": ([{"role": "user", "content": "  Grüße aus Zürich! 你好，世界 🌍\n\tÇa va ?  "},
                   {"role": "assistant", "content": "Très bien — danke! ✨"},
                   {"role": "user", "content": "Ελληνικά: αβγ; עברית; emoji 👩‍💻"}], {}),
    "tools": ([SYSTEM, {"role": "user", "content": "Weather in Zürich?"}],
              {"tools": [WEATHER_TOOL, SEARCH_TOOL]}),
    "tool_call_round": ([{"role": "user", "content": "Weather in Zürich?"}, TOOL_CALL, TOOL_RESULT,
                         {"role": "assistant", "content": "It is 21 °C and sunny in Zürich."}],
                        {"tools": [WEATHER_TOOL]}),
    "tool_call_string_args": ([{"role": "user", "content": "Weather in Zürich?"}, TOOL_CALL_STR,
                               TOOL_RESULT], {"tools": [WEATHER_TOOL]}),
    "two_tool_calls": ([{"role": "user", "content": "Paris?"}, TWO_TOOL_CALLS,
                        {"role": "tool", "tool_call_id": "call00001", "content": "18 C"},
                        {"role": "tool", "tool_call_id": "call00002", "content": "concert"}],
                       {"tools": [WEATHER_TOOL, SEARCH_TOOL]}),
    "reasoning": ([USER1, {"role": "assistant", "content": "Paris.",
                           "reasoning_content": "The user asks about France. Its capital is Paris."}],
                  {}),
    "reasoning_history": ([USER1, {"role": "assistant", "content": "Paris.",
                                   "reasoning_content": "Easy: Paris."}, USER2], {}),
    "think_in_content": ([USER1, {"role": "assistant",
                                  "content": "<think>\nFrance -> Paris.\n</think>\n\nParis."}], {}),
    "enable_thinking_false": ([USER1], {"enable_thinking": False}),
    "enable_thinking_true": ([USER1], {"enable_thinking": True}),
    "date_string": ([SYSTEM, USER1], {"date_string": "01 Jan 2025"}),
    "tools_in_system": ([SYSTEM, USER1], {"tools": [WEATHER_TOOL], "tools_in_user_message": False}),
    "custom_tools": ([USER1], {"custom_tools": [SEARCH_TOOL]}),
    "empty_content": ([{"role": "user", "content": ""}], {}),
    # Error cases (most templates raise on these).
    "roles_not_alternating": ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], {}),
    "assistant_first": ([{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "b"}], {}),
    "unknown_role": ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], {}),
    "no_messages": ([], {}),
}


# ---- one small template per language feature ----

FEATURES = [
    # text, output, comments, whitespace control with trim_blocks / lstrip_blocks
    ("text_only", "Hello\n  world\n", {}),
    ("output_values", "{{ s }}|{{ i }}|{{ f }}|{{ b }}|{{ n }}|{{ l }}|{{ d }}|{{ u }}|",
     {"s": "x", "i": 3, "f": 2.5, "b": True, "n": None, "l": ["a", 1, None, False, 1.0],
      "d": {"k": "v", "n": [1, {"z": None}]}}),
    ("float_repr", "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 123456.789 }} {{ 1e15 }} "
                   "{{ 10 / 4 }} {{ 3 / 3 }} {{ -0.0001 }} {{ 2 ** -2 }} {{ 0.00001 }}", {}),
    ("repr_strings", "{{ ['it\\'s', 'say \"hi\"', 'back\\\\slash', 'tab\\tnl\\n', 'both \\'\"'] }}", {}),
    ("comments", "a{# comment #}b\n{# line\ncomment #}\nc {#- strip -#} d", {}),
    ("ws_minus", "a   {{- 'b' -}}   c\n  {%- if true -%}  d  {%- endif -%}  \n e", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nend\n", {}),
    ("lstrip_blocks", "  {% if true %}\n    x\n  {% endif %}\n\t{% for i in [1,2] %}\n  {{ i }}\n  {% endfor %}\n",
     {}),
    ("lstrip_not_var", "  {{ 'v' }}\n  {# c #}\nz", {}),
    ("plus_markers", "  {%+ if true +%}\nkeep\n  {%+ endif %}\n", {}),
    ("inline_tags", "a {% if true %}b{% endif %} c\n{% set x = 1 %} d {{ x }}\n", {}),
    ("trailing_newline", "line\n", {}),
    ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("raw", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}\n{%- raw -%}  x  {%- endraw %}", {}),
    # if / for / loop
    ("if_elif_else", "{% for x in [1, 2, 3, 0] %}{% if x == 1 %}one{% elif x == 2 %}two"
                     "{% elif x %}many{% else %}zero{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
                      "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}"
                      "[{{ loop.previtem }}|{{ loop.nextitem }}];{% endfor %}", {}),
    ("for_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|"
                 "{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x % 3 == 0 %}{{ x }}{{ loop.length }} {% endfor %}", {}),
    ("for_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"
                  "{% for k in d %}{{ k }}{% endfor %}{% for k, v in d|items %}{{ v }}{% endfor %}",
     {"d": {"b": 1, "a": 2}}),
    ("for_unpack_tuples", "{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("unpack_nested_targets", "{% for a, (b, c) in [(1, (2, 3)), [4, [5, 6]]] %}{{ a }}{{ b }}{{ c }};{% endfor %}"
                              "{% set (x, y) = [7, 8] %}{{ x }}{{ y }}{% set p, (q, r) = 1, 'ab' %}{{ p }}{{ q }}{{ r }}"
                              "{% for (z,) in [[9]] %}{{ z }}{% endfor %}{% for (w) in [[0]] %}{{ w }}{% endfor %}"
                              "{% for ((d, e), f) in [((1, 2), 3)] %}{{ d }}{{ e }}{{ f }}{% endfor %}", {}),
    ("error_unpack_nested", "{% for a, (b, c) in [(1, (2, 3, 4))] %}{% endfor %}", {}),
    ("nested_loops", "{% for i in [1, 2] %}{% for j in 'ab' %}{{ loop.index }}{{ j }}{% endfor %}"
                     "{{ loop.index }}|{% endfor %}", {}),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
                       "{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("loop_cycle", "{% for i in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 0 %}{% for i in [1, 2, 3] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}|{{ x }}",
     {}),
    ("undefined_iteration", "{% for x in missing %}{{ x }}{% else %}none{% endfor %}", {}),
    # set / namespace / macros
    ("set_and_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (1,) %}{{ t }}{{ (1, 'a') }}", {}),
    ("set_block", "{% set x %}  inner {{ 1 + 1 }}\n{% endset %}[{{ x }}]", {}),
    ("namespace", "{% set ns = namespace(n=0, items=[]) %}{% for i in range(4) %}"
                  "{% set ns.n = ns.n + i %}{% set ns.items = ns.items + [i] %}{% endfor %}"
                  "{{ ns.n }} {{ ns.items }} {{ ns.missing is defined }}", {}),
    ("namespace_empty", "{% set ns = namespace() %}{% set ns.x = 'y' %}{{ ns.x }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }} {{ greet() }}", {}),
    ("macro_recursion", "{% macro count(n) %}{% if n > 0 %}{{ n }}{{ count(n - 1) }}{% endif %}"
                        "{% endmacro %}{{ count(5) }}", {}),
    ("macro_sees_globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ top }}{% endmacro %}{{ m() }}",
     {"top": "T"}),
    ("macro_varargs_kwargs", "{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}"
                             "{{ m(1) }}|{{ m(1, 3, 4, 5, q=1, b=7) }}|{{ m(b=0, a=9) }}", {}),
    ("macro_closure", "{% macro outer(x) %}{% macro inner(y) %}{{ x }}{{ y }}{{ z }}{% endmacro %}"
                      "{{ inner(2) }}{% endmacro %}{% set z = 'Z' %}{{ outer(1) }}", {}),
    ("error_macro_extra_positional", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("error_macro_keyword_twice", "{% macro m(a, b=2) %}{{ a }}{% endmacro %}{{ m(1, a=7) }}", {}),
    ("filter_block", "{% filter upper %}a{% set x = 1 %}{{ x }}{% endfilter %}[{{ x }}]"
                     "{% filter replace('a', 'b') | trim %}  aaa {{ 'a' }}  {% endfilter %}", {}),
    ("loop_changed_depth", "{% for x in 'aab' %}{{ loop.changed(x) }}{{ loop.changed(x, 1) }}"
                           "{{ loop.depth }}{{ loop.depth0 }};{% endfor %}", {}),
    ("cycler_joiner", "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.current }}{{ c.next() }}"
                      "{{ c.next() }}{{ c.reset() }}{{ c.current }}|{% set j = joiner(' | ') %}"
                      "{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}|{% set k = joiner() %}{{ k() }}{{ k() }}",
     {}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
                   "{% call wrap('b') %}bold {{ 1 }}{% endcall %}", {}),
    ("generation_block", "{% for m in msgs %}{% generation %}[{{ m }}]{% endgeneration %}{% endfor %}",
     {"msgs": ["a", "b"]}),
    ("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}", {}),
    # expressions
    ("literals", "{{ true }}{{ True }}{{ false }}{{ none }}{{ None }}{{ 'a' 'b' }}{{ \"q\" }}{{ 1_000 }}"
                 "{{ [] }}{{ {} }}{{ [1, [2]] }}{{ {'a': 1, 2: 'b'} }}", {}),
    ("arithmetic", "{{ 7 + 2 }} {{ 7 - 9 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} "
                   "{{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + 2.5 }} "
                   "{{ 'ab' * 3 }} {{ [1] * 2 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 1 ~ 'x' ~ none }} "
                   "{{ -3 }} {{ -(2 + 1) }} {{ +4 }} {{ 2 + 3 * 4 ** 2 }} {{ True + 1 }}", {}),
    ("comparisons", "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' <= 'b' }} "
                    "{{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ 'ab' in 'cabd' }} "
                    "{{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ none == none }} "
                    "{{ missing == none }} {{ [1, 2] < [1, 3] }} {{ True == 1 }}", {}),
    ("and_or_not", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or [] }} {{ not 0 }} "
                   "{{ not 'a' }} {{ missing or 'default' }} {{ 1 and missing }}|"
                   "{{ not missing }} {{ (not true) == false }}", {}),
    ("conditional_expr", "{{ 'y' if x else 'n' }} {{ 'y' if not x else 'n' }} [{{ 'only' if false }}] "
                         "{{ 1 if false else 2 if true else 3 }}", {"x": True}),
    ("attr_numbers", "{{ m.0 }}|{{ m.0.1 }}|{{ m.0.1.1 }}|{{ m[0].1 }}|{{ 1.5 }}|{{ missing is callable }}",
     {"m": [[["a", "b"], ["c", "d"]]]}),
    ("attr_and_item", "{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d['b']['c'] }} {{ l[0] }} {{ l[-1] }} "
                      "{{ l.1 }} [{{ d.missing }}] [{{ l[10] }}] {{ d.missing is defined }} "
                      "{{ d.b is defined }} {{ s[1] }} {{ s[-1] }}",
     {"d": {"a": 1, "b": {"c": "C"}}, "l": [10, 20, 30], "s": "héllo"}),
    ("slices", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[1:-1] }} "
               "{{ l[5:] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[-3:] }} {{ l[3:0:-1] }} {{ (1, 2, 3)[1:] }}",
     {"l": [1, 2, 3, 4], "s": "añb€d🌍"}),
    ("string_escapes", "{{ 'a\\nb' }}|{{ \"tab\\there\" }}|{{ '\\u00e9\\x41' }}|{{ 'q\\'s' }}|{{ 'b\\\\s' }}", {}),
    # filters
    ("filter_trim_case", "[{{ '  a b \\n' | trim }}] {{ 'hello WORLD' | upper }} {{ 'HeLLo' | lower }} "
                         "{{ 'hello big-world (x) they\\'re' | title }} {{ 'hELLO wORLD' | capitalize }} "
                         "{{ 'xxaxx' | trim('x') }} {{ 'ÄÖü straße' | upper }} {{ 'ÉCOLE' | lower }}", {}),
    ("filter_length", "{{ 'héllo🌍' | length }} {{ [1, 2] | length }} {{ {'a': 1} | count }} "
                      "{{ missing | length }} {{ '' | length }}", {}),
    ("filter_default", "{{ missing | default('d') }} {{ missing | d('d2') }} {{ '' | default('e') }} "
                       "{{ '' | default('e', true) }} {{ none | default('n') }} {{ 0 | d(5, boolean=true) }}",
     {}),
    ("filter_join", "{{ [1, 'a', none] | join(', ') }} {{ 'abc' | join('-') }} "
                    "{{ users | join('/', attribute='name') }} {{ [] | join(',') }}",
     {"users": [{"name": "x"}, {"name": "y"}]}),
    ("filter_first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} "
                          "{{ 'abc' | last }} [{{ [] | first }}] {{ {'k': 1, 'j': 2} | first }}", {}),
    ("filter_list_string", "{{ 'ab' | list }} {{ {'a': 1} | list }} {{ 5 | string }} {{ [1] | string }}"
                           "{{ none | string }} {{ true | string }}", {}),
    ("filter_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} "
                       "{{ 'abc' | replace('', '-') }} {{ 'x.y.z' | replace('.', '') }}", {}),
    ("filter_numbers", "{{ '42' | int }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 4.7 | int }} "
                       "{{ '2.5' | float }} {{ 3 | float }} {{ -4 | abs }} {{ -2.5 | abs }} "
                       "{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} "
                       "{{ 2.9 | round(method='floor') }} {{ '0x1A' | int(0, 16) }} {{ true | int }}", {}),
    ("filter_reverse_unique", "{{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} "
                              "{{ ['a', 'A', 'b', 'a'] | unique | list }} "
                              "{{ ['a', 'A'] | unique(case_sensitive=true) | list }}", {}),
    ("filter_map_select", "{{ users | map(attribute='name') | list }} {{ ['a', 'b'] | map('upper') | list }} "
                          "{{ users | selectattr('admin') | map(attribute='name') | join }} "
                          "{{ users | rejectattr('admin') | map(attribute='name') | join }} "
                          "{{ users | selectattr('role', 'equalto', 'user') | list | length }} "
                          "{{ users | selectattr('role', 'eq', 'x') | list }} "
                          "{{ users | selectattr('missing', 'defined') | list }} "
                          "{{ users | selectattr('missing', 'undefined') | list | length }} "
                          "{{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3] | reject('odd') | list }} "
                          "{{ [0, 1, '', 'a'] | select | list }} {{ users | map(attribute='x', default='-') | list }}",
     {"users": [{"name": "ann", "admin": True, "role": "admin"},
                {"name": "bob", "admin": False, "role": "user"}]}),
    ("filter_tojson", "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(indent=4) }}\n"
                      "{{ [] | tojson(indent=2) }} {{ {} | tojson }} {{ 'é\"\\n\\t<>&' | tojson }} "
                      "{{ d | tojson(sort_keys=true) }} {{ d | tojson(separators=(',', ':')) }} "
                      "{{ d | tojson(ensure_ascii=true) }} {{ 1.0 | tojson }} {{ none | tojson }} "
                      "{{ {1: 'int key', true: 'b'} | tojson }} {{ (1, 2) | tojson }} {{ d | tojson(indent='\\t') }}",
     {"d": {"z": 1, "a": [1, 2.5, None, True, "ü🌍"], "n": {"x": {}, "y": []}}}),
    ("filter_items_dict", "{{ d | items | list }} {{ d.keys() | list }} {{ d.values() | list }} "
                          "{{ d.get('a') }} {{ d.get('q') }} {{ d.get('q', 7) }}",
     {"d": {"a": 1, "b": [2]}}),
    ("filter_dictsort", "{{ d | dictsort }} {{ d | dictsort(true) }} {{ d | dictsort(by='value') }} "
                        "{{ d | dictsort(false, 'value', true) }}{% for k, v in d | dictsort %}{{ k }}{% endfor %}",
     {"d": {"b": 1, "A": 3, "a": 2}}),
    ("filter_select_map_none", "{{ none | selectattr('a') | list }} {{ none | map('upper') | list }} "
                               "{{ none | rejectattr('type', 'equalto', 'x') | list | length }} "
                               "{{ '' | select | list }}", {}),
    ("unknown_filter_in_if", "{% if x is string %}{{ x | from_json }}{% endif %}"
                             "{{ (1 | nosuch) if false else 'ok' }}{% if false %}{{ 1 is nosuchtest }}{% endif %}",
     {"x": 1}),
    ("generators", "{{ 'y' if [] | select else 'n' }} {{ 'y' if [] | map('upper') else 'n' }} "
                   "{{ [3, 1] | select | sort }} {{ [1, 2] | select | join(',') }} {{ [1, 2] | select | sum }} "
                   "{{ 1 in [1] | select }} {{ [1] | select is iterable }} {{ [1] | select is sequence }} "
                   "[{{ ([1] | map('string'))[0] }}] {{ [1, 2] | select | first }} {{ [1, 2] | select | reverse | list }} "
                   "{{ [1, 2] | reverse | list }} {{ (1, 2) | reverse | list }} {{ d | items | list }} "
                   "{{ [1, 1, 2] | unique | list }} {{ [1] | select | list | length }} "
                   "{% for x in [1, 2] | select %}{{ loop.length }}{% endfor %}", {"d": {"a": 1}}),
    ("error_generator_length", "{{ [1, 2] | select | length }}", {}),
    ("error_generator_tojson", "{{ tools | map(attribute='function') | tojson }}",
     {"tools": [{"function": {"name": "f"}}]}),
    ("error_reversed_tojson", "{{ [1] | reverse | tojson }}", {}),
    ("error_generator_last", "{{ [1] | select | last }}", {}),
    ("error_generator_plus", "{{ [1] | select + [2] }}", {}),
    ("filter_batch_slice", "{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3, 4, 5] | batch(2, 'x') | list }} "
                           "{{ [1, 2] | batch(0) | list }} {{ [1, 2, 3, 4, 5] | slice(2) | list }} "
                           "{{ [1, 2, 3, 4, 5] | slice(3, 0) | list }} {{ [] | slice(2) | list }} "
                           "{% for row in 'abcde' | batch(3, '-') %}{{ row | join }};{% endfor %}", {}),
    ("filter_text_misc", "[{{ 'ab' | center(7) }}] [{{ 'ab' | center }}] {{ 'a b  c_d, é1' | wordcount }} "
                         "{{ 'hello world foo' | truncate(9) }}|{{ 'hello world foo' | truncate(9, true, '..') }}|"
                         "{{ 'abc' | truncate(10) }}|{{ 'hello world foo bar' | truncate(12, leeway=0) }}|"
                         "{{ 'helloworldfoo' | truncate(8) }}|{{ '<b>a</b>  <i>b</i>\n c <!-- x -->d' | striptags }}|"
                         "{{ '<p>x &amp; y &lt;z&gt;</p>' | striptags }}", {}),
    ("filter_groupby", "{% for g in users | groupby('role') %}{{ g.grouper }}:{{ g.list | map(attribute='n') | join(',') }};"
                       "{% endfor %}|{% for k, items in users | groupby('role', case_sensitive=true) %}{{ k }}{{ items | length }}"
                       "{% endfor %}|{{ users | groupby('x', default='d') | map(attribute='grouper') | list }}|"
                       "{{ [{'a': 1}, {'a': 1}] | groupby('a') }}",
     {"users": [{"n": "a", "role": "Admin"}, {"n": "b", "role": "user"}, {"n": "c", "role": "admin"}]}),
    ("filter_striptags_edges", "[{{ '<a <!-- x --> b>c' | striptags }}] [{{ '<<<a' | striptags }}] "
                               "[{{ 'a<!-- b' | striptags }}] [{{ 'x <!-- y -->> z' | striptags }}] "
                               "{{ ('%.300f' % 1e300) | length }} {{ 'abc' | truncate(3, leeway=0) }}", {}),
    ("error_truncate_short", "{{ 'abcdef' | truncate(2) }}", {}),
    ("sort_equal_keys", "{{ [none, none] | sort }} {{ [a, b] | sort }} {{ [x, 1] | first }} {{ [missing] }} "
                        "{{ [{'k': none}, {'k': none}] | sort(attribute='k') | length }}", {"x": None}),
    ("error_sort_unorderable", "{{ [none, 1] | sort }}", {}),
    ("error_generator_slice", "{{ (d | items)[1:] }}", {"d": {"a": 1, "b": 2}}),
    ("error_str_replace_keyword", "{{ 'abc'.replace('a', 'x', count=1) }}", {}),
    ("map_attribute_default_path", "{{ ms | map(attribute='t.0.n', default='none') | list }} "
                                   "{{ ms | map(attribute='a', default=none) | list }} "
                                   "{{ ms | groupby('t.0.n', default='z') | map(attribute='grouper') | list }}",
     {"ms": [{"a": 1}, {"t": [{"n": "N"}]}]}),
    ("error_map_attribute_path", "{{ ms | map(attribute='t.0.n') | list }}", {"ms": [{"a": 1}]}),
    ("splitlines_unicode", "{{ 'a\u2028b\x0bc\x1cd\u0085e\r\nf'.splitlines() }} {{ 'a\u2029b'.splitlines(true) | map('length') | list }} "
                           "{{ 'x\u2028y' | indent(2) }}|{{ '' | indent(2, true) }}|{{ '' is lower }}{{ 'a1' is lower }}"
                           "{{ 'A1' is upper }}{{ '1' is upper }}", {}),
    ("filter_indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|"
                      "{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ 'x\\ny' | indent('> ') }}", {}),
    ("filter_sort_minmax", "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1] | sort(reverse=true) }} "
                           "{{ users | sort(attribute='age') | map(attribute='n') | join }} "
                           "{{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ [1, 2, 3] | sum }} "
                           "{{ users | sum(attribute='age') }}",
     {"users": [{"n": "a", "age": 30}, {"n": "b", "age": 20}]}),
    ("filter_chain_precedence", "{{ -1 | abs }} {{ 'a' ~ 'b' | upper }} {{ [1, 2] | length + 1 }} "
                                "{{ 'x' if 'abc' | length > 2 else 'y' }} {{ ('a' ~ 'b') | upper }}", {}),
    # tests
    ("tests_types", "{% for v in [none, true, 1, 1.5, 'a', [1], {'a': 1}] %}"
                    "{{ v is none }}{{ v is boolean }}{{ v is number }}{{ v is integer }}{{ v is float }}"
                    "{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}"
                    "{{ v is true }}{{ v is false }};{% endfor %}"
                    "{{ missing is defined }}{{ missing is undefined }}{{ missing is iterable }}"
                    "{{ missing is none }}{{ x is not none }}", {"x": 1}),
    ("tests_values", "{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}"
                     "{{ 2 is in [1, 2] }}{{ 'a' is equalto 'a' }}{{ 1 is eq 2 }}{{ 'ab' is lower }}"
                     "{{ 'AB' is upper }}{{ 3 is gt 2 }}{{ 3 is lt 2 }}{{ 3 is ge 3 }}{{ range is callable }}"
                     "{{ 1 is sameas 1 }}{{ 'x' is not string }}", {}),
    # str / list methods
    ("str_methods", "{{ s.startswith('He') }} {{ s.endswith('!') }} {{ s.startswith(('x', 'H')) }} "
                    "[{{ '  a  '.strip() }}] [{{ '  a  '.lstrip() }}] [{{ '  a  '.rstrip() }}] "
                    "{{ 'xxhixx'.strip('x') }} {{ '\\n\\nhi\\n'.lstrip('\\n') }} {{ s.upper() }} "
                    "{{ s.lower() }} {{ 'hello world'.title() }} {{ \"they're\".title() }} "
                    "{{ 'abc'.capitalize() }} {{ s.find('l') }} {{ s.find('z') }} {{ 'héllo'.find('l') }} "
                    "{{ s.count('l') }} {{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} "
                    "{{ '-'.join(['a', 'b']) }} {{ '{} and {}'.format('x', 1) }} {{ '{0}{name}'.format('p', name='q') }} "
                    "{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'ab'.islower() }} "
                    "{{ 'AB'.isupper() }} {{ s.rfind('l') }}", {"s": "Hello!"}),
    ("str_split", "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} "
                  "{{ 'a,b,c'.rsplit(',', 1) }} {{ '  x  y '.split() }} {{ 'a<s>b<s>c'.split('<s>')[-1] }} "
                  "{{ 'x'.split(',') }} {{ ''.split(',') }} {{ ''.split() }} {{ ' a b c '.split(none, 1) }} "
                  "{{ ' a b c '.rsplit(none, 1) }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }}", {}),
    ("percent_format", "{{ '%s-%d-%05.2f-%x-%r' % ('a', 3, 2.5, 255, 'q') }}|{{ '%s' % 1 }}|{{ '%s' % [1, 2] }}|"
                       "{{ '%(a)s!%(b)5.1f' % {'a': 1, 'b': 2} }}|{{ '100%%' % () }}|{{ '%-5s|%5s|%.2s' % ('a', 'é', 'abc') }}|"
                       "{{ '%+d % d %#x %#o %X %e %G %g %c%c' % (5, 5, 255, 8, 255, 12345.678, 0.00001, 1e20, 65, 'é') }}|"
                       "{{ '%*d|%-*d|%.*f' % (5, 1, 4, 2, 2, 3.14159) }}|{{ '%d %d %a' % (3.9, true, 'é') }}|"
                       "{{ 'no fields' % {'a': 1} }}|{{ '%.0f %.0f' % (0.5, 1.5) }}", {}),
    ("markup_safe_escape", "{{ 'a<'|safe + '<b>\"' }}|{{ '<x>' + \"y&'\"|safe }}|{{ ('a'|safe + 'b') ~ '<' }}|"
                           "{{ '<q>'|safe * 2 }}|{{ '<'|e }}|{{ '<'|escape|e }}|{{ ('<'|e + '<')|length }}|"
                           "{{ ('%s'|safe) % '<' }}|{{ ('%d<'|safe) % 5 }}|{{ '<'|forceescape|forceescape }}|"
                           "{{ 5|safe is string }}{{ 'a'|safe is escaped }}{{ 'a' is escaped }}|"
                           "{{ \"Use '\"|safe + t.name + \"'\\n\"|safe + t|tojson }}",
     {"t": {"name": "f<x>", "d": "say \"hi\""}}),
    ("filter_format", "{{ '%s and %s' | format('a', 'b') }}|{{ '%(x)s' | format(x=1) }}|{{ 'plain' | format }}", {}),
    ("error_percent_not_enough", "{{ '%s %s' % ('a',) }}", {}),
    ("error_percent_too_many", "{{ '%s' % ('a', 'b') }}", {}),
    ("error_percent_type", "{{ '%d' % 'x' }}", {}),
    ("list_methods", "{{ l.index(2) }} {{ l.count(1) }} {{ l | length }} {{ l.copy() }} {{ (1, 2).copy is defined }}",
     {"l": [1, 2, 1]}),
    ("str_methods_more", "{{ 'a-b-c'.partition('-') }} {{ 'a-b-c'.rpartition('-') }} {{ 'abc'.partition('x') }} "
                         "{{ 'abc'.rpartition('x') }} [{{ 'ab'.center(7) }}] [{{ 'ab'.center(6, '*') }}] "
                         "[{{ 'abc'.center(6) }}] [{{ 'ab'.ljust(4, '.') }}] [{{ 'é'.rjust(3) }}] {{ '5'.zfill(3) }} "
                         "{{ '-5'.zfill(4) }} {{ 'aBc Ü'.swapcase() }} {{ 'abc'.removeprefix('a') }} "
                         "{{ 'abc'.removesuffix('c') }} {{ 'abc'.removeprefix('x') }} {{ '½3'.isnumeric() }} "
                         "{{ '12'.isdecimal() }} {{ 'Ab Cd'.istitle() }} {{ 'AB'.istitle() }} {{ 'ab'.istitle() }} "
                         "{{ 'abc'.startswith('b', 1) }} {{ 'abc'.startswith('a', 1) }} {{ 'abc'.endswith('b', 0, 2) }} "
                         "{{ 'abc'.startswith('', 5) }} {{ 'héllo'.startswith('l', -3) }}", {}),
    ("filter_round_attr", "{{ 2 | round }} {{ 25 | round(-1) }} {{ 15 | round(-1) }} {{ -15 | round(-1) }} "
                          "{{ 2 | round(1, 'ceil') }} {{ true | round }} {{ 1234.5678 | round(-2) }} "
                          "[{{ d | attr('a') }}] {{ d | attr('items') is callable }} "
                          "{{ 'abc' | attr('upper') is callable }}",
     {"d": {"a": 1}}),
    ("list_methods_ns", "{% set ns = namespace(x=3) %}{{ ns | attr('x') }}", {}),
    # globals
    ("globals", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} "
                "{{ dict(a=1, b='x') }} {{ strftime_now('%Y-%m-%d %H:%M:%S %d %b %Y %B %A') }} "
                "{{ namespace(a=1).a }}", {}),
    ("non_ascii_text", "Grüße {{ name }} — {{ name | length }} {{ name[::-1] }} {{ name | upper }}",
     {"name": "Zoë 🌍 日本"}),
    # errors: raise_exception, type errors, undefined access, syntax errors
    ("raise_exception", "a{{ raise_exception('Bad role: ' ~ role) }}b", {"role": "robot"}),
    ("raise_in_loop", "{% for m in ms %}{% if m == 2 %}{{ raise_exception('two!') }}{% endif %}{{ m }}"
                      "{% endfor %}", {"ms": [1, 2, 3]}),
    ("error_undefined_attr", "{{ missing.attr }}", {}),
    ("error_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("error_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("error_not_iterable", "{% for x in 5 %}{% endfor %}", {}),
    ("error_division_zero", "{{ 1 / 0 }}", {}),
    ("error_unknown_filter", "{{ 1 | nosuchfilter }}", {}),
    ("error_unknown_test", "{% if 1 is nosuchtest %}{% endif %}", {}),
    ("error_unknown_filter_taken_if", "{% if true %}{{ 1 | nosuch }}{% endif %}", {}),
    ("syntax_unknown_filter_loop_in_if", "{% if false %}\n{% for a in [1] %}{{ a | nosuch }}{% endfor %}{% endif %}",
     {}),
    ("syntax_unknown_test_in_set", "{% set x = 1 is nosuchtest %}", {}),
    ("error_set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}),
    ("error_range_too_big", "{{ range(1000000) | length }}", {}),
    ("error_unsafe_method", "{{ l.append(1) }}", {"l": [1]}),
    ("unsafe_method_undefined", "{{ l.append is defined }}{{ d.update is defined }}[{{ l.append }}]"
                                "{{ l.append ~ 'a' }}", {"l": [1], "d": {}}),
    ("error_unsafe_method_attr", "{% set x = d.update %}{{ x.a }}", {"d": {}}),
    ("syntax_unclosed_if", "line 1\n{% if true %}\nno end", {}),
    ("syntax_unknown_tag", "a\nb\n{% frobnicate %}", {}),
    ("syntax_bad_expr", "x\n{{ 1 + }}", {}),
    ("syntax_unclosed_var", "{{ 'a' ", {}),
    ("syntax_endfor_mismatch", "{% if true %}\n{% endfor %}", {}),
    ("syntax_unterminated_string", "{{ 'abc }}", {}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "chat_templates"))
    args = ap.parse_args()
    env = make_env()
    cases = []
    for stem, (bos, eos) in TEMPLATES.items():
        with open(os.path.join(args.out, stem + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        for conv_name, (messages, extra) in CONVERSATIONS.items():
            for agp in (True, False):
                variables = {"messages": messages, "tools": extra.get("tools"),
                             "documents": extra.get("documents"), "add_generation_prompt": agp,
                             "bos_token": bos, "eos_token": eos}
                variables.update(extra)
                case = {"name": f"{stem}/{conv_name}/{'gen' if agp else 'nogen'}",
                        "template": stem + ".jinja", "bos_token": bos, "eos_token": eos,
                        "messages": messages, "add_generation_prompt": agp, "extra": extra}
                case.update(render_case(env, source, variables))
                cases.append(case)
    for name, source, variables in FEATURES:
        case = {"name": "feature/" + name, "source": source, "variables": variables}
        case.update(render_case(env, source, variables))
        cases.append(case)
    out = {
        "generator": "tools/goldens/make_chat_template_goldens.py",
        "jinja2_version": jinja2.__version__,
        "python_version": sys.version.split()[0],
        "now": NOW.isoformat(),
        "cases": cases,
    }
    path = os.path.join(args.out, "goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {path}: {len(cases)} cases ({n_err} expected errors)")


if __name__ == "__main__":
    main()
