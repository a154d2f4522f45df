"""The family contract: what every registered family must satisfy, taken by registering alone
(family_model is parametrized from `cairn families`). Only the descriptor and the model's own
files are read; nothing here names a family.

- chunking invariance: any split of a prompt into forward calls (random splits, splits at small
  power-of-two boundaries and their neighbours, where windows and compression ratios sit, token by
  token, and across the families' internal passes of 64 or 256 rows) gives the same per-position logprobs, the same
  generation and a byte-identical state dump;
- snapshot -> serialize -> restore -> continue mid-prompt equals an uninterrupted run;
- a light checkpoint captured inside one forward call is byte for byte the light snapshot of a
  prefill split at that position (tests/c/tool_capture_split.c);
- a checkpoint captured inside a forward call (a turn boundary) restores to a state that answers
  exactly like a cold engine, and CAPS reports the capabilities the descriptor declares;
- the interface shape conformance checks (jsonl rows of `cairn run`, two engine turns whose reuse
  is prompt + reply - 1).
test_engine_protocol.py completes the contract over the engine (warm == cold for extend, repeat,
edit, divergent prompts, cross-slot copies, persistence restarts), on the same registry.
"""
import json
import os
import random
import subprocess

import pytest

from conftest import ROOT
from engine_client import Engine, cold

GEN = 5


def ids_arg(ids):
    return ",".join(map(str, ids))


def run(cairn, model, *args):
    p = subprocess.run([cairn, "run", "-m", model, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, f"cairn run {' '.join(map(str, args))} failed: {p.stderr[-2000:]}"
    return p


def traced(cairn, model, ids, *extra):
    """A greedy run printing every prompt position's top-3 and each generated token."""
    return run(cairn, model, "--prompt-ids", ids_arg(ids), "-n", GEN, "--temperature", 0, "--format", "jsonl",
               "--top-logprobs", 3, "--echo-logprobs", 3, *extra).stdout


def prompt_of(fam, n, seed):
    r = random.Random(seed)
    return fam.start + [r.randrange(20, fam.ordinary_hi) for _ in range(n - len(fam.start))]


PROMPT_LEN = 40


@pytest.fixture(scope="module")
def baseline(cairn, family_model, tmp_path_factory):
    ids = prompt_of(family_model, PROMPT_LEN, 1)
    dump = tmp_path_factory.mktemp(family_model.name) / "one_call.state"
    out = traced(cairn, family_model.model, ids, "--dump-state", dump)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["pos"] for r in rows[:PROMPT_LEN]] == list(range(PROMPT_LEN)) and len(rows) == PROMPT_LEN + GEN
    assert len({r["top"][0]["id"] for r in rows}) > len(rows) // 4, "degenerate model output"
    return ids, out, dump.read_bytes()


def boundary_splits(n):
    """Cuts just before, at and after every power of two up to n: where ring windows wrap and
    compressors emit in the families we know, without asking which family this is."""
    out = {}
    p = 2
    while p < n:
        for cut in (p - 1, p, p + 1):
            if 0 < cut < n:
                out[f"at_{cut}"] = [cut]
        p *= 2
    return out


def random_splits(n, count, seed):
    r = random.Random(seed)
    out = {}
    for i in range(count):
        cuts = sorted(r.sample(range(1, n), r.randrange(1, 6)))
        out[f"random_{i}"] = [b - a for a, b in zip([0] + cuts, cuts)]
    return out


SPLITS = {"token_by_token": [1] * (PROMPT_LEN - 1), **boundary_splits(PROMPT_LEN), **random_splits(PROMPT_LEN, 4, 7)}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_chunking_invariance(cairn, family_model, tmp_path, baseline, name):
    ids, out, state = baseline
    dump = tmp_path / "split.state"
    assert traced(cairn, family_model.model, ids, "--prefill-chunks", ids_arg(SPLITS[name]), "--dump-state", dump) == out
    assert dump.read_bytes() == state, "the state after a split prefill differs from the one-call state"


def test_state_dump_depends_on_the_prompt(cairn, family_model, tmp_path, baseline):
    """The byte comparisons mean something: one different last token changes the state."""
    ids, _, state = baseline
    dump = tmp_path / "other.state"
    traced(cairn, family_model.model, ids[:-1] + [ids[-1] + 1], "--dump-state", dump)
    assert dump.read_bytes() != state


def test_long_prompt_across_internal_passes(cairn, family_model, tmp_path):
    """300 tokens: families bound their scratch by passes of 64 or 256 rows inside one forward call
    (`--prefill-chunks 300` makes the whole prompt one call). That call, the default calls of 256,
    calls straddling 64 and 256, and token by token all agree bit for bit."""
    ids = prompt_of(family_model, 300, 2)
    splits = [["--prefill-chunks", "300"], [], ["--prefill-chunks", "63,3,20,170,10"],
              ["--prefill-chunks", ids_arg([1] * 299)]]
    dumps = [tmp_path / f"{i}.state" for i in range(len(splits))]
    outs = [traced(cairn, family_model.model, ids, "--dump-state", d, *s) for d, s in zip(dumps, splits)]
    assert all(o == outs[0] for o in outs[1:])
    assert all(d.read_bytes() == dumps[0].read_bytes() for d in dumps[1:])


@pytest.mark.parametrize("k", [1, 7, 8, 9, 17, PROMPT_LEN - 1, PROMPT_LEN])
def test_snapshot_restore_mid_prompt(cairn, family_model, baseline, k):
    ids, out, _ = baseline
    assert traced(cairn, family_model.model, ids, "--snapshot-at", k) == out


CAPTURES = [1, 7, 8, 9, 17, 33, PROMPT_LEN - 1, PROMPT_LEN]    # at most STATE_MAX_CAPTURES


def test_capture_equals_split_snapshot(family_model, baseline):
    """Captures armed at window/compression boundaries and their neighbours during one prefill
    call serialize to exactly the bytes of a light snapshot after a prefill of that length; the
    snapshots differ from each other, so the comparison is not of empty blobs."""
    ids, _, _ = baseline
    tool = os.path.join(ROOT, "build", "tests", "tool_capture_split")
    p = subprocess.run([tool, family_model.model, ids_arg(ids), ids_arg(CAPTURES)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["k"] for r in rows] == CAPTURES
    assert all(r["equal"] for r in rows), rows
    assert len({r["hash"] for r in rows}) == len(CAPTURES), "snapshots at different positions are identical"


def test_caps_match_the_descriptor(cairn, family_model):
    e = Engine(cairn, family_model.model, "--ctx", "128")
    try:
        caps = dict(kv.split("=", 1) for kv in e.caps.split()[1:])
    finally:
        e.close()
    assert caps["family"] == family_model.name
    assert caps["truncate"] == ("1" if family_model.desc["truncates"] else "0")
    e = Engine(cairn, family_model.model, "--ctx", "128", "--ckpt-mb", "0")
    try:
        assert dict(kv.split("=", 1) for kv in e.caps.split()[1:])["checkpoints"] == "0"
    finally:
        e.close()


def test_captured_turn_checkpoint_restores_exactly(cairn, family_model):
    """A turn boundary inside one prefill: an edit after it continues from there (a checkpoint
    captured inside the forward call, or a truncation), and answers like a cold engine."""
    fam = family_model
    r = random.Random(3)
    words = lambda k: [r.randrange(20, fam.ordinary_hi) for _ in range(k)]
    history = fam.start + [fam.user] + words(9) + [fam.assistant] + words(6)
    boundary = len(history)
    first = history + [fam.user] + words(7) + [fam.assistant]
    edited = history + [fam.user] + words(8) + [fam.assistant]
    e = Engine(cairn, fam.model, "--ctx", "128", env={"CAIRN_PREFIX_LOG": "1"})
    try:
        e.generate(first, 4)
        t = e.generate(edited, 4)
    finally:
        e.close()
    kinds = [k for _, _, _, k in e.prefix_log()]
    assert kinds == ["reset", "checkpoint" if fam.extend_only else "truncate"]
    assert t.reuse >= boundary if not fam.extend_only else t.reuse == boundary
    assert t.ids == cold(cairn, fam.model, ids=edited, max_tokens=4, args=("--ctx", "128")).ids


def test_interface_shape(cairn, family_model):
    """The conformance checks: jsonl rows of `cairn run`, and two engine turns."""
    ids = prompt_of(family_model, 21, 4)
    p = run(cairn, family_model.model, "--prompt-ids", ids_arg(ids), "-n", 4, "--temperature", 0,
            "--top-logprobs", 5, "--format", "jsonl")
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(rows) == 4
    for x in rows:
        assert isinstance(x["id"], int) and isinstance(x["text"], str) and isinstance(x["logprob"], (int, float))
        assert len(x["top"]) == 5 and all({"id", "logprob"} <= set(t) for t in x["top"])
        assert x["top"][0]["id"] == x["id"]
    e = Engine(cairn, family_model.model)
    try:
        t1 = e.generate(ids, 4)
        assert t1.error is None and len(t1.ids) == 4 and t1.accept == len(ids)
        t2 = e.generate(ids + t1.ids + prompt_of(family_model, 3 + len(family_model.start), 5)[-3:], 4)
        assert t2.reuse == len(ids) + len(t1.ids) - 1
    finally:
        e.close()
