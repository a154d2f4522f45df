#!/usr/bin/python3
"""A scripted engine speaking the line protocol (protocol.md §1), for the gateway's tests.

`cairn serve --engine tests/fake_engine.py` runs it in place of `cairn engine`. It lets tests
produce what a tiny random model cannot: slow prefills, slow tokens, a tool call in the reply,
a crash mid-request, a slow CANCEL acknowledgement. Behaviour comes from the environment:

  FAKE_LOG=path           append one JSON line per frame received ({"cmd","id","slot","prompt","grammar",...})
  FAKE_REPLY=text         the reply (default: "w0 w1 w2 ..." one word per token)
  FAKE_TOKEN_DELAY=s      pause between DATA frames (default 0)
  FAKE_ACCEPT_DELAY=s     pause between ACCEPT and the first DATA (a long prefill)
  FAKE_CANCEL_DELAY=s     pause before acknowledging CANCEL with ERROR id CANCELLED
  FAKE_CRASH_ON=word      exit(3) after two DATA frames of a prompt containing word
  FAKE_ODD=1              also send what a newer or older engine may: telemetry and unknown frame
                          kinds (one with a payload-like look), and a DONE with only 7 fields

"Tokens" are bytes: prompt_tokens = prompt bytes, and the reuse count in DONE is the byte
length of the slot's previous prompt + reply when that is a strict prefix of the new prompt.
"""
import json
import os
import select
import sys
import time

ENV = os.environ
REPLY = ENV.get("FAKE_REPLY")
TOKEN_DELAY = float(ENV.get("FAKE_TOKEN_DELAY", "0"))
ACCEPT_DELAY = float(ENV.get("FAKE_ACCEPT_DELAY", "0"))
CANCEL_DELAY = float(ENV.get("FAKE_CANCEL_DELAY", "0"))
CRASH_ON = ENV.get("FAKE_CRASH_ON")
LOG = ENV.get("FAKE_LOG")
ODD = ENV.get("FAKE_ODD") == "1"

out = sys.stdout.buffer
inp = sys.stdin.buffer.raw
buf = b""
records = {}          # slot -> bytes the "state" holds
active = {}           # id -> request dict


def log(**kw):
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps(kw) + "\n")


def send(b):
    out.write(b)
    out.flush()


def read_more(timeout):
    global buf
    r, _, _ = select.select([inp], [], [], timeout)
    if not r:
        return True
    chunk = os.read(inp.fileno(), 65536)
    if not chunk:
        return False
    buf += chunk
    return True


def take_frame():
    """One complete frame from buf, or None."""
    global buf
    nl = buf.find(b"\n")
    if nl < 0:
        return None
    f = buf[:nl].decode(errors="replace").split()
    if f and f[0] == "BIAS" and len(f) > 2:
        need = nl + 1 + int(f[2]) + 1
        if len(buf) < need:
            return None
        payload = buf[nl + 1:nl + 1 + int(f[2])]
        buf = buf[need:]
        return f, payload, b""
    if f and f[0] == "SUBMIT":
        size = int(f[3])
        ext = int(f[7]) if len(f) > 7 and "=" not in f[7] else 0
        need = nl + 1 + size + ext + 1
        if len(buf) < need:
            return None
        payload = buf[nl + 1:nl + 1 + size]
        extension = buf[nl + 1 + size:nl + 1 + size + ext]
        buf = buf[need:]
        return f, payload, extension
    buf = buf[nl + 1:]
    return f, b"", b""


def tokens_of(text):
    if REPLY is not None:
        b = REPLY.encode()
        return [b[i:i + 3] for i in range(0, len(b), 3)]
    return [f"w{i} ".encode() for i in range(10000)]


def submit(f, payload, extension):
    """extension: the span table (untrusted=B), then the grammar (logged as text)."""
    rid, slot, max_tokens = f[1], int(f[2]), int(f[4])
    prompt = payload
    keys = dict(k.split("=", 1) for k in f if "=" in k)
    grammar = extension[int(keys.get("untrusted", 0)):].decode(errors="replace")
    log(cmd="SUBMIT", id=rid, slot=slot, max_tokens=max_tokens, header=f, prompt=prompt.decode(errors="replace"),
        grammar=grammar)
    rec = records.get(slot, b"")
    reuse = len(rec) if rec and prompt.startswith(rec) and len(prompt) > len(rec) else 0
    if ODD:
        send(b"HWINFO 2 24.0 20.0 0 0 cpu\nFUTURE_KIND " + rid.encode() + b" 5 x\nTOOL 999 3\nabc\n")
    send(f"ACCEPT {rid} {len(prompt)}\n".encode())
    active[rid] = dict(id=rid, slot=slot, prompt=prompt, toks=tokens_of(prompt)[:max_tokens], sent=0,
                       reuse=reuse, next_at=time.time() + ACCEPT_DELAY, cancel_at=None, max_tokens=max_tokens)


def finish(r, stopped=False):
    gen = b"".join(r["toks"][:r["sent"]])
    records[r["slot"]] = r["prompt"] + gen
    limited = int(r["sent"] >= r["max_tokens"] and not stopped and REPLY is None)
    if ODD:
        send(f"PROF 0.1 1 2 0 0 0 0 0 1\nDONE {r['id']} STAT {r['sent']} 100.000 0.0 0.01\n".encode())
        del active[r["id"]]
        return
    send(f"DONE {r['id']} STAT {r['sent']} 100.000 0.0 0.01 {len(r['prompt'])} {limited} {r['reuse']}\n".encode())
    del active[r["id"]]


def step():
    now = time.time()
    for r in list(active.values()):
        if r["cancel_at"] is not None:
            if now >= r["cancel_at"]:
                records[r["slot"]] = r["prompt"] + b"".join(r["toks"][:r["sent"]])
                send(f"ERROR {r['id']} CANCELLED\n".encode())
                del active[r["id"]]
            continue
        if now < r["next_at"]:
            continue
        if r["sent"] >= len(r["toks"]):
            finish(r)
            continue
        t = r["toks"][r["sent"]]
        r["sent"] += 1
        send(f"DATA {r['id']} {len(t)}\n".encode() + t + b"\n")
        if CRASH_ON and CRASH_ON.encode() in r["prompt"] and r["sent"] == 2:
            log(cmd="CRASH", id=r["id"])
            os._exit(3)
        r["next_at"] = now + TOKEN_DELAY


def main():
    log(cmd="START")
    send(b"\x01\x01READY\x01\x01\nCAPS fake=1\nSTAT 0 0.0 0.0 0.01 0 0\n")
    while True:
        if not read_more(0.005 if active else 0.2):
            while active:          # EOF: finish what is in flight, then exit
                step()
                time.sleep(0.001)
            log(cmd="EOF")
            return
        while True:
            fr = take_frame()
            if fr is None:
                break
            f, payload, extension = fr
            if not f:
                continue
            if f[0] == "SUBMIT":
                submit(f, payload, extension)
            elif f[0] == "BIAS":
                log(cmd="BIAS", id=f[1], payload=payload.decode())
            elif f[0] in ("STOP", "CANCEL") and len(f) > 1:
                log(cmd=f[0], id=f[1])
                r = active.get(f[1])
                if r is None:
                    send(f"ERROR {f[1]} NOT_FOUND\n".encode())
                elif f[0] == "STOP":
                    finish(r, stopped=True)
                else:
                    r["cancel_at"] = time.time() + CANCEL_DELAY
        step()


if __name__ == "__main__":
    main()
