"""Which constraint each request field becomes, seen where the gateway hands it over: the GBNF in
the SUBMIT extension payload (after the untrusted-span table), recorded by tests/fake_engine.py,
on the template of every family. The real engine and the official clients are exercised in
tests/node/structured.test.mjs and tests/test_grammar_engine.py."""
import re

import pytest

from test_http_robustness import Server

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "maxLength": 8}}, "required": ["q"]}}}]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture
def server(family_model, tmp_path):
    s = Server(family_model.model, str(tmp_path), fake=True, env={"FAKE_REPLY": "{}"})
    yield s
    s.stop()


def submitted(server, path, body):
    """(status, reply, the grammar the engine received or None when the request never reached it)"""
    before = len([f for f in server.fake_frames() if f["cmd"] == "SUBMIT"])
    st, _, reply = server.json("POST", path, {"max_tokens": 8, **body})
    subs = [f for f in server.fake_frames() if f["cmd"] == "SUBMIT"]
    if len(subs) == before:
        return st, reply, None
    f = subs[-1]
    keys = dict(k.split("=", 1) for k in f["header"] if "=" in k)
    ext = int(f["header"][7]) if len(f["header"]) > 7 and "=" not in f["header"][7] else 0
    assert ext == int(keys.get("untrusted", 0)) + len(f["grammar"].encode()), "field 7 counts spans + grammar"
    return st, reply, f["grammar"]


def chat(server, **body):
    return submitted(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **body})


def test_each_field_becomes_its_grammar(server):
    st, _, g = chat(server)
    assert st == 200 and g == ""
    st, _, g = chat(server, grammar='root ::= "x"+')
    assert st == 200 and g == 'root ::= "x"+'
    st, _, g = chat(server, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}})
    assert st == 200 and g.startswith("answer") and "root ::= answer" in g and '"\\"n\\""' in g
    st, _, g = chat(server, response_format={"type": "json_object"})
    assert st == 200 and "root ::= answer" in g
    st, reply, g = chat(server, response_format={"type": "json_object"}, thinking=True)
    assert st == 200 and re.search(r"root ::= [^\n]*\breasoning\b[^\n]* answer\n", g), "thinking: reasoning, then JSON"
    st, _, g = chat(server, response_format={"type": "text"})
    assert st == 200 and g == ""
    st, _, g = submitted(server, "/v1/completions", {"prompt": "x", "grammar": 'root ::= "y"'})
    assert st == 200 and g == 'root ::= "y"'


def test_tool_choice_decides_whether_calls_are_constrained(server):
    st, _, g = chat(server, tools=TOOLS)
    assert st == 200 and g == "", "auto with parallel calls allowed leaves the reply free"
    st, _, g = chat(server, tools=TOOLS, tool_choice="required")
    assert st == 200 and g.startswith("root ::= calls") and '"lookup"' in g and "calls-more" in g
    st, _, g = chat(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert st == 200 and "calls-more" not in g
    st, _, g = chat(server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "lookup"}})
    assert st == 200 and '"lookup"' in g
    st, _, g = chat(server, tools=TOOLS, parallel_tool_calls=False)
    assert st == 200 and re.match(r"root ::= .*\btext\b.*\bcalls\)", g) and "calls-more" not in g, \
        "auto, one call at most: free text, then maybe a call"
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    st, _, g = chat(server, tools=strict)
    assert st == 200 and re.match(r"root ::= .*\btext\b.*\bcalls\)", g) and "calls-more" in g, \
        "a strict function constrains auto calls"
    st, _, g = chat(server, tools=TOOLS, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}})
    assert st == 200 and re.search(r"^root ::= \(.*\banswer\b.* \| calls\)$", g, re.M), "auto + response_format: the schema's JSON or calls"
    st, _, g = chat(server, tools=TOOLS, tool_choice="none", response_format={"type": "json_object"})
    assert st == 200 and "root ::= answer" in g and "call" not in g
    st, _, g = chat(server, tools=TOOLS, tool_choice="required", thinking=True)
    assert st == 200 and re.match(r"root ::= [^\n]*\breasoning\b[^\n]* calls\n", g)


def test_anthropic_tool_choice(server):
    tools = [{"name": "lookup", "input_schema": TOOLS[0]["function"]["parameters"]}]
    msgs = [{"role": "user", "content": "hi"}]
    st, _, g = submitted(server, "/v1/messages", {"messages": msgs, "tools": tools, "tool_choice": {"type": "any"}})
    assert st == 200 and "calls-more" in g and '"lookup"' in g
    st, _, g = submitted(server, "/v1/messages", {"messages": msgs, "tools": tools,
                                                 "tool_choice": {"type": "tool", "name": "lookup", "disable_parallel_tool_use": True}})
    assert st == 200 and '"lookup"' in g and "calls-more" not in g
    st, _, g = submitted(server, "/v1/messages", {"messages": msgs, "tools": tools, "tool_choice": {"type": "auto"}})
    assert st == 200 and g == ""
    st, _, g = submitted(server, "/v1/messages", {"messages": msgs, "grammar": 'root ::= "z"'})
    assert st == 200 and g == 'root ::= "z"'


def test_conflicts_and_bad_fields_never_reach_the_engine(server):
    cases = [
        (dict(grammar='root ::= "a"', response_format={"type": "json_object"}), "response_format"),
        (dict(grammar='root ::= "a"', tools=TOOLS, tool_choice="required"), "grammar"),
        (dict(grammar=""), "grammar"),
        (dict(grammar=7), "grammar"),
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "not": {}}}}),
         "response_format"),
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "s", "strict": "yes", "schema": {}}}), "response_format"),
        (dict(response_format="json"), "response_format"),
        (dict(tools=TOOLS, parallel_tool_calls="no"), "parallel_tool_calls"),
    ]
    for body, param in cases:
        st, reply, g = chat(server, **body)
        assert st == 400 and g is None, (body, st, reply)
        assert reply["error"]["param"] == param, (body, reply)


def test_response_format_reaches_the_template(server, family_model):
    """response_format is handed to the template as well as to the grammar: Kimi K3's encoder
    writes it as a one-time system option before the generation cue (encoding_k3.py's
    response-format message); the other families' templates have no such rendering, so their
    prompt is the same with or without it."""
    def prompt(**rf):
        st, _, _ = chat(server, **rf)
        assert st == 200
        return [f for f in server.fake_frames() if f["cmd"] == "SUBMIT"][-1]["prompt"]
    plain = prompt()
    obj = prompt(response_format={"type": "json_object"})
    sch = prompt(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}})
    if family_model.name != "kimi_k3":
        assert obj == plain and sch == plain
        return
    assert "response_format" not in plain
    assert 'type="response-format"' in obj and "The system is invoked with `response_format=json_object`." in obj
    assert obj.index("hi") < obj.index("response-format") < obj.rindex('role="assistant"')
    assert '```json\n{"properties":{"n":{"type":"integer"}},"required":["n"],"type":"object"}\n```' in sch
