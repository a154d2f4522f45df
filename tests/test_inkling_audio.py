"""Audio input end to end over HTTP on the tiny Inkling model: an OpenAI `input_audio` part (base64
WAV or PCM16) is turned into DMel frames in the gateway, rendered as that many audio placeholders,
and fed through the audio embedding: the first token's log-prob equals the float64 reference fed
the numpy reference's DMel frames of the same clip. A turn with audio taints the slot's state, so
the next turn reuses nothing past the first placeholder and still equals a cold server. Bad audio
is a 400 naming the field and what is wrong, and leaves the server serving; a family without audio
input refuses the part instead of ignoring it."""
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import wave

import numpy as np
import pytest

from conftest import ROOT, make_model
from test_http_robustness import Server

sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
import dmel as dmel_ref  # noqa: E402
import inkling as ref  # noqa: E402

ENCODE = os.path.join(ROOT, "build", "tests", "tool_chat_encode")


def clip(seed, seconds=0.3, rate=16000):
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    x = 0.4 * np.sin(2 * np.pi * (200 + 300 * seed) * t) + 0.05 * rng.standard_normal(len(t))
    return np.round(np.clip(x, -1, 1) * 32767).astype("<i2")


def wav(samples, rate=16000):
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def audio_part(data, fmt="wav"):
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


@pytest.fixture(scope="module")
def tiny():
    return make_model("inkling")


@pytest.fixture
def server(tiny, tmp_path):
    s = Server(tiny, str(tmp_path), ["--slots", "1", "--numerics", "exact", "--kv-dir", str(tmp_path / "kv")])
    yield s
    s.stop()


def chat(s, messages, **kw):
    model = s.json("GET", "/v1/models")[2]["data"][0]["id"]
    body = {"model": model, "messages": messages, "max_tokens": 3, "temperature": 0, "logprobs": True, **kw}
    return s.json("POST", "/v1/chat/completions", body)


def first_logprob(r):
    return r["choices"][0]["logprobs"]["content"][0]


def test_audio_reply_matches_reference(server, tiny, tmp_path):
    samples = clip(1)
    messages = [{"role": "user", "content": [audio_part(wav(samples)), {"type": "text", "text": "What was said?"}]}]
    st, _, r = chat(server, messages)
    assert st == 200, r
    frames = dmel_ref.dmel(samples / 32768.0)
    assert len(frames) == -(-len(samples) // 800)
    # the ids the gateway's prompt encodes to, with the clip's frame count in the template
    case = [{"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"dmel_frames": len(frames)}},
                                                        {"type": "text", "text": "What was said?"}]}]}]
    (tmp_path / "c.json").write_text(json.dumps(case))
    out = subprocess.run([ENCODE, tiny, str(tmp_path / "c.json")], capture_output=True, text=True, check=True)
    ids = json.loads(out.stdout)[0]["ids"]
    cfg, w = ref.load(tiny)
    assert ids.count(cfg["audio_token_id"]) == len(frames)
    lp = ref.log_softmax(ref.forward(cfg, w, ids, frames))[-1]
    got = first_logprob(r)
    tok = int(ref.top_indices(lp, 1)[0])
    assert abs(got["logprob"] - lp[tok]) <= 0.002, (got, lp[tok])
    # another clip of the same length renders the same text but must give other log-probs
    other = [{"role": "user", "content": [audio_part(wav(clip(2))), {"type": "text", "text": "What was said?"}]}]
    st, _, r2 = chat(server, other)
    assert st == 200 and first_logprob(r2)["logprob"] != got["logprob"]


def test_turn_after_audio_is_exact_and_reuses_nothing_past_it(server, tiny, tmp_path):
    turn1 = [{"role": "system", "content": "You transcribe."},
             {"role": "user", "content": [audio_part(wav(clip(3))), {"type": "text", "text": "Transcribe."}]}]
    st, _, r1 = chat(server, turn1)
    assert st == 200, r1
    turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"] or ""},
                     {"role": "user", "content": "And again, shorter."}]
    st, _, r2 = chat(server, turn2)
    assert st == 200, r2
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the state was tainted by the audio: at most the system prompt (before the first placeholder) is reused
    case = [{"messages": turn1[:1] + [{"role": "user", "content": "x"}]}]
    (tmp_path / "c.json").write_text(json.dumps(case))
    out = subprocess.run([ENCODE, tiny, str(tmp_path / "c.json")], capture_output=True, text=True, check=True)
    ids = json.loads(out.stdout)[0]["ids"]
    assert cached <= ids.index(968 + 2), f"reused {cached} tokens past the audio"
    # the cold server knows the remembered reply ids (not the engine state), so it feeds the same
    # ids: turn 2 is what a cold engine fed them answers
    (tmp_path / "cold").mkdir()
    shutil.copy(tmp_path / "kv" / "reply_ids", tmp_path / "cold" / "reply_ids")
    cold = Server(tiny, str(tmp_path), ["--slots", "1", "--numerics", "exact", "--kv-dir", str(tmp_path / "cold")])
    try:
        st, _, c2 = chat(cold, turn2)
    finally:
        cold.stop()
    assert st == 200 and c2["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert c2["choices"][0]["message"] == r2["choices"][0]["message"]
    assert c2["choices"][0]["logprobs"] == r2["choices"][0]["logprobs"]


def test_pcm16_equals_wav(server):
    samples = clip(4)
    text = {"type": "text", "text": "Hi"}
    a = chat(server, [{"role": "user", "content": [audio_part(wav(samples)), text]}])[2]
    b = chat(server, [{"role": "user", "content": [audio_part(samples.tobytes(), "pcm16"), text]}])[2]
    assert first_logprob(a) == first_logprob(b)


@pytest.mark.parametrize("part,field,why", [
    (audio_part(wav(clip(5), rate=2000)), "input_audio.data", "2000 Hz"),
    (audio_part(wav(clip(5))[:40]), "input_audio.data", "truncated"),
    (audio_part(b"\xff\xfb\x90\x00" + bytes(64)), "input_audio.data", "not a WAV"),
    (audio_part(b"\x01\x02\x03", "pcm16"), "input_audio.data", "16-bit"),
    (audio_part(wav(clip(5)), "mp3"), "input_audio.format", "wav"),
    ({"type": "input_audio", "input_audio": {"data": "@@@@", "format": "wav"}}, "input_audio.data", "base64"),
])
def test_bad_audio_is_a_400_naming_it(server, part, field, why):
    st, _, r = chat(server, [{"role": "user", "content": [part, {"type": "text", "text": "?"}]}])
    assert st == 400, r
    err = r["error"]
    assert err["param"] == f"messages[0].content[0].{field}" and why in err["message"], err
    st, _, ok = chat(server, [{"role": "user", "content": "still there?"}])
    assert st == 200, ok


def test_family_without_audio_refuses_the_part(tmp_path):
    s = Server(make_model("glm"), str(tmp_path), ["--slots", "1"])
    try:
        st, _, r = chat(s, [{"role": "user", "content": [audio_part(wav(clip(1))), {"type": "text", "text": "?"}]}])
    finally:
        s.stop()
    assert st == 400 and "audio" in r["error"]["message"], r
