"""Expert parallelism over MPI (docs/scale.md, src/core/experts.h, src/core/cluster.h):
build/mpi/cairn under `mpirun -np 2` on this machine, on the tiny model of every family.

Rank 0 runs everything but the routed experts of odd id (expert e belongs to rank e % 2); per MoE
layer their rows go to rank 1 and one output row per (slot, expert) comes back. The tests hold
that output to the single-process engine (build/cairn, no MPI linked) bit for bit — prefill in
uneven chunks and decode, a warm second turn against a cold engine — and that the counters of
both ranks agree that rank 1 actually ran experts: what rank 0 sent is what rank 1 served. `cairn
serve` runs such an engine the documented way, through an --engine script exec'ing mpirun."""
import os
import random
import re
import subprocess

import pytest

from conftest import ROOT
from engine_client import Engine, cold

MPI_CAIRN = os.path.join(ROOT, "build", "mpi", "cairn")
PROMPT = "3,17,5,29,11,2,23,7,19,13,31,37,41,43,47,53,59"
# Loopback only: shared memory between the ranks (vader) and self; no binding of ranks to cores,
# which would pin the other engineers' and tests' threads out of the cores the ranks took.
MPI_ENV = {"OMPI_MCA_btl": "self,vader", "OMPI_MCA_hwloc_base_binding_policy": "none",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
SENT = re.compile(r"expert-parallel: ranks=(\d+) (.*)")
SERVED = re.compile(r"expert-parallel: rank=(\d+) of (\d+) (.*)")


def mpirun(np):
    assert os.path.exists(MPI_CAIRN), "build/mpi/cairn missing: run make mpi (make test builds it)"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "--oversubscribe", "-np", str(np), MPI_CAIRN]


@pytest.fixture(autouse=True)
def mpi_env(monkeypatch):
    for k, v in MPI_ENV.items():
        monkeypatch.setenv(k, v)


def fields(text):
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split())}


def counters(stderr, np):
    """Rank 0's line and every other rank's, checked against each other."""
    sent = SENT.search(stderr)
    assert sent and int(sent.group(1)) == np, "no rank 0 expert-parallel line:\n" + stderr[-3000:]
    s = fields(sent.group(2))
    served = [fields(m.group(3)) for m in SERVED.finditer(stderr)]
    assert len(served) == np - 1, stderr[-3000:]
    assert s["remote_experts"] > 0 and s["remote_rows"] >= s["remote_experts"]
    assert s["bytes_sent"] > 0 and s["bytes_received"] > 0 and s["messages"] % 2 == 0
    # every expert and row rank 0 sent away was run by the rank that owns it, and nothing else
    assert sum(r["served_experts"] for r in served) == s["remote_experts"]
    assert sum(r["served_rows"] for r in served) == s["remote_rows"]
    assert sum(r["served_requests"] for r in served) == s["messages"] // 2
    assert all(r["served_experts"] > 0 for r in served)
    return s


def generate(cmd, model, *extra):
    """Greedy prompt (prefilled in chunks of 5 and 1) + decode, every step's top logprobs."""
    r = subprocess.run([*cmd, "run", "-m", model, "--prompt-ids", PROMPT, "-n", "10", "--temperature", "0",
                        "--format", "jsonl", "--top-logprobs", "4", "--prefill-chunks", "5,1", *extra],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count('"top"') >= 10, r.stdout[-2000:]
    return r


def test_two_ranks_are_bit_identical_to_one_process(cairn, family_model):
    one = generate([cairn], family_model.model)
    two = generate(mpirun(2), family_model.model)
    assert two.stdout == one.stdout
    assert "expert-parallel" not in one.stderr
    s = counters(two.stderr, 2)
    # the requests carried input rows of the model's width (and DeepSeek V4's route weights)
    assert s["bytes_sent"] >= 4 * s["remote_rows"] * 8


def test_three_ranks_and_the_expert_cache(cairn, tiny_dsv4, tiny_glm):
    """Three ranks (experts e % 3) with every rank reading its experts through the expert cache:
    still the single process's bytes."""
    for model in (tiny_dsv4, tiny_glm):
        one = generate([cairn], model)
        three = generate(mpirun(3), model, "--expert-cache-mb", "4")
        assert three.stdout == one.stdout
        counters(three.stderr, 3)
        assert "expert-cache:" in three.stderr


def test_warm_turn_over_mpi_equals_cold_single_process(cairn, family_model):
    r = random.Random(7)
    words = lambda n: [r.randrange(20, family_model.ordinary_hi) for _ in range(n)]
    e = Engine(mpirun(2), family_model.model, "--ctx", "256")
    try:
        prompt = words(14)
        t1 = e.generate(prompt, 6)
        assert t1.reuse == 0 and len(t1.ids) == t1.completion > 0
        turn2 = prompt + t1.ids + words(6)
        t2 = e.generate(turn2, 6)
        assert t2.reuse == len(prompt) + len(t1.fed())      # warm: only the new tail was prefilled
    finally:
        assert e.close() == 0
    counters(e.read_stderr(), 2)
    ref = cold(cairn, family_model.model, ids=turn2, max_tokens=6, args=("--ctx", "256"))
    assert ref.reuse == 0 and t2.ids == ref.ids and t2.text == ref.text


def test_serve_is_refused_under_mpirun(tiny_glm):
    r = subprocess.run([*mpirun(2), "serve", "-m", tiny_glm], capture_output=True, text=True)
    assert r.returncode != 0 and "does not run across MPI ranks" in r.stderr


def test_serve_through_an_mpirun_engine(cairn, tiny_glm, tmp_path):
    """The documented way to serve across ranks (docs/scale.md): `cairn serve --engine SCRIPT`, the
    script exec'ing mpirun on build/mpi/cairn with the engine arguments serve passes. Two turns on
    one slot answer what a single-process server answers (the second reusing the first), and at
    exit rank 0 reports experts it sent to rank 1."""
    from test_http_robustness import Server
    script = tmp_path / "mpi-engine"
    script.write_text("#!/bin/sh\nexec " + " ".join(mpirun(2)) + ' "$@"\n')
    script.chmod(0o755)
    replies = {}
    for name, args in (("one", ()), ("mpi", ("--engine", str(script)))):
        srv = Server(tiny_glm, str(tmp_path), args)
        try:
            msgs, out = [], []
            for text in ("Hello there", "And again"):
                msgs.append({"role": "user", "content": text})
                st, _, r = srv.json("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 8,
                                                                     "temperature": 0, "user": "u1"})
                assert st == 200, r
                msgs.append(r["choices"][0]["message"])
                out.append((r["choices"][0]["message"]["content"], r["usage"]))
        finally:
            srv.stop()
        replies[name] = out
    assert replies["mpi"] == replies["one"] and all(text for text, _ in replies["one"]), replies
    assert replies["mpi"][1][1]["prompt_tokens_details"]["cached_tokens"] > 0, replies["mpi"]
    with open(srv.log_path) as f:
        log = f.read()
    sent = SENT.search(log)
    assert sent and fields(sent.group(2))["remote_experts"] > 0, log[-3000:]
