"""`make deepseek-v4-tiny-check`: the DeepSeek V4 engine and prefix-reuse checks on the tiny model,
wired as upstream wires its tiny check (protocol.md §3.2-3.3), each printing one PASS line.

Engine checks speak the line protocol to `cairn engine` and hold it to the independent float64
reference (tools/ref/deepseek_v4.py) under exact numerics: every greedy token the engine emits
is the reference's top-1 at that position and its logprob agrees within 0.002. Prefix checks run
each turn warm and again on a freshly started engine and require identical tokens, asserting
the exact reuse count so a reuse that silently never fires fails.
"""
import os
import random
import sys

from conftest import ROOT
from engine_client import Engine, cold

sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import deepseek_v4 as ref  # noqa: E402

CTX = ["--ctx", "128"]
LP_TOL = 0.002


def case(n, seed):
    """BOS then seeded ordinary ids (the tiny vocabulary has specials below 14)."""
    r = random.Random(seed)
    return [0] + [r.randrange(14, 1024) for _ in range(n - 1)]


def check_against_reference(cairn, model, prompt, gen):
    e = Engine(cairn, model, *CTX, "--numerics", "exact")
    try:
        t = e.generate(prompt, gen)
    finally:
        e.close()
    assert t.done is not None, t.error
    assert t.completion == len(t.ids) == gen, "the tiny model emitted an EOS: choose another seed"
    rows = ref.run(model, prompt + t.ids[:-1], "exact", top=2)
    want = [rows[len(prompt) - 1 + i]["top"][0] for i in range(gen)]
    assert t.ids == [w["id"] for w in want], f"engine {t.ids} vs reference {[w['id'] for w in want]}"
    worst = max(abs(lp - w["logprob"]) for lp, w in zip(t.lps, want))
    assert worst <= LP_TOL, f"logprob differs by {worst:.5f}"
    return worst


def test_engine_short(cairn, tiny_dsv4):
    worst = check_against_reference(cairn, tiny_dsv4, case(8, 1), 6)
    print(f"PASS engine short: 6/6 greedy tokens equal the float64 reference (max |dlogprob| {worst:.1e})")


def test_engine_long(cairn, tiny_dsv4):
    worst = check_against_reference(cairn, tiny_dsv4, case(72, 2), 4)
    print(f"PASS engine long: 72-token prompt across the 64-token prefill chunk, 4/4 tokens equal the "
          f"reference (max |dlogprob| {worst:.1e})")


def test_engine_sessions(cairn, tiny_dsv4):
    prompt = case(21, 3)
    runs = [cold(cairn, tiny_dsv4, prompt, 5, args=CTX) for _ in range(3)]
    assert all(r.ids == runs[0].ids and r.prompt_tokens == len(prompt) for r in runs)
    print(f"PASS engine sessions: 3 fresh engines, prompt={len(prompt)} generated={len(runs[0].ids)}, identical")


def test_serve_two_requests(cairn, tiny_dsv4):
    e = Engine(cairn, tiny_dsv4, *CTX)
    prompt = case(12, 4)
    try:
        a = e.generate(prompt, 5, temperature=0.0, top_p=1.0)
        b = e.generate(prompt, 5, temperature=0.0, top_p=1.0)
    finally:
        e.close()
    assert a.text == b.text and a.ids == b.ids and a.prompt_tokens == b.prompt_tokens == len(prompt)
    print("PASS serve: two requests on one engine, same answer, prompt_tokens exact")


def test_prefix_reuse(cairn, tiny_dsv4):
    prompt = case(12, 5)
    e = Engine(cairn, tiny_dsv4, *CTX)
    try:
        t1 = e.generate(prompt, 4)
        turn2 = prompt + t1.ids[:-1] + [prompt[0]]
        t2 = e.generate(turn2, 4)
    finally:
        e.close()
    assert t1.reuse == 0
    want = len(prompt) + len(t1.fed())
    assert t2.reuse == want, f"reuse {t2.reuse}, want {want}"
    c = cold(cairn, tiny_dsv4, turn2, 4, args=CTX)
    assert c.reuse == 0 and c.ids == t2.ids
    print(f"PASS prefix reuse: {t2.reuse} tokens reused, output identical to a cold prefill")


def test_prefix_repeat(cairn, tiny_dsv4):
    prompt = case(12, 6)
    e = Engine(cairn, tiny_dsv4, *CTX)
    try:
        t1 = e.generate(prompt, 4)
        t2 = e.generate(prompt, 4)
    finally:
        e.close()
    assert t2.reuse == len(prompt) - 1 and t2.ids == t1.ids
    print(f"PASS prefix repeat: identical prompt restores the n-1 checkpoint ({t2.reuse} reused), answer unchanged")


def test_prefix_reset(cairn, tiny_dsv4):
    prompt = case(12, 7)
    shifted = [i + 1 for i in prompt]
    e = Engine(cairn, tiny_dsv4, *CTX)
    try:
        e.generate(prompt, 4)
        t = e.generate(shifted, 4)
    finally:
        e.close()
    c = cold(cairn, tiny_dsv4, shifted, 4, args=CTX)
    assert t.reuse == 0 and t.ids == c.ids
    print("PASS prefix reset: divergent prompt re-prefills and matches cold")
