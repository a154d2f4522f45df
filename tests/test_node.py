"""Runs the node tests (tests/node/*.test.mjs: the official `openai` and `@anthropic-ai/sdk`
clients against live `cairn serve` processes on the tiny model) under `node --test`, one pytest
case per file and family (fixture family_model; the files read the family from the model's
config.json), and fails with node's own output when node reports a failure."""
import glob
import os
import re
import signal
import subprocess

import pytest

from conftest import CAIRN, ROOT

NODE_DIR = os.path.join(ROOT, "tests", "node")
# Only catches a hung file; structured.test.mjs (3 200 constrained generations) ran past 900 s on
# the tiny K3 model on a 2-core machine at load 8-14.
TIMEOUT = 2400
FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(NODE_DIR, "*.test.mjs")))


@pytest.mark.parametrize("name", FILES)
def test_node_file(name, cairn, family_model):
    env = dict(os.environ, CAIRN=CAIRN, CAIRN_MODEL=family_model.model, FAKE_ENGINE=os.path.join(ROOT, "tests", "fake_engine.py"))
    # node runs in its own process group: on a timeout the whole group goes, the `cairn serve` and
    # engine processes the file started included (killing node alone left them running).
    p = subprocess.Popen(["node", "--test", "--test-reporter=spec", name], cwd=NODE_DIR, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        pytest.fail(f"{name} did not finish in {TIMEOUT} s:\n" + (stdout + stderr)[-12000:])
    out = stdout + stderr
    passed = re.search(r"^\S*\s*pass (\d+)", out, re.M)
    failed = re.search(r"^\S*\s*fail (\d+)", out, re.M)
    assert p.returncode == 0 and failed and failed.group(1) == "0", out[-12000:]
    assert passed and int(passed.group(1)) > 0, "node ran no test:\n" + out[-4000:]
