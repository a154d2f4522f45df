"""Shared pytest fixtures: the binary, and tiny models generated once per checkout.

Models are written by tools/make_tiny.py into build/models/<family>-<size>-<seed> and reused
by later runs (regenerated when the generator script is newer than the model)."""
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
