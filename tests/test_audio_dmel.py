"""DMel feature extraction in C (src/core/audio.c) against the independent numpy reference of the
official recipe (tools/ref/dmel.py, from HF transformers InklingFeatureExtractor): the same levels on
speech-like signals, tones, noise, silence and odd lengths; the frame count is ceil(samples / 800);
WAVs at other rates are resampled to 16 kHz as src/core/audio.h defines it, sample for sample and
level for level equal to the reference on 8 k, 11.025 k, 22.05 k, 44.1 k, 48 k and an odd rate (whose
filter is computed per output rather than tabled), and a tone resampled from 44.1 kHz gives the levels
of the same tone made at 16 kHz; bad audio (rate out of range, truncated, not a WAV, no samples,
unsupported encoding) is refused with a message naming what is wrong."""
import io
import os
import struct
import subprocess
import sys
import wave

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
import dmel as ref  # noqa: E402


@pytest.fixture(scope="module", params=["build", "build/portable"])
def dmel_tool(request):
    """tests/c/tool_dmel.c as make builds it, native and portable."""
    exe = os.path.join(ROOT, request.param, "tests", "tool_dmel")
    assert os.path.exists(exe), f"{exe} not built"
    return exe


def wav_bytes(samples, rate=16000, channels=1):
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.clip(np.round(np.asarray(samples) * 32767), -32768, 32767).astype("<i2").tobytes())
    return buf.getvalue()


def float_wav_bytes(samples):
    data = np.asarray(samples, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 64000, 4, 32)
    return b"RIFF" + struct.pack("<I", 4 + 8 + 16 + 8 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + \
        b"data" + struct.pack("<I", len(data)) + data


def signals():
    rng = np.random.default_rng(7)
    t = np.arange(16000) / 16000
    chirp = 0.5 * np.sin(2 * np.pi * (100 + 3000 * t) * t)
    speechy = np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.standard_normal(len(t))
    return {"chirp": chirp, "speech-like": 0.6 * speechy / np.abs(speechy).max(), "noise": 0.3 * rng.standard_normal(12345),
            "silence": np.zeros(4000), "short": 0.2 * rng.standard_normal(801), "one-sample": np.array([0.5])}


def assert_levels_match(got, samples):
    """C levels equal the reference's except where a log-mel value sits on a boundary between two centres."""
    want = ref.dmel(samples)
    assert got.shape == (-(-len(samples) // 800), 80) == want.shape
    logmel = np.clip(ref.log_mel(samples), -7, 2)
    step = 9 / 15
    near = np.abs((logmel + 7) / step - np.floor((logmel + 7) / step) - 0.5) < 1e-6
    assert np.array_equal(got[~near], want[~near]), f"{(got != want).sum()} levels differ"
    return want


def c_samples(tool, path):
    r = subprocess.run([tool, "--samples", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.array([float(v) for v in r.stdout.split()])


def c_levels(tool, path, *flags):
    r = subprocess.run([tool, *flags, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.array([[int(c, 16) for c in line] for line in r.stdout.split()], dtype=np.uint8).reshape(-1, 80)


@pytest.mark.parametrize("name", sorted(signals()))
def test_levels_match_reference(dmel_tool, tmp_path, name):
    raw = wav_bytes(signals()[name])
    path = tmp_path / "a.wav"
    path.write_bytes(raw)
    samples = ref.read_wav(str(path))
    want = assert_levels_match(c_levels(dmel_tool, path), samples)
    if name in ("chirp", "speech-like"):
        assert len(np.unique(want)) >= 5, "signal exercises too few levels: test would be blind"


def test_float_wav_and_pcm16_agree_with_int_wav(dmel_tool, tmp_path):
    x = signals()["chirp"]
    q = np.round(x * 32767) / 32768          # the same values in every encoding
    (tmp_path / "f.wav").write_bytes(float_wav_bytes(q))
    (tmp_path / "a.pcm").write_bytes(np.round(x * 32767).astype("<i2").tobytes())
    (tmp_path / "i.wav").write_bytes(wav_bytes(x))
    a = c_levels(dmel_tool, tmp_path / "i.wav")
    assert np.array_equal(a, c_levels(dmel_tool, tmp_path / "f.wav"))
    assert np.array_equal(a, c_levels(dmel_tool, tmp_path / "a.pcm", "--pcm16"))


def test_stereo_is_averaged(dmel_tool, tmp_path):
    x = signals()["chirp"][:8000]
    st = np.stack([x, x], axis=1).reshape(-1)
    (tmp_path / "s.wav").write_bytes(wav_bytes(st, channels=2))
    (tmp_path / "m.wav").write_bytes(wav_bytes(x))
    assert np.array_equal(c_levels(dmel_tool, tmp_path / "s.wav"), c_levels(dmel_tool, tmp_path / "m.wav"))


@pytest.mark.parametrize("case,expect", [
    ("rate", "2000 Hz"), ("truncated", "truncated"), ("not-wav", "not a WAV"), ("empty", "no samples"),
    ("8bit-float", "not supported"), ("odd-pcm", "16-bit samples")])
def test_bad_audio_is_refused_by_name(dmel_tool, tmp_path, case, expect):
    good = wav_bytes(signals()["noise"][:3000])
    data, flags = {
        "rate": (wav_bytes(signals()["noise"][:3000], rate=2000), []),
        "truncated": (good[: len(good) // 2], []),
        "not-wav": (b"ID3\x03\x00" + bytes(100), []),
        "empty": (wav_bytes([]), []),
        "8bit-float": (good[:20] + struct.pack("<H", 3) + good[22:34] + struct.pack("<H", 8) + good[36:], []),
        "odd-pcm": (b"\x01\x02\x03", ["--pcm16"]),
    }[case]
    path = tmp_path / "bad"
    path.write_bytes(data)
    r = subprocess.run([dmel_tool, *flags, str(path)], capture_output=True, text=True)
    assert r.returncode == 1 and expect in r.stderr, r.stderr


def speechy(rate, seconds):
    t = np.arange(int(rate * seconds)) / rate
    x = np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.3 * np.sin(2 * np.pi * (300 + 2500 * t) * t)
    return 0.6 * x / np.abs(x).max()


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000, 200003])
def test_resampled_to_16k_like_the_reference(dmel_tool, tmp_path, rate):
    path = tmp_path / "r.wav"
    path.write_bytes(wav_bytes(speechy(rate, 0.3 if rate < 100000 else 0.1), rate=rate))
    want = ref.read_wav(str(path))       # resampled by the reference
    got = c_samples(dmel_tool, path)
    assert len(got) == len(want) == -(-int(rate * (0.3 if rate < 100000 else 0.1)) * 16000 // rate)
    assert np.max(np.abs(got - want)) < 2e-6, np.max(np.abs(got - want))
    levels = assert_levels_match(c_levels(dmel_tool, path), want)
    assert len(np.unique(levels)) >= 5, "signal exercises too few levels: test would be blind"


def test_a_resampled_tone_has_the_levels_of_the_tone_made_at_16k(dmel_tool, tmp_path):
    tone = lambda rate: 0.5 * np.sin(2 * np.pi * 1000 * np.arange(rate // 2) / rate)
    (tmp_path / "a.wav").write_bytes(wav_bytes(tone(44100), rate=44100))
    (tmp_path / "b.wav").write_bytes(wav_bytes(tone(16000)))
    a, b = c_levels(dmel_tool, tmp_path / "a.wav"), c_levels(dmel_tool, tmp_path / "b.wav")
    assert a.shape == b.shape
    a, b = a[2:-2], b[2:-2]    # away from the clip's edges, where the filter meets the zero padding
    tone_bins = b >= 6         # the rest is the 16-bit quantisation noise floor, which differs by rate
    assert tone_bins.sum() >= a.shape[0] and np.array_equal(a[tone_bins], b[tone_bins])
    assert np.abs(a.astype(int) - b).max() <= 2
