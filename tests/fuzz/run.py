#!/usr/bin/python3
"""Runs the libFuzzer targets built by `make fuzz-build` (build/fuzz/fuzz_*).

Each target starts from its committed corpus (tests/fuzz/corpus/NAME, read only) plus a working
corpus in build/fuzz/corpus/NAME, niced, and is bounded by --seconds or --runs. Prints one line
per target: executions, corpus size, and the result; exits 1 if any target found a crash, a leak
or an abort (its reproducer is left in build/fuzz/). The config target gets the tiny model of
every family the tests know (tests/conftest.py)."""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import conftest  # noqa: E402

MAX_LEN = {"tokenizer_json": 8192, "safetensors": 8192, "chat": 2048}
BIN = os.path.join(ROOT, "build", "fuzz")


def targets(bin_dir=BIN):
    return sorted(os.path.basename(p)[len("fuzz_"):] for p in glob.glob(os.path.join(bin_dir, "fuzz_*"))
                  if os.access(p, os.X_OK))


def run(name, seconds=None, runs=None, smoke=False, bin_dir=BIN):
    """(returncode, executions, log tail) of one bounded run."""
    work = os.path.join(ROOT, "build", "fuzz", "corpus", name)
    os.makedirs(work, exist_ok=True)
    seeds = os.path.join(ROOT, "tests", "fuzz", "corpus", name)
    # Targets that write files (safetensors, persist) do it under TMPDIR: tmpfs keeps fsync cheap.
    env = dict(os.environ, CAIRN_FUZZ_MODELS=":".join(conftest.make_model(f["name"]) for f in conftest.FAMILIES),
               ASAN_OPTIONS="detect_leaks=1:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
               TMPDIR=os.environ.get("TMPDIR", "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"))
    cmd = ["nice", "-n", "19", os.path.join(bin_dir, f"fuzz_{name}"), "-print_final_stats=1",
           f"-max_len={MAX_LEN.get(name, 4096)}", f"-artifact_prefix={os.path.join(ROOT, 'build', 'fuzz', name)}-"]
    if seconds:
        cmd.append(f"-max_total_time={seconds}")
    if runs:
        cmd.append(f"-runs={runs}")
    # libFuzzer adds new inputs to the first directory: never the committed one. A smoke run
    # gets a throwaway one, so it replays and mutates exactly the committed seeds.
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "build", "fuzz")) as scratch:
        r = subprocess.run(cmd + [scratch if smoke else work, seeds], cwd=ROOT, env=env, capture_output=True, text=True)
    m = re.search(r"stat::number_of_executed_units:\s*(\d+)", r.stderr)
    return r.returncode, int(m.group(1)) if m else 0, r.stderr[-6000:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, help="time box per target")
    ap.add_argument("--runs", type=int, help="executions per target")
    ap.add_argument("--bin", default=BIN, help="directory of the fuzz binaries (default build/fuzz)")
    ap.add_argument("targets", nargs="*", help="default: every built target")
    a = ap.parse_args()
    if not a.seconds and not a.runs:
        ap.error("give --seconds or --runs")
    bad = 0
    for name in a.targets or targets(a.bin):
        rc, execs, tail = run(name, a.seconds, a.runs, bin_dir=a.bin)
        corpus = len(os.listdir(os.path.join(ROOT, "build", "fuzz", "corpus", name)))
        print(f"fuzz_{name}: {execs} executions, working corpus {corpus}, {'ok' if rc == 0 else 'FINDING'}", flush=True)
        if rc:
            print(tail)
            bad = 1
    sys.exit(bad)


if __name__ == "__main__":
    main()
