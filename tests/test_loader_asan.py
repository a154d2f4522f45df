"""The loader's corrupt-file and config tests under AddressSanitizer + UBSan.

`make asan` builds every object and test with -fsanitize=address,undefined into build/asan; the
loader tests then feed it truncated and lying files, so any out-of-bounds read shows up as a
sanitizer report even when the test's own checks pass."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASAN_TESTS = os.path.join(ROOT, "build", "asan", "tests")
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")


@pytest.fixture(scope="module")
def asan_build():
    r = subprocess.run(["make", "-j2", "asan"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "make asan failed:\n" + r.stdout[-3000:] + r.stderr[-3000:]
    return ASAN_TESTS


@pytest.mark.parametrize("name", ["test_safetensors", "test_config"])
def test_loader_under_sanitizers(asan_build, name):
    exe = os.path.join(asan_build, name)
    assert os.path.exists(exe), f"{exe} was not built"
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    r = subprocess.run([exe], capture_output=True, text=True, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{name} failed under sanitizers:\n{out[-4000:]}"
    assert " 0 failed" in r.stdout, out[-2000:]
    for mark in SANITIZER_MARKS:
        assert mark not in out, f"{name}: sanitizer report:\n{out[-4000:]}"
