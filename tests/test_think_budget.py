"""The reasoning budget (SUBMIT think_budget=N, Anthropic thinking.budget_tokens) on every family's
tiny model, over the engine protocol with tokids=1, so the ids the engine emitted are read back
exactly (src/serve/think_budget.h).

The markers come from the family's descriptor (`cairn families`): the reply opens reasoning at
the cue, or where the model writes tool_example.think_start; reasoning_end ends it; the
example's think_end (default "</think>") is the close the engine writes. A random tiny model never
closes its reasoning by itself within a few tokens (asserted), so the forcing is seen exactly:
greedy, the budgeted reply is the unbudgeted one up to N minus the end marker, then the close.
A family whose model opens reasoning itself is steered into it by a logit bias on think_start,
which also shows a closed budget never lets it open another block.
"""
import json
import os
import subprocess

import pytest

from engine_client import Engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODE = os.path.join(ROOT, "build", "tests", "tool_tok_encode")
CTX = 256
BUDGET = 9


def encode(family_model, texts, tmp_path):
    """tok_encode's ids of each text (special tokens matched), as the engine spells markers."""
    src = tmp_path / "strings.json"
    src.write_text(json.dumps(texts))
    out = subprocess.run([ENCODE, os.path.join(family_model.model, "tokenizer.json"), str(src)], check=True,
                         capture_output=True, text=True).stdout
    return [r["ids"] for r in json.loads(out)]


def markers(family_model, tmp_path):
    ex = family_model.desc["tool_example"]
    close_text = ex["think_end"] or "</think>"
    end_text = family_model.desc["reasoning_end"] or close_text
    texts = [end_text, close_text] + ([ex["think_start"]] if ex["think_start"] else [])
    ids = encode(family_model, texts, tmp_path)
    return ids[0], ids[1], (ids[2] if len(ids) > 2 else [])


def prompt(family_model):
    return family_model.start + [family_model.user] + list(range(30, 42)) + [family_model.assistant]


def generate(engine, ids, budget=None, bias=None, max_tokens=24, rid=None):
    extra = " tokids=1" + (f" think_budget={budget}" if budget else "")
    rid = rid or "r%d" % (len(engine.replies) + 1)
    if bias:
        payload = " ".join(f"{t}:{b}" for t, b in bias.items()).encode()
        engine.send(f"BIAS {rid} {len(payload)}\n".encode() + payload + b"\n")
    engine.submit(rid, ids=ids, max_tokens=max_tokens, logprobs=0, extra=extra)
    return engine.collect(rid)


@pytest.fixture
def spawn(cairn, family_model):
    started = []

    def start():
        e = Engine(cairn, family_model.model, "--ctx", str(CTX))
        started.append(e)
        return e

    yield start
    for e in started:
        e.kill()


def budgeted(spawn, family_model, tmp_path):
    """(prompt, unbudgeted reply, budgeted reply, bias, markers) on fresh engines."""
    end, close, open_ = markers(family_model, tmp_path)
    bias = {open_[0]: 100} if open_ else None         # steer the model into writing think_start
    p = prompt(family_model)
    free = generate(spawn(), p, bias=bias)
    capped = generate(spawn(), p, BUDGET, bias=bias)
    assert free.error is None and capped.error is None, (free.error, capped.error)
    return p, free.toks, capped.toks, bias, (end, close, open_)


def test_reasoning_is_closed_by_the_family_close_at_the_budget(spawn, family_model, tmp_path):
    _, free, capped, _, (end, close, open_) = budgeted(spawn, family_model, tmp_path)
    at = BUDGET - len(end)                 # reasoning tokens sampled before the close starts
    assert not any(free[i:i + len(end)] == end for i in range(len(free))), "the model never closes by itself"
    assert len(capped) == len(free) == 24
    assert capped[:at] == free[:at], "up to the budget the reply is what the model samples"
    assert capped[at:at + len(close)] == close, f"then the family's close {close}, got {capped[at:]}"
    if open_:
        assert capped[:len(open_)] == open_, "the reasoning block was opened by the model"
        assert open_[0] not in capped[at + len(close):], "a closed budget opens no second block"
    reasoning = capped[:at + len(end)]
    assert len(reasoning) == BUDGET, "reasoning, markers included, takes exactly the budget"


def test_budgeted_reply_is_deterministic_and_the_next_turn_reuses_it(spawn, family_model, tmp_path):
    p, _, capped, bias, _ = budgeted(spawn, family_model, tmp_path)
    e = spawn()
    warm = generate(e, p, BUDGET, bias=bias)
    again = generate(e, p, BUDGET, bias=bias)
    assert warm.toks == capped and again.toks == capped, "warm == cold, and the same request twice is identical"
    # The reply ended by max_tokens, so its last token was never fed: the record is prompt + the rest.
    turn2 = p + capped + [family_model.user] + list(range(50, 56)) + [family_model.assistant]
    r = generate(e, turn2, BUDGET, bias=bias)
    assert r.error is None and r.reuse == len(p) + len(capped) - 1, (r.reuse, len(p), len(capped))
    cold = generate(spawn(), turn2, BUDGET, bias=bias)
    assert r.toks == cold.toks, "the second turn on the reused record is what a cold engine answers"


def test_a_budget_smaller_than_the_markers_is_refused_or_bans(spawn, family_model, tmp_path):
    """Below the end marker's length the engine refuses the request; a one-token end takes budget 1,
    which closes at once (cue-opened) or leaves no room to open a block at all (think_start)."""
    end, close, open_ = markers(family_model, tmp_path)
    e = spawn()
    bias = {open_[0]: 100} if open_ else None
    if len(end) > 1:
        r = generate(e, prompt(family_model), len(end) - 1, max_tokens=4)
        assert r.error and r.error.startswith("BAD_REQUEST") and "think_budget" in r.error, r.error
    else:
        r = generate(e, prompt(family_model), 1, bias=bias, max_tokens=4)
        if open_:
            assert open_[0] not in r.toks, "no room for think_start + end: the model may not open reasoning"
        else:
            assert r.toks[:len(close)] == close, "budget 1 is the end marker alone"
    e.send(b"SUBMIT z 0 3 4 0 1 0 ids=1 think_budget=0\n1 2\n")
    f = e.frame()[0]
    assert f[:3] == ["ERROR", "z", "BAD_REQUEST"] and "think_budget" in " ".join(f), f
