"""Runs every C unit-test program (tests/c/test_*.c, built into build/tests/ and, for the
portable scalar build, build/portable/tests/) as one pytest case each, and the kernel test built
for the SIMD paths the native build does not select (make kernel-variants)."""
import glob
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = sorted(os.path.basename(p)[:-2] for p in glob.glob(os.path.join(ROOT, "tests", "c", "test_*.c")))


@pytest.mark.parametrize("build", ["build", "build/portable"])
@pytest.mark.parametrize("name", NAMES)
def test_c_program(build, name):
    exe = os.path.join(ROOT, build, "tests", name)
    assert os.path.exists(exe), f"{exe} not built"
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


@pytest.mark.parametrize("variant", ["avx2", "avx512-nogfni"])
def test_kernel_variant(variant):
    exe = os.path.join(ROOT, "build", "kernel-variants", variant, "test_kernels")
    assert os.path.exists(exe), f"{exe} not built (make kernel-variants)"
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
