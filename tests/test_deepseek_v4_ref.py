"""DeepSeek V4 engine vs the independent float64 reference (tools/ref/deepseek_v4.py).

Prompts of 8, 21 and 72 seeded token ids (BOS first) on the tiny model exercise the window ring
(8 slots), CSA/HCA emission and overlap, indexer top-k and the hash/biased MoE.

Tolerance rules:
- exact numerics (no activation rounding in either program): at every position the top-1 id is
  equal, and every logprob of the engine's top-5 is within 0.002 of the reference's logprob of
  the same id; a reference top-5 id the engine did not list must not beat the engine's 5th
  logprob by more than 0.002.
- qat numerics: BF16/E4M3 rounding turns 1e-7 differences into quantisation noise, so two
  correct implementations legitimately differ. The reference measures that spread itself: it is
  re-run 3 times with every value jittered by 1e-7 before each BF16 rounding (see its Numerics).
  Per position, spread = max over those runs of max |Δlogprob| over the reference's top-5 ids,
  and the engine must satisfy max |Δlogprob| over its top-5 ids <= 1.5 * spread + 1e-3.
The last tests show the rules can fail: a reference run with a wrong RoPE theta, standing in for
an engine, is rejected by both rules.
"""
import json
import os
import random
import subprocess
import sys

import pytest

from conftest import PYTHON, ROOT

sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import deepseek_v4 as ref  # noqa: E402

LENGTHS = [8, 21, 72]
EXACT_TOL = 0.002
JITTER = 1e-7
JITTER_SEEDS = (1, 2, 3)
VOCAB = 1024          # tiny model vocab_size


def prompt(n, seed=2024):
    rng = random.Random(seed * 1000 + n)
    return [0] + [rng.randrange(2, VOCAB) for _ in range(n - 1)]


_ref_cache = {}


def reference(model, ids, numerics, jitter_seed=None, overrides=None):
    """Full-vocabulary logprobs per position, as [{id: logprob}], cached per argument set."""
    key = (model, tuple(ids), numerics, jitter_seed, tuple(sorted((overrides or {}).items())))
    if key not in _ref_cache:
        rows = ref.run(model, ids, numerics, top=VOCAB, jitter=JITTER if jitter_seed else 0.0,
                       jitter_seed=jitter_seed or 0, overrides=overrides)
        _ref_cache[key] = [{e["id"]: e["logprob"] for e in r["top"]} for r in rows]
    return _ref_cache[key]


def top5(dist):
    """[(id, logprob)] of a {id: logprob} map, best first (ties: lower id)."""
    return sorted(dist.items(), key=lambda kv: (-kv[1], kv[0]))[:5]


def engine(cairn, model, ids, numerics):
    """The engine's top-5 per position, as [[(id, logprob)] * 5]."""
    cmd = [cairn, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "0",
           "--echo-logprobs", "5", "--numerics", numerics, "--format", "jsonl"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}"
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    rows = [r for r in rows if "pos" in r]
    assert [r["pos"] for r in rows] == list(range(len(ids))), f"positions in engine output: {p.stdout[:500]}"
    return [[(e["id"], e["logprob"]) for e in r["top"]] for r in rows]


def exact_violations(got, want):
    """Positions breaking the exact-mode rule, with why. got: engine top-5 lists; want: ref dists."""
    bad = []
    for pos, (g, w) in enumerate(zip(got, want)):
        wtop = top5(w)
        if g[0][0] != wtop[0][0]:
            bad.append((pos, f"top-1 {g[0][0]} vs reference {wtop[0][0]}"))
            continue
        d = max(abs(lp - w[i]) for i, lp in g)
        if d > EXACT_TOL:
            bad.append((pos, f"max |dlogprob| {d:.5f} > {EXACT_TOL}"))
            continue
        listed = {i for i, _ in g}
        missed = [i for i, lp in wtop if i not in listed and lp > g[-1][1] + EXACT_TOL]
        if missed:
            bad.append((pos, f"reference top-5 ids {missed} missing from the engine's top-5"))
    return bad


def qat_spread(model, ids):
    """Per position: how far 1e-7 jitter moves the reference's own top-5 logprobs."""
    base = reference(model, ids, "qat")
    spread = [0.0] * len(ids)
    for seed in JITTER_SEEDS:
        jit = reference(model, ids, "qat", jitter_seed=seed)
        for pos, (b, j) in enumerate(zip(base, jit)):
            spread[pos] = max(spread[pos], max(abs(lp - j[i]) for i, lp in top5(b)))
    return spread


def qat_violations(got, model, ids):
    base = reference(model, ids, "qat")
    bad = []
    for pos, (g, b, s) in enumerate(zip(got, base, qat_spread(model, ids))):
        d = max(abs(lp - b[i]) for i, lp in g)
        if d > 1.5 * s + 1e-3:
            bad.append((pos, f"max |dlogprob| {d:.4f} > 1.5 * spread {s:.4f} + 0.001"))
    return bad


def as_engine_output(dists):
    """A reference run shaped like engine output (top-5 lists), to test the rules themselves."""
    return [top5(d) for d in dists]


@pytest.mark.parametrize("n", LENGTHS)
def test_exact_numerics_match_reference(cairn, tiny_dsv4, n):
    ids = prompt(n)
    bad = exact_violations(engine(cairn, tiny_dsv4, ids, "exact"), reference(tiny_dsv4, ids, "exact"))
    assert not bad, f"{len(bad)}/{n} positions off: {bad[:5]}"


@pytest.mark.parametrize("n", LENGTHS)
def test_qat_numerics_within_reference_spread(cairn, tiny_dsv4, n):
    ids = prompt(n)
    bad = qat_violations(engine(cairn, tiny_dsv4, ids, "qat"), tiny_dsv4, ids)
    assert not bad, f"{len(bad)}/{n} positions off: {bad[:5]}"


def test_model_is_not_degenerate(tiny_dsv4):
    """Flat outputs would let any engine pass: the reference must be confident and varied."""
    dists = reference(tiny_dsv4, prompt(72), "exact")
    tops = [top5(d) for d in dists]
    assert len({t[0][0] for t in tops}) > 36, "top-1 barely changes across positions"
    margins = sorted(t[0][1] - t[4][1] for t in tops)
    assert margins[len(margins) // 2] > 0.5, f"median top-1 vs top-5 margin {margins[len(margins) // 2]:.3f} nats"


def test_reference_cli_matches_library(tiny_dsv4):
    ids = prompt(8)
    p = subprocess.run([PYTHON, os.path.join(ROOT, "tools", "ref", "deepseek_v4.py"), tiny_dsv4,
                        "--prompt-ids", ",".join(map(str, ids)), "--numerics", "qat", "--top", "5"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["pos"] for r in rows] == list(range(8))
    want = reference(tiny_dsv4, ids, "qat")
    for r, w in zip(rows, want):
        assert [(e["id"], e["logprob"]) for e in r["top"]] == top5(w)


def test_reference_cli_rejects_bad_ids(tiny_dsv4):
    p = subprocess.run([PYTHON, os.path.join(ROOT, "tools", "ref", "deepseek_v4.py"), tiny_dsv4,
                        "--prompt-ids", f"0,{VOCAB}"], capture_output=True, text=True)
    assert p.returncode != 0 and "outside the vocabulary" in p.stderr


WRONG_THETA = {"compress_rope_theta": 120000.0, "rope_theta": 12000.0}


def test_exact_rule_rejects_wrong_rope_theta(tiny_dsv4):
    ids = prompt(21)
    wrong = as_engine_output(reference(tiny_dsv4, ids, "exact", overrides=WRONG_THETA))
    assert exact_violations(wrong, reference(tiny_dsv4, ids, "exact"))
    # and the rule accepts the reference's own jittered run (the tolerance is not too tight)
    jittered = as_engine_output(reference(tiny_dsv4, ids, "exact", jitter_seed=1))
    assert not exact_violations(jittered, reference(tiny_dsv4, ids, "exact"))


def test_qat_rule_rejects_wrong_rope_theta(tiny_dsv4):
    ids = prompt(72)
    wrong = as_engine_output(reference(tiny_dsv4, ids, "qat", overrides=WRONG_THETA))
    assert qat_violations(wrong, tiny_dsv4, ids)
