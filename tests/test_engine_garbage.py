"""Garbage on the engine's stdin never crashes it: random bytes, over-long headers, negative and
absurd sizes, mutated frames and payloads cut short by EOF. The engine answers what it can with
well-formed ERROR frames, keeps serving, and exits 0 at EOF. Every case runs on the tiny model of
each family (fixture family_model): the frame reader is shared, but what a family does with the
prompts that get through (and with the state they leave) is not."""
import random

import pytest

from engine_client import Engine

CODES = {"BAD_FRAME", "BAD_REQUEST", "SLOT_BUSY", "DUPLICATE_ID", "EMPTY_PROMPT", "NOT_FOUND", "CANCELLED",
         "CONTEXT_EXCEEDED", "ENGINE_ERROR"}
KINDS = {"ACCEPT", "DATA", "DONE", "ERROR"}


@pytest.fixture
def engine(cairn, family_model):
    e = Engine(cairn, family_model.model, "--ctx", "128")
    yield e
    e.kill()


def valid_request(e, rid):
    """A request after the garbage must be served normally."""
    rep = e.submit(rid, ids=[0, 100, 200, 300], max_tokens=3)
    e.collect(rid)
    assert rep.done is not None and rep.completion >= 1, rep.error
    return rep


def read_error(e):
    f, _ = e.frame()
    assert f[0] == "ERROR" and len(f) >= 3 and f[2] in CODES, f
    return f


def test_random_bytes(engine):
    rng = random.Random(7)
    for _ in range(5):
        junk = bytes(rng.randrange(256) for _ in range(20000)).replace(b"SUBMIT", b"xUBMIT").replace(b"IMAGE", b"xMAGE")
        engine.send(junk + b"\n")
    engine.send(b"\n")
    # whatever the junk produced, every frame before our request is a well-formed ERROR
    rep = engine.submit("after", ids=[0, 1, 2, 3, 4], max_tokens=2)
    while not rep.finished:
        f, data = engine.frame()
        assert f and f[0] in KINDS, f
        if f[0] == "ERROR":
            assert f[2] in CODES, f
        engine.route(f, data)
    assert rep.done is not None
    assert engine.close() == 0


def test_huge_headers(engine):
    engine.send(b"A" * 100000 + b"\n")
    assert read_error(engine)[1:3] == ["0", "BAD_REQUEST"]
    engine.send(b"SUBMIT " + b"1 " * 5000 + b"\nSTOP x\n")
    assert read_error(engine)[2] == "BAD_REQUEST"
    assert read_error(engine) == ["ERROR", "x", "NOT_FOUND"]      # in sync again
    valid_request(engine, "v1")
    assert engine.close() == 0


def test_negative_and_absurd_sizes(engine):
    # sizes that cannot be trusted: the frame is header-only, the next line is read as a header
    for header in (b"SUBMIT n 0 -5 1 0 1", b"SUBMIT h 0 99999999999999999999999 1 0 1", b"SUBMIT e 0 5 1 0 1 -3",
                   b"IMAGE i -1 1 1", b"SUBMIT big 0 16777217 1 0 1"):
        engine.send(header + b"\nSTOP sync\n")
        f = read_error(engine)
        assert f[2] == "BAD_REQUEST", (header, f)
        assert read_error(engine) == ["ERROR", "sync", "NOT_FOUND"], header
    # sizes that parse: the announced payload is consumed even though the header is refused
    for header in (b"SUBMIT m 0 3 -1 0 1", b"SUBMIT s 0 3 1 0 1 0 -7"):
        engine.send(header + b"\nabc\nSTOP sync\n")
        assert read_error(engine)[2] == "BAD_REQUEST", header
        assert read_error(engine) == ["ERROR", "sync", "NOT_FOUND"], header
    valid_request(engine, "v2")
    assert engine.close() == 0


def test_nul_and_control_bytes(engine):
    engine.send(b"SUBMIT a\x00b 0 2 1 0 1\nhi\nSTOP sync\n")
    assert read_error(engine)[2] == "BAD_REQUEST"
    assert read_error(engine) == ["ERROR", "sync", "NOT_FOUND"]
    nul = engine.submit("nul", text="\x00\x00\x00", max_tokens=1, logprobs=0)   # a NUL-only text prompt
    engine.collect("nul")
    assert nul.done is not None or nul.error.split()[0] in CODES
    valid_request(engine, "v3")
    assert engine.close() == 0


def test_mutated_frames_never_crash(engine):
    rng = random.Random(11)
    good = b"SUBMIT q 0 11 3 0.5 0.9 0 logprobs=2 ids=1\n0 10 20 300\n"
    for _ in range(300):
        b = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        engine.send(bytes(b))
    # EOF: whatever is pending is answered or dropped, and the engine exits cleanly
    assert engine.close() == 0, engine.read_stderr()[-2000:]
    assert "Sanitizer" not in engine.read_stderr()


def test_truncated_payload_at_eof(engine):
    engine.send(b"SUBMIT t 0 100 1 0 1\nabc")
    assert engine.close() == 0
    assert engine.last_frames == [["ERROR", "t", "BAD_FRAME", "input", "ended", "inside", "a", "frame"]]
