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


def make_model(family, size="tiny", seed=1234):
    out = os.path.join(ROOT, "build", "models", f"{family}-{size}-{seed}")
    gen = os.path.join(ROOT, "tools", f"tiny_{'glm' if family.startswith('glm') else family}.py")
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


# ---- one fixture for tests that must hold on every family ------------------------------------

FAMILIES = ("deepseek_v4", "glm", "inkling")


class Family:
    """A tiny model of one family and what protocol-level tests need to know about it.

    extend_only: the family's state has parts that cannot rewind (DeepSeek V4: the sliding-window
    ring and the compressor/indexer running partials; Inkling: the sliding-window ring and the
    short-conv windows), so anything but a strict extension of the slot's record needs a checkpoint. GLM keeps only per-position rows (MLA latents, indexer
    keys), so it truncates to any common prefix (src/state/state.h, reuse.h)."""

    def __init__(self, name, model):
        self.name = name
        self.model = model
        self.extend_only = name in ("deepseek_v4", "inkling")
        added = json.load(open(os.path.join(model, "tokenizer.json")))["added_tokens"]
        self.token = {a["content"]: a["id"] for a in added}
        # Ordinary (non-special) ids for synthetic prompts: from 20 up to the first special token
        # above it (GLM's specials sit at the top of its tiny vocab, DeepSeek V4's at the bottom).
        self.ordinary_hi = min([1000] + [a["id"] for a in added if a["id"] >= 20])
        if name == "deepseek_v4":
            self.start = [self.token["<｜begin▁of▁sentence｜>"]]
            self.user, self.assistant = self.token["<｜User｜>"], self.token["<｜Assistant｜>"]
        elif name == "inkling":
            self.start = []                  # no token opens an Inkling conversation
            self.user, self.assistant = self.token["<|message_user|>"], self.token["<|message_model|>"]
        else:
            self.start = [self.token["[gMASK]"], self.token["<sop>"]]
            self.user, self.assistant = self.token["<|user|>"], self.token["<|assistant|>"]

    def __repr__(self):
        return self.name


@pytest.fixture(scope="session", params=FAMILIES)
def family_model(request):
    return Family(request.param, make_model(request.param))
