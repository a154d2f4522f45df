"""Shared pytest fixtures: the binary, and tiny models generated once per checkout.

Models are written by tools/make_tiny.py into build/models/<family>-<size>-<seed> and reused
by later runs (regenerated when the generator script is newer than the model)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"
CAIRN = os.path.join(ROOT, "build", "cairn")
sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
from refmath import top_indices  # noqa: E402  (the references' own order; references never share with the engine)


def registry():
    """Every registered family as `cairn families` describes it (src/models/families.c)."""
    assert os.path.exists(CAIRN), "build/cairn missing: run make"
    return json.loads(subprocess.run([CAIRN, "families"], check=True, capture_output=True, text=True).stdout)


def make_model(family, size="tiny", seed=1234):
    out = os.path.join(ROOT, "build", "models", f"{family}-{size}-{seed}")
    gen = os.path.join(ROOT, "tools", f"tiny_{family}.py")
    stamp = os.path.join(out, "config.json")
    if not os.path.exists(stamp) or os.path.getmtime(stamp) < os.path.getmtime(gen):
        subprocess.run([PYTHON, os.path.join(ROOT, "tools", "make_tiny.py"), family, out,
                        "--size", size, "--seed", str(seed)], check=True)
    return out


@pytest.fixture(scope="session")
def cairn():
    assert os.path.exists(CAIRN), "build/cairn missing: run make"
    return CAIRN


@pytest.fixture(scope="session")
def tiny_dsv4():
    return make_model("deepseek_v4")


@pytest.fixture(scope="session")
def tiny_glm():
    return make_model("glm")


@pytest.fixture(scope="session")
def tiny_kimi_k3():
    return make_model("kimi_k3")


# ---- running cairn against a float64 reference (tests/test_*_ref.py) ---------------------------

def echo(cairn, model, ids, numerics="exact", extra=()):
    """cairn's next-token top-5 log-probs at every prompt position: ([[(id, logprob)...]...], stdout)."""
    r = subprocess.run([cairn, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "0",
                        "--numerics", numerics, "--echo-logprobs", "5", *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"pos"')]
    assert [row["pos"] for row in rows] == list(range(len(ids))), r.stdout[:500]
    return [[(t["id"], t["logprob"]) for t in row["top"]] for row in rows], r.stdout


def assert_agrees(got, lp):
    """cairn's rows (echo) against reference log-probs lp[pos][id]: the same top-1 at every
    position, every reported log-prob within 0.002."""
    for pos, (row, want) in enumerate(zip(got, lp)):
        best = top_indices(want, 6)
        assert row[0][0] == best[0], f"pos {pos}: top-1 {row[0][0]} != reference {best[0]}"
        for tid, val in row:
            assert abs(val - want[tid]) <= 0.002, f"pos {pos} id {tid}: {val} vs reference {want[tid]}"


# ---- one fixture for tests that must hold on every family ------------------------------------

# Taken from the registry, so a family registered in src/models/families.c is tested here
# without naming it; the descriptor (`cairn families`) supplies what the tests need to know.
FAMILIES = registry()


class Family:
    """A tiny model of one family and what protocol-level tests need to know about it, all from
    its descriptor.

    extend_only: the family's state has parts that cannot rewind (e.g. a sliding-window ring or
    running compressor partials), so anything but a strict extension of the slot's record needs
    a checkpoint; a rows-only state (descriptor `truncates`) truncates to any common prefix
    (src/state/state.h, reuse.h)."""

    def __init__(self, desc, model):
        self.desc = desc
        self.name = desc["name"]
        self.model = model
        self.extend_only = not desc["truncates"]
        added = json.load(open(os.path.join(model, "tokenizer.json")))["added_tokens"]
        self.token = {a["content"]: a["id"] for a in added}
        # Ordinary (non-special) ids for synthetic prompts: from 20 up to the first special token
        # above it (some tiny vocabs keep their specials at the top, others at the bottom).
        self.ordinary_hi = min([1000] + [a["id"] for a in added if a["id"] >= 20])
        turns = desc["turns"]
        self.start = [self.token[t] for t in turns["start"]]
        self.user, self.assistant = self.token[turns["user"]], self.token[turns["assistant"]]

    def __repr__(self):
        return self.name


@pytest.fixture(scope="session", params=FAMILIES, ids=[f["name"] for f in FAMILIES])
def family_model(request):
    return Family(request.param, make_model(request.param["name"]))
