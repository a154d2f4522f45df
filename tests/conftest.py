"""Shared pytest fixtures: the binary, and tiny models generated once per checkout.

Models are written by tools/make_tiny.py into build/models/<family>-<size>-<seed> and reused
by later runs (regenerated when the generator script is newer than the model)."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"
CAIRN = os.path.join(ROOT, "build", "cairn")


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
