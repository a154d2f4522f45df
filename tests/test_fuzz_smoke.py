"""A short pass of every libFuzzer target (tests/fuzz/fuzz_*.c, built by `make fuzz-build` under
ASan + UBSan): the committed corpus replays and a few thousand mutations of it run without a
finding. `make fuzz` runs the same targets for longer (docs/reliability.md has the counts)."""
import glob
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))
import run as fuzz  # noqa: E402

NAMES = sorted(os.path.basename(p)[len("fuzz_"):-2] for p in glob.glob(os.path.join(ROOT, "tests", "fuzz", "fuzz_*.c")))


@pytest.mark.parametrize("name", NAMES)
def test_fuzz_smoke(name):
    exe = os.path.join(fuzz.BIN, f"fuzz_{name}")
    assert os.access(exe, os.X_OK), f"{exe} not built: run make fuzz-build"
    assert os.listdir(os.path.join(ROOT, "tests", "fuzz", "corpus", name)), "no committed corpus"
    rc, execs, tail = fuzz.run(name, runs=3000, smoke=True)
    assert rc == 0, tail
    assert execs >= 3000, tail
