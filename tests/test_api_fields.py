"""Sampling fields clients send are honoured or refused with a 400, never ignored (issue 13 §3).

The engine applies logit bias and the repetition / presence / frequency penalties to a copy of
the logits (src/core/sampler.h); these tests drive it over the line protocol with tokids=1, so
the sampled ids are read back exactly, and check the gateway turns every API field into the
frame field that carries it (on the scripted engine, which logs what it receives) or a 400."""
import json

import pytest

from engine_client import Engine
from test_http_robustness import Server



def pair(family_model):
    """Two ordinary ids, those of the pieces "a" and "b"."""
    vocab = json.load(open(f"{family_model.model}/tokenizer.json"))["model"]["vocab"]
    return vocab["a"], vocab["b"]


def run(engine, rid, ids, extra, bias=None, max_tokens=12):
    if bias:
        payload = " ".join(f"{k}:{v}" for k, v in bias.items()).encode()
        engine.send(f"BIAS {rid} {len(payload)}\n".encode() + payload + b"\n")
    engine.submit(rid, ids=ids, max_tokens=max_tokens, logprobs=0, extra=" tokids=1" + extra)
    rep = engine.collect(rid)
    assert rep.error is None, rep.error
    assert len(rep.toks) == rep.completion, (rep.toks, rep.done)
    return rep.toks


def test_engine_bias_and_penalties(cairn, family_model):
    prompt = family_model.start + [family_model.user, 25, 26, 27, family_model.assistant]
    BIAS_A, BIAS_B = pair(family_model)
    e = Engine(cairn, family_model.model)
    try:
        assert set(run(e, "b1", prompt, "", {BIAS_A: 100})) == {BIAS_A}, "a +100 bias wins every step"
        both = {BIAS_A: 100, BIAS_B: 100}
        plain = run(e, "b2", prompt, "", both)
        assert set(plain) <= {BIAS_A, BIAS_B}
        repeats = any(x == y for x, y in zip(plain, plain[1:]))
        assert repeats, f"without a penalty the greedy pair repeats somewhere: {plain} (nothing to show)"
        # A frequency penalty of 10 per occurrence (12 tokens: at most 60 against the +100 bias):
        # neither may get ahead of the other by two.
        pen = run(e, "b3", prompt, " freq=10", both)
        assert set(pen) <= {BIAS_A, BIAS_B}
        for i in range(1, len(pen) + 1):
            assert abs(pen[:i].count(BIAS_A) - pen[:i].count(BIAS_B)) <= 1, pen
        # Presence: after both appeared once, the penalty is the same for both and raw logits decide.
        pres = run(e, "b4", prompt, " pres=50", both)
        assert sorted(pres[:2]) == sorted([BIAS_A, BIAS_B]), pres
        # Repetition: the first choice of the pair, once it is in the prompt, is divided by 1000.
        first = plain[0]
        other = BIAS_B if first == BIAS_A else BIAS_A
        seen = run(e, "b5", prompt, " rep=1000", both, max_tokens=1)
        assert seen == [first], "neither id of the pair is in the prompt yet: no repetition penalty"
        rep = run(e, "b6", prompt[:-1] + [first, family_model.assistant], " rep=1000", both, max_tokens=1)
        assert rep == [other], (rep, first)
        # A bad BIAS refuses its SUBMIT (one ERROR) instead of running without it.
        payload = b"%d:abc" % BIAS_A
        e.send(f"BIAS b7 {len(payload)}\n".encode() + payload + b"\n")
        e.submit("b7", ids=prompt, max_tokens=2, logprobs=0)
        r = e.collect("b7")
        assert r.error and r.error.startswith("BAD_REQUEST") and "bias" in r.error, r.error
        assert run(e, "b8", prompt, "", None, max_tokens=2), "the engine goes on"
    finally:
        e.close()


def fake_server(model, tmp_path):
    return Server(model, str(tmp_path), fake=True)


def submits(srv):
    return [f for f in srv.fake_frames() if f["cmd"] == "SUBMIT"]


def test_gateway_sends_every_sampling_field(tiny_dsv4, tmp_path):
    srv = fake_server(tiny_dsv4, tmp_path)
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0.5,
                "top_k": 7, "min_p": 0.125, "repetition_penalty": 1.25, "presence_penalty": -0.5,
                "frequency_penalty": 1.5, "logit_bias": {"17": 5, "300": -100}, "seed": 99}
        st, _, r = srv.json("POST", "/v1/chat/completions", body)
        assert st == 200, r
        head = submits(srv)[-1]["header"]
        for key in ["top_k=7", "min_p=0.125", "rep=1.25", "pres=-0.5", "freq=1.5", "seed=99"]:
            assert key in head, (key, head)
        bias = [f for f in srv.fake_frames() if f["cmd"] == "BIAS"]
        assert bias and bias[-1]["id"] == submits(srv)[-1]["id"], bias
        pairs = sorted((int(k), float(v)) for k, v in (e.split(":") for e in bias[-1]["payload"].split()))
        assert pairs == [(17, 5.0), (300, -100.0)], bias
        # Anthropic top_k is honoured too.
        st, _, r = srv.json("POST", "/v1/messages", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 3, "top_k": 3},
                            {"anthropic-version": "2023-06-01"})
        assert st == 200, r
        assert "top_k=3" in submits(srv)[-1]["header"]
        # Without a seed each request draws its own.
        for _ in range(2):
            st, _, r = srv.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                                 "max_tokens": 2})
            assert st == 200
        seeds = [[k for k in f["header"] if k.startswith("seed=")] for f in submits(srv)[-2:]]
        assert seeds[0] and seeds[1] and seeds[0] != seeds[1], seeds
        # seed 0 is a seed like any other: it is sent, not mistaken for "none given"
        st, _, r = srv.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                             "max_tokens": 2, "seed": 0})
        assert st == 200 and "seed=0" in submits(srv)[-1]["header"], submits(srv)[-1]
    finally:
        srv.stop()


@pytest.mark.parametrize("field,value", [("presence_penalty", 2.5), ("frequency_penalty", -3),
                                         ("repetition_penalty", 0), ("min_p", 1.5), ("top_k", -1),
                                         ("logit_bias", {"abc": 1}), ("logit_bias", {"5": 101}),
                                         ("logit_bias", {"99999999": 1}), ("logit_bias", [1, 2])])
def test_bad_sampling_fields_are_400_naming_the_field(tiny_dsv4, tmp_path, field, value):
    srv = fake_server(tiny_dsv4, tmp_path)
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, field: value}
        st, _, r = srv.json("POST", "/v1/chat/completions", body)
        assert st == 400 and r["error"]["param"] == field, r
        assert not submits(srv), "a refused request never reaches the engine"
    finally:
        srv.stop()


def test_logit_bias_over_http_on_the_real_engine(family_model, tmp_path):
    srv = Server(family_model.model, str(tmp_path))
    try:
        st, _, r = srv.json("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 5, "temperature": 0,
                                                        "logit_bias": {str(pair(family_model)[0]): 100}})
        assert st == 200, r
        assert r["choices"][0]["text"] == "aaaaa", r
    finally:
        srv.stop()


def stream_choices(srv, path, body):
    """Texts per choice index from an OpenAI stream, and the usage chunk."""
    from test_http_robustness import open_stream, stream_lines
    sock, r = open_stream(srv.port, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    texts, usage, order = {}, None, []
    for line in stream_lines(r):
        if not line.startswith("data: {"):
            continue
        ev = json.loads(line[6:])
        usage = ev.get("usage") or usage
        for ch in ev["choices"]:
            i = ch["index"]
            if not order or order[-1] != i:
                order.append(i)
            texts[i] = texts.get(i, "") + (ch["delta"].get("content") or "" if "delta" in ch else ch["text"])
    sock.close()
    return texts, usage, order


def test_n_choices_batched_prompts_and_echo(family_model, tmp_path):
    srv = Server(family_model.model, str(tmp_path), ["--slots", "1"])
    try:
        chat = {"messages": [{"role": "user", "content": "Pick a word."}], "max_tokens": 6, "temperature": 1, "seed": 5}
        st, _, r = srv.json("POST", "/v1/chat/completions", {**chat, "n": 3})
        assert st == 200, r
        assert [c["index"] for c in r["choices"]] == [0, 1, 2]
        singles = []
        for i in range(3):
            st, _, one = srv.json("POST", "/v1/chat/completions", {**chat, "seed": 5 + i})
            singles.append(one)
            assert r["choices"][i]["message"]["content"] == one["choices"][0]["message"]["content"], i
        assert len({c["message"]["content"] for c in r["choices"]}) > 1, "choices with other seeds differ"
        assert r["usage"]["prompt_tokens"] == singles[0]["usage"]["prompt_tokens"]
        assert r["usage"]["completion_tokens"] == sum(s["usage"]["completion_tokens"] for s in singles)
        texts, usage, order = stream_choices(srv, "/v1/chat/completions", {**chat, "n": 3})
        assert order == [0, 1, 2] and [texts[i] for i in range(3)] == [c["message"]["content"] for c in r["choices"]]
        assert usage["completion_tokens"] == r["usage"]["completion_tokens"]

        comp = {"prompt": ["Once upon", [25, 26, 27]], "max_tokens": 5, "temperature": 1, "seed": 9, "n": 2}
        st, _, b = srv.json("POST", "/v1/completions", comp)
        assert st == 200, b
        assert [c["index"] for c in b["choices"]] == [0, 1, 2, 3]
        for i, c in enumerate(b["choices"]):
            st, _, one = srv.json("POST", "/v1/completions", {**comp, "prompt": comp["prompt"][i // 2], "n": 1,
                                                               "seed": 9 + i % 2})
            assert c["text"] == one["choices"][0]["text"], i
        texts, usage, order = stream_choices(srv, "/v1/completions", comp)
        assert order == [0, 1, 2, 3] and [texts[i] for i in range(4)] == [c["text"] for c in b["choices"]]

        st, _, e = srv.json("POST", "/v1/completions", {"prompt": "Echo me", "max_tokens": 4, "temperature": 0,
                                                         "echo": True})
        st0, _, plain = srv.json("POST", "/v1/completions", {"prompt": "Echo me", "max_tokens": 4, "temperature": 0})
        assert e["choices"][0]["text"] == "Echo me" + plain["choices"][0]["text"]
        texts, _, _ = stream_choices(srv, "/v1/completions", {"prompt": "Echo me", "max_tokens": 4, "temperature": 0,
                                                               "echo": True})
        assert texts[0] == e["choices"][0]["text"]
        st, _, bad = srv.json("POST", "/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1})
        assert st == 400 and bad["error"]["param"] == "echo"
        st, _, bad = srv.json("POST", "/v1/chat/completions", {**chat, "n": 9})
        assert st == 400 and bad["error"]["param"] == "n"
    finally:
        srv.stop()


# Kimi K3's encoder (encoding_k3.py) accepts thinking_effort low, high and max only, though the
# effort message it renders lists `medium` too; its apply_chat_template defaults to max. The
# gateway passes OpenAI's reasoning_effort / reasoning.effort (and Anthropic thinking, which names no
# effort) through unchanged, and refuses the values the encoder refuses with a 400 naming the field
# and the value (the template's accepted list, chat.h efforts) before anything reaches the engine.
@pytest.mark.parametrize("effort,rendered", [("low", "low"), ("high", "high"), ("max", "max"),
                                             ("medium", None), ("minimal", None), ("xhigh", None)])
def test_kimi_k3_reasoning_effort_follows_the_encoder(tiny_kimi_k3, tmp_path, effort, rendered):
    srv = fake_server(tiny_kimi_k3, tmp_path)
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "reasoning_effort": effort}
        st, _, r = srv.json("POST", "/v1/chat/completions", body)
        if rendered is None:
            assert st == 400 and r["error"]["param"] == "reasoning_effort" and f"'{effort}'" in r["error"]["message"], r
            st, _, r = srv.json("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 3,
                                                          "reasoning": {"effort": effort}})
            assert st == 400 and r["error"]["param"] == "reasoning.effort" and f"'{effort}'" in r["error"]["message"], r
            assert not submits(srv), "a refused request never reaches the engine"
            return
        assert st == 200, r
        prompt = submits(srv)[-1]["prompt"]
        assert prompt.count("thinking_effort=") == 1 and f"`thinking_effort={rendered}`" in prompt, prompt
        st, _, r = srv.json("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 3,
                                                      "reasoning": {"effort": effort}})
        assert st == 200, r
        assert f"`thinking_effort={rendered}`" in submits(srv)[-1]["prompt"]
    finally:
        srv.stop()


def test_kimi_k3_effort_defaults_to_max_and_needs_thinking(tiny_kimi_k3, tmp_path):
    srv = fake_server(tiny_kimi_k3, tmp_path)
    try:
        st, _, r = srv.json("POST", "/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1025,
                                                     "thinking": {"type": "enabled", "budget_tokens": 1024}},
                            {"anthropic-version": "2023-06-01"})
        assert st == 200, r
        assert "`thinking_effort=max`" in submits(srv)[-1]["prompt"]
        st, _, r = srv.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                             "max_tokens": 3, "reasoning_effort": "none"})
        assert st == 200, r
        assert "thinking_effort" not in submits(srv)[-1]["prompt"], "instruct mode renders no effort message"
    finally:
        srv.stop()


# GLM's chat_template.jinja has one switch, enable_thinking: no OpenAI effort level maps onto it,
# so "none" (thinking off) is the only effort it takes; every other level is a 400 naming the field
# and the value and listing what GLM takes, on both OpenAI endpoints, before the engine sees it.
@pytest.mark.parametrize("effort", ["minimal", "low", "medium", "high", "xhigh", "max"])
def test_glm_reasoning_effort_is_thinking_off_or_refused(tiny_glm, tmp_path, effort):
    srv = fake_server(tiny_glm, tmp_path)
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "reasoning_effort": effort}
        st, _, r = srv.json("POST", "/v1/chat/completions", body)
        assert st == 400 and r["error"]["param"] == "reasoning_effort", r
        assert f"'{effort}'" in r["error"]["message"] and "it takes none" in r["error"]["message"], r
        st, _, r = srv.json("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 3, "reasoning": {"effort": effort}})
        assert st == 400 and r["error"]["param"] == "reasoning.effort", r
        assert not submits(srv), "a refused request never reaches the engine"
        st, _, r = srv.json("POST", "/v1/chat/completions", dict(body, reasoning_effort="none"))
        assert st == 200, r
        assert submits(srv)[-1]["prompt"].endswith("<|assistant|></think>"), "none is the template's thinking off"
        st, _, r = srv.json("POST", "/v1/chat/completions", {k: v for k, v in body.items() if k != "reasoning_effort"} |
                            {"enable_thinking": True})
        assert st == 200 and submits(srv)[-1]["prompt"].endswith("<|assistant|><think>"), r
    finally:
        srv.stop()


# An assistant's reasoning comes back as reasoning_content or (vLLM, OpenRouter) reasoning. The
# DeepSeek V4 and Kimi K3 encoders read both (reasoning_content first), so either reaches the
# prompt; GLM's template and Inkling's renderer read reasoning_content only, so a `reasoning` they
# would drop is a 400 naming messages[i].reasoning (the same text in both fields renders as one).
def test_assistant_reasoning_field_is_rendered_or_refused(family_model, tmp_path):
    srv = fake_server(family_model.model, tmp_path)
    reads_both = family_model.name in ("deepseek_v4", "kimi_k3")
    try:
        # A tool-call loop (the reasoning belongs to the current turn, which every template keeps).
        call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        msgs = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "reasoning": "zqxreasoning", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
        body = {"messages": msgs, "max_tokens": 3, "thinking": True,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
        st, _, r = srv.json("POST", "/v1/chat/completions", body)
        if reads_both:
            assert st == 200, r
            assert "zqxreasoning" in submits(srv)[-1]["prompt"]
            both = [msgs[0], dict(msgs[1], reasoning_content="zqxcontent"), msgs[2]]
            st, _, r = srv.json("POST", "/v1/chat/completions", dict(body, messages=both))
            prompt = submits(srv)[-1]["prompt"]
            assert st == 200 and "zqxcontent" in prompt and "zqxreasoning" not in prompt, "reasoning_content first"
        else:
            assert st == 400 and "messages[1].reasoning" in r["error"]["message"], r
            assert not submits(srv)
            same = [msgs[0], dict(msgs[1], reasoning_content="zqxreasoning"), msgs[2]]
            st, _, r = srv.json("POST", "/v1/chat/completions", dict(body, messages=same))
            assert st == 200 and "zqxreasoning" in submits(srv)[-1]["prompt"], r
        st, _, r = srv.json("POST", "/v1/chat/completions",
                            dict(body, messages=[msgs[0], dict(msgs[1], reasoning=7), msgs[2]]))
        assert st == 400 and "messages[1].reasoning must be a string" in r["error"]["message"], r
    finally:
        srv.stop()


# Anthropic thinking (the SDK's ThinkingConfigParam): enabled needs an integer budget_tokens >= 1024
# and below max_tokens, as the Messages API requires, and reaches the engine as think_budget=N
# (engine-side enforcement: tests/test_think_budget.py); disabled is thinking off; adaptive and
# between_tools (the model decides whether to think), display omitted, unknown types and unknown
# keys are refused naming the field, before anything reaches the engine.
ASK = [{"role": "user", "content": "hi"}]
AV = {"anthropic-version": "2023-06-01"}


@pytest.mark.parametrize("thinking,max_tokens,param", [
    ({"type": "enabled", "budget_tokens": 1023}, 2048, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": 1024}, 1024, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": 1024.5}, 2048, "thinking.budget_tokens"),
    ({"type": "enabled"}, 2048, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": 1024, "display": "omitted"}, 2048, "thinking.display"),
    ({"type": "enabled", "budget_tokens": 1024, "effort": "high"}, 2048, "thinking"),
    ({"type": "disabled", "budget_tokens": 1024}, 2048, "thinking"),
    ({"type": "adaptive"}, 2048, "thinking.type"),
    ({"type": "between_tools"}, 2048, "thinking.type"),
    ({"type": "on"}, 2048, "thinking.type"),
    ({"budget_tokens": 1024}, 2048, "thinking"),
])
def test_anthropic_thinking_out_of_range_is_400(tiny_dsv4, tmp_path, thinking, max_tokens, param):
    srv = fake_server(tiny_dsv4, tmp_path)
    try:
        st, _, r = srv.json("POST", "/v1/messages", {"messages": ASK, "max_tokens": max_tokens, "thinking": thinking}, AV)
        assert st == 400 and r["type"] == "error" and r["error"]["type"] == "invalid_request_error", r
        assert param in r["error"]["message"], r
        assert not submits(srv), "a refused request never reaches the engine"
    finally:
        srv.stop()


def test_anthropic_thinking_budget_reaches_the_engine(tiny_dsv4, tmp_path):
    srv = fake_server(tiny_dsv4, tmp_path)
    try:
        for thinking, key, cue in [({"type": "enabled", "budget_tokens": 1500, "display": "summarized"},
                                    "think_budget=1500", "<think>"),
                                   ({"type": "disabled"}, None, "</think>"), (None, None, "</think>")]:
            body = {"messages": ASK, "max_tokens": 2048} | ({"thinking": thinking} if thinking else {})
            st, _, r = srv.json("POST", "/v1/messages", body, AV)
            assert st == 200, r
            f = submits(srv)[-1]
            assert f["prompt"].endswith(cue), f["prompt"][-40:]
            assert (key in f["header"]) if key else not any(k.startswith("think_budget") for k in f["header"]), f["header"]
    finally:
        srv.stop()


# OpenAI has no reasoning-token cap (Responses' reasoning takes effort, summary, context, mode):
# a summary (the reasoning comes back as written), another mode or context, or a key OpenAI does not
# define (OpenRouter's max_tokens) is refused, not ignored.
@pytest.mark.parametrize("reasoning,ok", [({"effort": "high", "context": "auto", "mode": "standard", "summary": None}, True),
                                          ({"summary": "auto"}, False), ({"generate_summary": "concise"}, False),
                                          ({"context": "all_turns"}, False), ({"mode": "pro"}, False),
                                          ({"max_tokens": 1024}, False)])
def test_responses_reasoning_fields_are_honoured_or_refused(tiny_dsv4, tmp_path, reasoning, ok):
    srv = fake_server(tiny_dsv4, tmp_path)
    try:
        st, _, r = srv.json("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 3, "reasoning": reasoning})
        if ok:
            assert st == 200, r
        else:
            assert st == 400 and r["error"]["param"] == "reasoning" and next(iter(reasoning)) in r["error"]["message"], r
            assert not submits(srv)
    finally:
        srv.stop()


def test_reasoning_caps_no_endpoint_honours_are_refused(tiny_dsv4, tmp_path):
    """Chat Completions has no reasoning cap: OpenRouter's `reasoning` object is refused, not ignored;
    Anthropic's output_config (effort, format) is not honoured either, so it is refused too."""
    srv = fake_server(tiny_dsv4, tmp_path)
    try:
        st, _, r = srv.json("POST", "/v1/chat/completions", {"messages": ASK, "max_tokens": 3,
                                                             "reasoning": {"max_tokens": 100}})
        assert st == 400 and r["error"]["param"] == "reasoning", r
        st, _, r = srv.json("POST", "/v1/messages", {"messages": ASK, "max_tokens": 3,
                                                     "output_config": {"effort": "low"}}, AV)
        assert st == 400 and "output_config" in r["error"]["message"], r
        assert not submits(srv)
    finally:
        srv.stop()


def test_responses_counts_reasoning_tokens(tiny_kimi_k3, tmp_path):
    """usage.output_tokens_details.reasoning_tokens counts the reply's reasoning block as the engine's
    budget does (markers included): Kimi K3's tiny model is still reasoning when max_output_tokens cuts
    it, so every output token is reasoning; with thinking off none is."""
    srv = Server(tiny_kimi_k3, str(tmp_path))
    try:
        st, _, r = srv.json("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 24, "temperature": 0,
                                                      "reasoning": {"effort": "high"}})
        assert st == 200, r
        text = "".join(c["text"] for o in r["output"] if o["type"] == "message" for c in o["content"])
        assert r["status"] == "incomplete" and r["output"][0]["type"] == "reasoning" and text == "", r["output"]
        u = r["usage"]
        assert u["output_tokens"] == 24 and u["output_tokens_details"]["reasoning_tokens"] == 24, u
        st, _, r = srv.json("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 24, "temperature": 0,
                                                      "reasoning": {"effort": "none"}})
        assert st == 200, r
        assert "reasoning" not in [o["type"] for o in r["output"]], r["output"]
        u = r["usage"]
        assert u["output_tokens"] > 0 and u["output_tokens_details"]["reasoning_tokens"] == 0, u
    finally:
        srv.stop()
