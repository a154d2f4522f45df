#!/usr/bin/python3
"""Numpy reference of Inkling's DMel feature extractor (Hugging Face transformers models/inkling
feature_extraction_inkling.py, InklingFeatureExtractor defaults), written independently of
src/core/audio.c: np.fft.rfft instead of a direct DFT, vectorised mel filters, float64 throughout.

dmel(samples) -> uint8 [frames, 80] levels for mono samples at 16 kHz.
resample(samples, rate) -> float64 samples at 16 kHz: the Kaiser-windowed sinc of src/core/audio.h
  (libswresample's default design), evaluated directly per output sample with numpy's sinc and i0.
read_wav(path) -> float64 mono samples at 16 kHz (PCM 16-bit or float32; other rates resampled).

CLI: dmel.py FILE.wav  prints one line of 80 hex digits (one per mel bin) per frame.
"""
import math
import struct
import sys

import numpy as np

RATE, HOP, WIN, N_FFT, MELS, LEVELS, LO, HI = 16000, 800, 1600, 1600, 80, 16, -7.0, 2.0


def hz_to_mel(f):
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3.0, 1000.0
    logstep = np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_hz / f_sp + np.log(np.maximum(f, min_log_hz) / min_log_hz) / logstep,
                    f / f_sp)


def mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3.0, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), m * f_sp)


def mel_filter_bank():
    """[MELS, N_FFT//2+1] Slaney-normalised triangles, rounded to float32 as the extractor stores them."""
    freqs = np.arange(N_FFT // 2 + 1) * RATE / N_FFT
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(RATE / 2), MELS + 2))
    widths = np.diff(edges)
    lower = (freqs[None, :] - edges[:-2, None]) / widths[:-1, None]
    upper = (edges[2:, None] - freqs[None, :]) / widths[1:, None]
    w = np.maximum(0.0, np.minimum(lower, upper)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return w.astype(np.float32).astype(np.float64)


def log_mel(samples):
    x = np.asarray(samples, dtype=np.float64)
    if len(x) == 0:
        return np.zeros((0, MELS))
    right = math.ceil(len(x) / HOP) * HOP - len(x)
    x = np.concatenate([np.zeros(N_FFT - HOP), x, np.zeros(right)])
    frames = 1 + (len(x) - WIN) // HOP
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(WIN) / WIN)
    idx = np.arange(frames)[:, None] * HOP + np.arange(WIN)[None, :]
    spec = np.fft.rfft(x[idx] * window, n=N_FFT, axis=1)
    mag = np.sqrt(np.maximum(spec.real ** 2 + spec.imag ** 2, 1e-10))
    return np.log10(np.maximum(mag @ mel_filter_bank().T, 1e-10))


def resample(samples, rate, cutoff=0.97, beta=9.0, half_taps=16):
    """Output j at input time j * rate / 16000, taps floor(t) - W + 1 .. floor(t) + W weighted by
    sinc(f d) * I0(beta sqrt(1 - (d / W)^2)) normalised to unit sum, d = t - tap, zeros outside."""
    x = np.asarray(samples, dtype=np.float64)
    f = cutoff * min(RATE / rate, 1.0)
    w = math.ceil(half_taps / f)
    m = -(-len(x) * RATE // rate)
    t = np.arange(m) * (rate / RATE)
    base = np.floor(t).astype(np.int64)
    taps = base[:, None] + np.arange(-w + 1, w + 1)[None, :]
    d = t[:, None] - taps
    c = np.sinc(f * d) * np.i0(beta * np.sqrt(np.maximum(0.0, 1.0 - (d / w) ** 2)))
    c /= c.sum(axis=1, keepdims=True)
    inside = (taps >= 0) & (taps < len(x))
    return (c * np.where(inside, x[np.clip(taps, 0, len(x) - 1)], 0.0)).sum(axis=1)


def levels(logmel):
    centres = np.linspace(LO, HI, LEVELS)
    v = np.clip(logmel, LO, HI)
    return np.abs(v[..., None] - centres).argmin(axis=-1).astype(np.uint8)


def dmel(samples):
    return levels(log_mel(samples))


def read_wav(path):
    """PCM 16-bit or IEEE float32 RIFF/WAVE, channels averaged."""
    data = open(path, "rb").read()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", "not a WAV file"
    off, fmt = 12, None
    while off + 8 <= len(data):
        cid, size = data[off:off + 4], struct.unpack("<I", data[off + 4:off + 8])[0]
        body = data[off + 8:off + 8 + size]
        if cid == b"fmt ":
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif cid == b"data":
            code, ch, rate, _, _, bits = fmt
            dt = {(1, 16): "<i2", (3, 32): "<f4"}[(code, bits)]
            a = np.frombuffer(body, dtype=dt).astype(np.float64)
            if code == 1:
                a = a / 32768.0
            a = a.reshape(-1, ch).mean(axis=1)
            return a if rate == RATE else resample(a, rate)
        off += 8 + size + (size & 1)
    raise ValueError("no data chunk")


if __name__ == "__main__":
    for row in dmel(read_wav(sys.argv[1])):
        print("".join("%x" % v for v in row))
