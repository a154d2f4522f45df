"""--mlock (models/model.h model_mlock): the dense, shared and lookup weights of the tensor table
are locked in memory — the kernel's own count (VmLck in /proc/PID/status) equals the bytes the
engine reports — output does not change, and a RLIMIT_MEMLOCK too small is refused with a message
naming the limit while the run goes on unlocked."""
import json
import os
import re
import subprocess

from engine_client import Engine

PROMPT = "3,17,5,29,11,2,23,7,19,13"
LOCKED = re.compile(r"--mlock: locked (\d+) bytes of dense weights")


def run(cairn, model, *extra, prefix=()):
    r = subprocess.run([*prefix, cairn, "run", "-m", model, "--prompt-ids", PROMPT, "-n", "6", "--temperature", "0",
                        "--format", "jsonl", "--top-logprobs", "3", *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def locked_bytes(stderr):
    m = re.search(r"locked_bytes=(\d+)", stderr)
    assert m, stderr[-2000:]
    return int(m.group(1))


def vm_lck(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmLck:\s+(\d+) kB", f.read()).group(1)) * 1024


def test_locks_dense_weights_and_changes_nothing(cairn, family_model):
    model = family_model.model
    plain, locked = run(cairn, model), run(cairn, model, "--mlock")
    assert locked.stdout == plain.stdout
    assert locked_bytes(plain.stderr) == 0
    n = locked_bytes(locked.stderr)
    assert n > 0 and n % os.sysconf("SC_PAGE_SIZE") == 0 and int(LOCKED.search(locked.stderr).group(1)) == n
    # the dense weights are part of the checkpoint, not all of it: routed experts stay unlocked
    shards = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model) if f.endswith(".safetensors"))
    assert n < shards + os.sysconf("SC_PAGE_SIZE") * 64


def test_engine_lock_is_the_kernels_count(cairn, tiny_dsv4):
    e = Engine(cairn, tiny_dsv4, "--ctx", "64", "--mlock")
    try:
        held = vm_lck(e.p.pid)
        assert e.generate(ids=[5, 6, 7], max_tokens=3).completion > 0
    finally:
        assert e.close() == 0
    assert held > 0 and held == int(LOCKED.search(e.read_stderr()).group(1))


def test_memlock_limit_is_refused_by_name(cairn, tiny_glm):
    # root's CAP_IPC_LOCK ignores the limit: drop it from the bounding set so the limit applies
    prefix = (["setpriv", "--bounding-set=-ipc_lock"] if os.geteuid() == 0 else []) + ["prlimit", "--memlock=65536:65536"]
    plain = run(cairn, tiny_glm)
    r = run(cairn, tiny_glm, "--mlock", prefix=prefix)
    assert "--mlock: not locked:" in r.stderr and "RLIMIT_MEMLOCK allows 65536" in r.stderr, r.stderr[-2000:]
    assert locked_bytes(r.stderr) == 0 and r.stdout == plain.stdout


def test_bench_json_reports_locked_bytes(cairn, tiny_glm):
    r = subprocess.run([cairn, "bench", "-m", tiny_glm, "--prompt", "4", "--decode", "4", "--mlock", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["mlocked_bytes"] == int(LOCKED.search(r.stderr).group(1)) > 0
