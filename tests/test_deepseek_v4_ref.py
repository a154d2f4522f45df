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
A near-tie the 3-seed spread misses (tools/numerics_sweep.py found it) is held to a wider test: the
engine must match one of 8 jittered reference runs there, and the reference to 1e-4 before it.
The rule tests show the rules can fail: a reference run with a wrong RoPE theta, standing in for
an engine, is rejected by both rules.

The layout tests check the generator (tools/tiny_deepseek_v4.py) against deepseek_v4.md §1/§8,
the contract the engine's loader is written to: every tensor name, dtype and shape, derived here
from the config independently of the generator.
"""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from conftest import PYTHON, ROOT

sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import deepseek_v4 as ref  # noqa: E402
import st  # noqa: E402
import tiny_deepseek_v4  # noqa: E402

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


# A near-tie found by tools/numerics_sweep.py: at position 25 the engine's top-1 (526) is not the
# reference's (1, 3.45 nats ahead) and its log-probs are 5.9 nats off, outside the 3-seed rule. The
# reference itself lands there under 1e-7 jitter (seeds 4, 5, 6 and 8 of 1..8): from position 19
# (a compressor window closes) the two differ by a rounding near its boundary that f32 and f64
# resolve differently, and at 24 and 25 a discrete choice follows it. Positions 0..18 agree to 1e-6.
# The test holds the engine to the reference's noise there, which the 3-seed rule cannot.
TIE_PROMPT = [0, 164, 428, 580, 260, 135, 10, 576, 901, 872, 40, 606, 841, 224, 987, 924, 585, 473, 177, 849,
              890, 892, 999, 800, 722, 639]
TIE_POS = 25


def test_qat_near_tie_is_the_references_own_noise(cairn, tiny_dsv4):
    got = engine(cairn, tiny_dsv4, TIE_PROMPT, "qat")
    base = reference(tiny_dsv4, TIE_PROMPT, "qat")
    assert max(abs(lp - b[i]) for g, b in zip(got[:19], base) for i, lp in g) < 1e-4, "agreement before the flip"
    tol = 1.5 * qat_spread(tiny_dsv4, TIE_PROMPT)[TIE_POS] + 1e-3
    near = [max(abs(lp - reference(tiny_dsv4, TIE_PROMPT, "qat", jitter_seed=s)[TIE_POS][i]) for i, lp in got[TIE_POS])
            for s in range(1, 9)]
    assert min(near) <= tol, f"no jittered reference run reproduces the engine at {TIE_POS}: {near} vs {tol}"


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


# ---- checkpoint layout (deepseek_v4.md §8) -------------------------------------------------

def fp8(out_f, in_f):
    return {".weight": ("F8_E4M3", [out_f, in_f]), ".scale": ("F8_E8M0", [-(-out_f // 128), -(-in_f // 128)])}


def fp4(out_f, in_f):
    return {".weight": ("I8", [out_f, in_f // 2]), ".scale": ("F8_E8M0", [out_f, in_f // 32])}


def expected_block(c, p, ratio, hashed):
    d, h, hd, ql = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    g, ol, e, inter = c["o_groups"], c["o_lora_rank"], c["n_routed_experts"], c["moe_intermediate_size"]
    mix = (2 + c["hc_mult"]) * c["hc_mult"]
    t = {f"{p}.attn_norm.weight": ("BF16", [d]), f"{p}.ffn_norm.weight": ("BF16", [d]),
         f"{p}.attn.attn_sink": ("F32", [h]), f"{p}.attn.q_norm.weight": ("BF16", [ql]),
         f"{p}.attn.kv_norm.weight": ("BF16", [hd]), f"{p}.ffn.gate.weight": ("BF16", [e, d])}
    for sub in ("attn", "ffn"):
        t.update({f"{p}.hc_{sub}_fn": ("F32", [mix, c["hc_mult"] * d]), f"{p}.hc_{sub}_base": ("F32", [mix]),
                  f"{p}.hc_{sub}_scale": ("F32", [3])})
    lin = {"attn.wq_a": fp8(ql, d), "attn.wq_b": fp8(h * hd, ql), "attn.wkv": fp8(hd, d),
           "attn.wo_a": fp8(g * ol, h * hd // g), "attn.wo_b": fp8(d, g * ol),
           "ffn.shared_experts.w1": fp8(inter, d), "ffn.shared_experts.w3": fp8(inter, d),
           "ffn.shared_experts.w2": fp8(d, inter)}
    for j in range(e):
        lin.update({f"ffn.experts.{j}.w1": fp4(inter, d), f"ffn.experts.{j}.w3": fp4(inter, d),
                    f"ffn.experts.{j}.w2": fp4(d, inter)})
    for name, parts in lin.items():
        t.update({f"{p}.{name}{k}": v for k, v in parts.items()})
    t[f"{p}.ffn.gate.tid2eid" if hashed else f"{p}.ffn.gate.bias"] = (
        ("I64", [c["vocab_size"], c["num_experts_per_tok"]]) if hashed else ("F32", [e]))
    comps = [("attn.compressor", hd)] if ratio else []
    if ratio == 4:
        ih, ihd = c["index_n_heads"], c["index_head_dim"]
        comps.append(("attn.indexer.compressor", ihd))
        t[f"{p}.attn.indexer.weights_proj.weight"] = ("BF16", [ih, d])
        t.update({f"{p}.attn.indexer.wq_b{k}": v for k, v in fp8(ih * ihd, ql).items()})
    for name, dim in comps:
        coff = 2 if ratio == 4 else 1
        t.update({f"{p}.{name}.ape": ("F32", [ratio, coff * dim]), f"{p}.{name}.norm.weight": ("BF16", [dim]),
                  f"{p}.{name}.wkv.weight": ("BF16", [coff * dim, d]),
                  f"{p}.{name}.wgate.weight": ("BF16", [coff * dim, d])})
    return t


def expected_inventory(c):
    v, d, hc, n = c["vocab_size"], c["hidden_size"], c["hc_mult"], c["num_hidden_layers"]
    head = {"hc_head_fn": ("F32", [hc, hc * d]), "hc_head_base": ("F32", [hc]), "hc_head_scale": ("F32", [1])}
    t = {"embed.weight": ("BF16", [v, d]), "head.weight": ("BF16", [v, d]), "norm.weight": ("BF16", [d]), **head}
    for i in range(n):
        t.update(expected_block(c, f"layers.{i}", c["compress_ratios"][i], i < c["num_hash_layers"]))
    for j in range(c["num_nextn_predict_layers"]):
        p = f"mtp.{j}"
        t.update(expected_block(c, p, c["compress_ratios"][n + j], False))
        for name in ("e_proj", "h_proj"):
            t.update({f"{p}.{name}{k}": val for k, val in fp8(d, d).items()})
        t.update({f"{p}.{name}.weight": ("BF16", [d]) for name in ("enorm", "hnorm", "norm")})
        t.update({f"{p}.{k}": val for k, val in head.items()})
    return t


def test_tiny_layout_matches_spec(tiny_dsv4):
    c = json.load(open(os.path.join(tiny_dsv4, "config.json")))
    assert c["model_type"] == "deepseek_v4" and c["vocab_size"] == VOCAB
    assert c["compress_ratios"] == [0, 4, 8, 4, 0] and c["num_nextn_predict_layers"] == 1
    assert c["quantization_config"]["weight_block_size"] == [128, 128] and c["rope_scaling"]["type"] == "yarn"
    tensors = st.read_dir(tiny_dsv4)
    got = {k: (dt, list(shape)) for k, (dt, shape, _) in tensors.items()}
    want = expected_inventory(c)
    assert sorted(set(want) - set(got)) == [] and sorted(set(got) - set(want)) == []
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not wrong, wrong
    index = json.load(open(os.path.join(tiny_dsv4, "model.safetensors.index.json")))
    assert set(index["weight_map"]) == set(want)


def test_tiny_weights_exercise_every_path(tiny_dsv4):
    tensors = st.read_dir(tiny_dsv4)
    dt, shape, raw = tensors["layers.0.ffn.gate.tid2eid"]
    t2e = np.frombuffer(raw, dtype=np.int64).reshape(shape)
    assert (t2e >= 0).all() and (t2e < 4).all() and (t2e[:, 0] != t2e[:, 1]).all(), "hash rows need distinct experts"
    for name in ("layers.1.ffn.gate.bias", "layers.1.attn.attn_sink", "layers.1.attn.compressor.ape",
                 "layers.2.attn.compressor.ape", "layers.1.attn.indexer.compressor.ape"):
        assert np.abs(np.frombuffer(tensors[name][2], dtype=np.float32)).mean() > 0.1, f"{name} is ~zero"
    # FP4 codes round-trip to finite, non-trivial weights; some hidden units exceed the SwiGLU clamp
    w1 = ref.dequantise(tensors, "layers.1.ffn.experts.0.w1.weight")
    assert np.isfinite(w1).all() and w1.std() > 0
    x = np.random.default_rng(0).standard_normal(w1.shape[1])
    assert np.abs(w1 @ x).max() > 10, "no expert unit reaches swiglu_limit: the clamp would be dead code"


def test_tokenizer_specials(tiny_dsv4):
    tok = json.load(open(os.path.join(tiny_dsv4, "tokenizer.json"), encoding="utf-8"))
    added = {t["id"]: t["content"] for t in tok["added_tokens"]}
    assert added[0] == "<｜begin▁of▁sentence｜>" and added[1] == "<｜end▁of▁sentence｜>"
    for s in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜latest_reminder｜>", "｜DSML｜"):
        assert s in added.values(), s
    ids = set(tok["model"]["vocab"].values()) | set(added)
    assert ids == set(range(VOCAB))


def test_bench_config_is_big_and_same_shape():
    """The bench size (not generated here: 2.5 GB) keeps the architecture and exceeds 2 GiB."""
    c = tiny_deepseek_v4.config_for("bench")
    tiny = tiny_deepseek_v4.config_for("tiny")
    assert set(c) == set(tiny)
    assert len(c["compress_ratios"]) == c["num_hidden_layers"] + c["num_nextn_predict_layers"]
    assert {0, 4} <= set(c["compress_ratios"]) and any(r not in (0, 4) for r in c["compress_ratios"])
    total = sum(int(np.prod(shape)) * st.DTYPE_SIZE[dt] for dt, shape in expected_inventory(c).values())
    assert total >= 2 << 30, total
