"""A pytest-side client of the engine line protocol (protocol.md §1) for `build/cairn engine`.

Engine owns one child process. Frames for several request ids may interleave, so every frame
read is routed to its request's Reply; collect(rid) reads until that request's DONE or ERROR.
Greedy token ids are read back from the logprobs channel (top-1 of each DATA frame), so
prompts are sent as token ids (ids=1) with logprobs=5 unless a test asks otherwise.

There is no performance time limit anywhere: reads block until the engine answers or closes
stdout. HANG_GUARD only turns a deadlocked engine into a failure instead of a stuck CI run.
"""
import contextlib
import os
import re
import select
import subprocess

READY = b"\x01\x01READY\x01\x01\n"
HANG_GUARD = 120.0
PAYLOAD_FRAMES = {"DATA", "ECHO", "TOOL"}


class Reply:
    def __init__(self, rid):
        self.rid = rid
        self.accept = None      # prompt_tokens from ACCEPT
        self.ids = []           # greedy ids (top-1 of each logprobs DATA frame)
        self.toks = []          # sampled ids (tok= of each DATA frame, with tokids=1)
        self.text = b""
        self.lps = []           # chosen-token logprob per DATA frame with logprobs
        self.done = None        # DONE fields
        self.error = None       # ERROR text after the id, e.g. "CONTEXT_EXCEEDED 130 128"

    @property
    def finished(self):
        return self.done is not None or self.error is not None

    @property
    def reuse(self):
        """DONE id STAT completion tok/s hit% rss prompt_tokens length_limited reuse prefill_us"""
        return int(self.done[9]) if self.done and len(self.done) > 9 else None

    @property
    def prefill_us(self):
        return int(self.done[10]) if self.done and len(self.done) > 10 else None

    @property
    def completion(self):
        return int(self.done[3])

    @property
    def prompt_tokens(self):
        return int(self.done[7])

    @property
    def length_limited(self):
        return self.done[8] == "1"

    def fed(self, stopped=False):
        """Generated tokens that entered the state. The last emitted token is fed only if
        generation went on, i.e. when an EOS (never emitted) ended the reply; max_tokens, STOP
        and CANCEL leave it unfed."""
        eos = not stopped and self.done is not None and not self.length_limited
        return self.ids if eos else self.ids[:-1]


class Engine:
    """cairn: the binary, or a command line that ends with it (e.g. mpirun ... build/mpi/cairn)."""
    def __init__(self, cairn, model, *args, env=None):
        e = dict(os.environ)
        e.update(env or {})
        cmd = list(cairn) if isinstance(cairn, (list, tuple)) else [cairn]
        self.p = subprocess.Popen([*cmd, "engine", "-m", model, *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, bufsize=0)
        self.buf = b""
        self.replies = {}
        self.stderr = b""
        self.banner = self._read_until(READY)
        self.caps = self.line()
        self.stat = self.caps if self.caps.startswith("STAT") else self.line()

    # ---- raw reading -------------------------------------------------------------------
    def _fill(self):
        r, _, _ = select.select([self.p.stdout], [], [], HANG_GUARD)
        if not r:
            raise TimeoutError("engine deadlocked (no output for %.0f s)" % HANG_GUARD)
        chunk = os.read(self.p.stdout.fileno(), 1 << 16)
        if not chunk:
            raise EOFError("engine closed stdout; stderr tail: " + self.read_stderr()[-2000:])
        self.buf += chunk

    def _read_until(self, token):
        while token not in self.buf:
            self._fill()
        i = self.buf.index(token) + len(token)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def line(self):
        return self._read_until(b"\n")[:-1].decode()

    def payload(self, n):
        while len(self.buf) < n + 1:
            self._fill()
        data, end, self.buf = self.buf[:n], self.buf[n:n + 1], self.buf[n + 1:]
        assert end == b"\n", "payload not followed by a newline"
        return data

    def frame(self):
        """One frame: (fields, payload bytes or None)."""
        f = self.line().split()
        data = self.payload(int(f[2])) if f and f[0] in PAYLOAD_FRAMES else None
        return f, data

    def read_stderr(self):
        if self.p.poll() is not None:
            self.stderr += self.p.stderr.read()
        return self.stderr.decode(errors="replace")

    # ---- requests ----------------------------------------------------------------------
    def send(self, raw):
        self.p.stdin.write(raw)
        self.p.stdin.flush()

    @contextlib.contextmanager
    def one_write(self):
        """Frames sent inside the block reach the engine in one write, so it reads them in one poll
        (e.g. SUBMITs that must all be active before its next step)."""
        frames = []
        self.send = frames.append
        try:
            yield
        finally:
            del self.send
        self.send(b"".join(frames))

    def submit(self, rid, ids=None, text=None, max_tokens=8, slot=0, temperature=0, top_p=1, logprobs=5,
               prefix_bytes=None, extra="", grammar=b"", ext=b""):
        """grammar: GBNF bytes, or ext: a media family's extension bytes (Inkling: DMel frames), sent as
        the SUBMIT extension payload right after the prompt (protocol.md §1.3 field 7)."""
        body = " ".join(map(str, ids)).encode() if ids is not None else text.encode()
        keys = (" ids=1" if ids is not None else "") + (f" logprobs={logprobs}" if logprobs else "") + extra
        keys += f" grammar={len(grammar)}" if grammar else ""
        ext = grammar + ext
        tail = f" {len(ext)} {prefix_bytes}" if prefix_bytes is not None else (f" {len(ext)}" if keys or ext else "")
        self.replies[rid] = Reply(rid)
        self.send(f"SUBMIT {rid} {slot} {len(body)} {max_tokens} {temperature} {top_p}{tail}{keys}\n".encode()
                  + body + ext + b"\n")
        return self.replies[rid]

    def route(self, f, data):
        rep = self.replies.get(f[1]) if len(f) > 1 else None
        if rep is None:
            return
        if f[0] == "ACCEPT":
            rep.accept = int(f[2])
        elif f[0] == "DATA":
            rep.text += data
            if f[-1].startswith("tok="):
                rep.toks.append(int(f[-1][4:]))
                f = f[:-1]
            if len(f) > 5:
                k = int(f[4])
                pairs = [(int(f[5 + 2 * j]), float(f[6 + 2 * j])) for j in range(k)]
                rep.ids.append(max(pairs, key=lambda p: p[1])[0])
                rep.lps.append(float(f[3]))
        elif f[0] == "DONE":
            rep.done = f
        elif f[0] == "ERROR":
            rep.error = " ".join(f[2:])

    def pump(self):
        """Read and route one frame; returns it."""
        f, data = self.frame()
        self.route(f, data)
        return f, data

    def collect(self, rid):
        rep = self.replies[rid]
        while not rep.finished:
            self.pump()
        return rep

    def generate(self, ids=None, max_tokens=8, text=None, **kw):
        rid = "r%d" % (len(self.replies) + 1)
        self.submit(rid, ids=ids, text=text, max_tokens=max_tokens, **kw)
        return self.collect(rid)

    def close(self):
        """EOF on stdin = graceful shutdown. Returns the exit code."""
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        self.buf += self.p.stdout.read()
        rc = self.p.wait(timeout=HANG_GUARD)
        self.stderr += self.p.stderr.read()
        self.last_frames = []
        while self.buf:                  # route what the engine said while shutting down
            self.last_frames.append(self.pump()[0])
        return rc

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def prefix_log(self):
        """After close(), with CAIRN_PREFIX_LOG=1: the engine's reuse decisions, one per request in
        order, as (slot, reused, prompt tokens, kind)."""
        out = []
        for line in self.read_stderr().splitlines():
            m = re.fullmatch(r"prefix: slot (\d+) reused (\d+)/(\d+) \((\w+)\)", line)
            if m:
                out.append((int(m[1]), int(m[2]), int(m[3]), m[4]))
        return out


def cold(cairn, model, ids=None, max_tokens=8, text=None, args=(), **kw):
    """The reference for every warm result: a freshly started engine."""
    e = Engine(cairn, model, *args)
    try:
        return e.generate(ids=ids, text=text, max_tokens=max_tokens, **kw)
    finally:
        e.close()


def lcp(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def expected_reuse(family, record, prompt, checkpoints=()):
    """The reuse decision of src/state/reuse.h for one slot without donors: (reused, kind).
    record: the ids the slot's state holds; checkpoints: positions along that record where a
    checkpoint was taken (only an extend-only family ever needs one here)."""
    u = min(lcp(record, prompt), len(prompt) - 1)
    if u > 0 and u == len(record):
        return u, "extend"
    if u > 0 and not family.extend_only:
        return u, "truncate"
    c = max([c for c in checkpoints if 0 < c <= u], default=0)
    return (c, "checkpoint") if c else (0, "reset")
