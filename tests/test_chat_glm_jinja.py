"""Our GLM chat template (src/models/chat_glm.c) against the official GLM-4.7/GLM-5 chat_template.jinja
rendered by @huggingface/jinja (the evaluator transformers.js uses, with trim_blocks/lstrip_blocks
like transformers). The template text below is the public one the GLM-5 tokenizer_config ships."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_DIR = os.path.join(ROOT, "tests", "node")
RENDER = os.path.join(ROOT, "build", "tests", "test_chat_glm")

OFFICIAL_TEMPLATE = r'''[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>{{ visible_text(m.content) }}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if ((clear_thinking is defined and not clear_thinking) or loop.index0 > ns.last_user_index) and reasoning_content -%}
{{ '<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '</think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{- '<tool_call>' + tc.name -}}
{% set _args = tc.arguments %}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>{% endfor %}</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '<tool_response>' }}
{{- m.content }}
{{- '</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}
<tool_response>{{ tr.output if tr.output is defined else tr }}</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}
{%- endif -%}
'''

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city; units \"C\" or \"F\".",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                   "units": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city"]}}}
CALC = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}

CASES = [
    {"messages": [{"role": "user", "content": "Hello"}], "thinking": True},
    {"messages": [{"role": "user", "content": "Hello"}], "thinking": False},
    {"messages": [{"role": "system", "content": "You are terse.\nAnswer in French."},
                  {"role": "user", "content": "Ça va?"}], "thinking": True},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one, "},
                                               {"type": "text", "text": "part two"}]}], "thinking": False},
    {"messages": [{"role": "user", "content": "q1"},
                  {"role": "assistant", "content": "  a1\n", "reasoning_content": "because"},
                  {"role": "user", "content": "q2"},
                  {"role": "assistant", "content": "<think>\nstep\n</think>\n\nfinal"},
                  {"role": "user", "content": "q3"}], "thinking": True},
    {"messages": [{"role": "user", "content": "q"},
                  {"role": "assistant", "content": "\n\nkept reasoning</think>answer", }], "thinking": True},
    {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Weather in Paris and 2+3?"},
                  {"role": "assistant", "content": "", "reasoning_content": "need tools",
                   "tool_calls": [{"id": "c1", "type": "function", "function": {
                       "name": "get_weather", "arguments": {"city": "Paris", "days": 2, "units": "C"}}},
                                  {"id": "c2", "type": "function", "function": {
                                      "name": "add", "arguments": {"a": 2, "b": 3.5}}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
                  {"role": "tool", "tool_call_id": "c2", "content": "5.5"}],
     "tools": [WEATHER, CALC], "thinking": True},
    {"messages": [{"role": "user", "content": "list"},
                  {"role": "assistant", "content": "Sure.", "tool_calls": [{"function": {
                      "name": "add", "arguments": {"a": [1, 2], "b": {"x": None, "y": True}}}}]},
                  {"role": "tool", "content": "ok"}, {"role": "user", "content": "thanks"}],
     "tools": [CALC], "thinking": False},
]

NODE_SCRIPT = r'''
import { Template } from "@huggingface/jinja";
import { readFileSync } from "fs";
const [tplPath, casesPath] = process.argv.slice(1);
const tpl = new Template(readFileSync(tplPath, "utf8"));
const cases = JSON.parse(readFileSync(casesPath, "utf8"));
const out = cases.map(c => tpl.render({messages: c.messages, tools: c.tools, add_generation_prompt: true,
                                        enable_thinking: c.thinking}));
process.stdout.write(JSON.stringify(out));
'''


def test_rendering_matches_official_template(tmp_path):
    assert os.path.exists(RENDER), "build/tests/test_chat_glm missing: run make"
    tpl, cases = tmp_path / "chat_template.jinja", tmp_path / "cases.json"
    tpl.write_text(OFFICIAL_TEMPLATE)
    cases.write_text(json.dumps(CASES))
    ref = subprocess.run(["node", "--input-type=module", "-e", NODE_SCRIPT, str(tpl), str(cases)], cwd=NODE_DIR,
                         capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    expected = json.loads(ref.stdout)
    ours = subprocess.run([RENDER, "--render", str(cases)], capture_output=True, text=True)
    assert ours.returncode == 0, ours.stderr
    got = json.loads(ours.stdout)
    assert len(got) == len(CASES)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"case {i}:\n ours: {g!r}\n jinja: {e!r}"
