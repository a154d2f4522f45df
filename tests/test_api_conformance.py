"""Responses validated against the official schemas (tests/api_schemas.py: OpenAI OpenAPI spec
2.3.0, @anthropic-ai/sdk types), on the tiny model of every family, plus what a schema cannot
say: logprob bytes are the tokens' own bytes, text_offset counts characters, streamed logprobs
ride with the content they score, Anthropic's start and end usage agree, every reply carries
its request id (issue 13 §4)."""
import json
import os
import subprocess

import pytest

import api_schemas as S
from conftest import ROOT
from test_http_robustness import Server, open_stream, stream_lines, wait_until

ANTHROPIC = {"anthropic-version": "2023-06-01"}
ASK = [{"role": "user", "content": "Tell me something."}]


@pytest.fixture
def srv(family_model, tmp_path):
    # every request here asks for at most 12 tokens, except Anthropic thinking, whose max_tokens must
    # exceed budget_tokens (>= 1024): the cap keeps that reply as short as the others
    s = Server(family_model.model, str(tmp_path), args=("--max-tokens", "12"))
    yield s
    s.stop()


def valid(value, schema):
    errs = S.check(value, schema)
    assert not errs, "\n".join(errs) + "\n" + json.dumps(value)[:2000]


def events(port, path, body):
    sock, r = open_stream(port, path, body)
    out = [(line, json.loads(line[6:])) for line in stream_lines(r) if line.startswith("data: {")]
    sock.close()
    return [e for _, e in out]


def test_openai_chat_and_completions_match_the_spec(srv, family_model):
    body = {"messages": ASK, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    st, h, r = srv.json("POST", "/v1/chat/completions", body)
    assert st == 200
    valid(r, S.CHAT_COMPLETION)
    entries = r["choices"][0]["logprobs"]["content"]
    raw = b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace")
    for a in sorted(family_model.token, key=len, reverse=True):
        raw = raw.replace(a, "")          # chat content never shows an added token's text
    assert raw == r["choices"][0]["message"]["content"], "bytes are the tokens' own"

    chunks = events(srv.port, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    for c in chunks:
        valid(c, S.CHAT_CHUNK)
    streamed = [e for c in chunks for ch in c["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
    assert streamed == entries
    alone = [c for c in chunks for ch in c["choices"] if ch.get("logprobs") and not ch["delta"].get("content")]
    assert len(alone) <= 1, f"logprobs must ride with the content they score, {len(alone)} chunks carry them alone"
    assert chunks[-1]["usage"]["completion_tokens"] == r["usage"]["completion_tokens"]

    cbody = {"prompt": "Once upon", "max_tokens": 12, "temperature": 0, "logprobs": 2}
    st, _, c = srv.json("POST", "/v1/completions", cbody)
    assert st == 200
    valid(c, S.COMPLETION)
    lp = c["choices"][0]["logprobs"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))], "characters"
    cchunks = events(srv.port, "/v1/completions", {**cbody, "stream": True, "stream_options": {"include_usage": True}})
    for ch in cchunks[:-1]:
        valid(ch, S.COMPLETION_CHUNK)
        assert "usage" not in ch, f"an intermediate completions chunk has usage: {ch}"
    assert cchunks[-1]["usage"]["completion_tokens"] == c["usage"]["completion_tokens"]

    st, _, m = srv.json("GET", "/v1/models")
    valid(m, S.MODEL_LIST)
    st, _, err = srv.json("POST", "/v1/chat/completions", {"messages": ASK, "temperature": 9})
    assert st == 400
    valid(err, S.OPENAI_ERROR)


def anthropic_blocks(evs):
    return [e["content_block"]["type"] for e in evs if e["type"] == "content_block_start"]


def cue(family_model, tmp_path, thinking):
    """The generation cue the template ends ASK with: the prompt from its last assistant marker."""
    path = tmp_path / f"cue-{int(thinking)}.json"
    path.write_text(json.dumps([{"messages": ASK, "thinking": thinking}]))
    out = subprocess.run([os.path.join(ROOT, "build", "tests", "tool_chat_encode"), family_model.model, str(path)],
                         capture_output=True, text=True, check=True)
    text = json.loads(out.stdout)[0]["text"]
    return text[text.rindex(family_model.desc["turns"]["assistant"]):]


@pytest.mark.parametrize("thinking", [False, True])
def test_anthropic_messages_match_the_sdk_types(srv, family_model, tmp_path, thinking):
    body = {"messages": ASK, "max_tokens": 10, "temperature": 0}
    if thinking:
        body.update(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=1025)
    st, h, r = srv.json("POST", "/v1/messages", body, ANTHROPIC)
    assert st == 200
    valid(r, S.A_MESSAGE)
    for b in r["content"]:
        valid(b, S.A_BLOCKS[b["type"]])
    evs = events(srv.port, "/v1/messages", {**body, "stream": True})
    for e in evs:
        valid(e, S.A_EVENTS[e["type"]])
        if e["type"] == "content_block_start":
            valid(e["content_block"], S.A_BLOCKS[e["content_block"]["type"]])
    assert anthropic_blocks(evs) == [b["type"] for b in r["content"]], "stream and reply have the same blocks"
    if not thinking:
        assert "thinking" not in anthropic_blocks(evs)
    elif cue(family_model, tmp_path, True) != cue(family_model, tmp_path, False):
        # the thinking cue opens the reasoning, so the reply starts with a thinking block
        assert "thinking" in anthropic_blocks(evs)
    # else the cue is the chat cue (the model opens a thinking block itself, which a random one rarely does)
    start = next(e for e in evs if e["type"] == "message_start")["message"]["usage"]
    end = next(e for e in evs if e["type"] == "message_delta")["usage"]
    for k in ("input_tokens", "cache_read_input_tokens"):
        assert start[k] == end[k], (k, start, end)
    assert end["output_tokens"] == r["usage"]["output_tokens"]


def test_count_tokens_models_and_request_ids(srv):
    body = {"messages": ASK, "max_tokens": 4, "system": "Be brief."}
    st, h, n = srv.json("POST", "/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"},
                        ANTHROPIC)
    assert st == 200, n
    valid(n, S.A_COUNT)
    st, _, r = srv.json("POST", "/v1/messages", body, ANTHROPIC)
    assert n["input_tokens"] == r["usage"]["input_tokens"] + r["usage"]["cache_read_input_tokens"]

    st, _, m = srv.json("GET", "/v1/models", None, ANTHROPIC)
    valid(m, S.A_MODEL_LIST)
    st, _, one = srv.json("GET", "/v1/models/" + m["data"][0]["id"], None, ANTHROPIC)
    valid(one, S.A_MODEL)

    ids = set()
    for method, path, b, hdr in [("POST", "/v1/chat/completions", {"messages": ASK, "max_tokens": 2}, {}),
                                 ("POST", "/v1/messages", {"messages": ASK}, ANTHROPIC),
                                 ("GET", "/v1/nowhere", None, {})]:
        st, h, r = srv.json(method, path, b, hdr)
        h = {k.lower(): v for k, v in h.items()}
        assert h.get("x-request-id", "").startswith("req_") and h["request-id"] == h["x-request-id"], h
        ids.add(h["x-request-id"])
        if path == "/v1/messages":
            assert st == 400
            valid(r, S.A_ERROR)
            assert r["request_id"] == h["request-id"]
    assert len(ids) == 3, "every request gets its own id"
    # The log line is written once the reply went out, so it may trail the client's read a little.
    wait_until(lambda: all(f"id={i}" in srv.logtext() for i in ids), what="a log line per request id")
