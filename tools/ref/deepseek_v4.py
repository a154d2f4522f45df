#!/usr/bin/python3
"""Independent float64 numpy reference of the DeepSeek V4 forward pass (deepseek_v4.md §2-§7).

Written from the spec alone, sharing nothing with the C engine: it is the oracle the engine is
compared against. Plain and slow on purpose: one token at a time, every compressed entry
recomputed from the per-token projections it pools (no ring buffers), every weight dequantised
to float64 up front.

Numerics:
  exact  weights dequantised as stored; activations stay float64 with no BF16 rounding and no
         activation / KV / indexer quantise-dequantise.
  qat    BF16 rounding, E4M3 activation QDQ, KV QDQ and indexer FP4 QDQ exactly where §7/§7.1
         put them; what the spec computes in FP32 stays float64 here.

usage: deepseek_v4.py MODEL --prompt-ids 0,5,9 [--numerics exact|qat] [--top 5]
                            [--jitter 1e-7 --jitter-seed N] [--set key=value ...]
Prints one JSON line per prompt position: {"pos": i, "top": [{"id": .., "logprob": ..}, ...]},
the log-softmax of that position's next-token logits. --jitter multiplies each embedding output
(and in qat mode every value about to be rounded, see Numerics) by (1 + jitter * N(0,1)),
seeded, to measure how far the numerics alone move the result.
--set overrides a config.json value (e.g. --set compress_rope_theta=150000), used by tests to
show that a wrong model is detected.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import st  # noqa: E402


# ---- number formats ------------------------------------------------------------------------

class Numerics:
    """The rounding points of one mode; in exact mode every rounding is the identity.

    Jitter (for measuring the numerical spread): perturb(x) multiplies by (1 + jitter*N(0,1)).
    It is applied to the embedding output and, in qat mode, to every value about to be rounded
    to BF16: a 1e-7 change of the embedding alone is erased by the first BF16 rounding, whereas
    two correct implementations differ by ~1e-7 (accumulation order, f32 vs f64) before *every*
    BF16 rounding, and that is the spread the comparison must allow. E4M3/E2M1 QDQ inputs are
    not perturbed: they are BF16 values already, identical in any correct implementation, and
    a perturbation would only break the ties that round-half-to-even settles exactly."""

    def __init__(self, qat, jitter=0.0, seed=0):
        self.qat = qat
        self.jitter = jitter
        self.rng = np.random.default_rng(seed)

    def perturb(self, x):
        if not self.jitter:
            return x
        return x * (1.0 + self.jitter * self.rng.standard_normal(np.shape(x)))

    def bf16(self, x):
        if not self.qat:
            return x
        return st.bf16_round(np.asarray(self.perturb(x), dtype=np.float32)).astype(np.float64)

    def _pow2_qdq(self, x, block, grid, floor):
        """Per block: scale = 2^ceil(log2(amax/grid_max)), round x/scale to the grid (ties to even)."""
        if not self.qat:
            return x
        b = np.asarray(x, dtype=np.float64).reshape(-1, block)
        amax = np.maximum(np.abs(b).max(axis=1), floor)
        scale = 2.0 ** np.ceil(np.log2(amax / grid[-1]))
        q, _ = st.round_to_grid(b / scale[:, None], grid)
        return (q * scale[:, None]).reshape(np.shape(x))

    def act(self, x):
        """E4M3 QDQ in blocks of 128: the input of every FP8/FP4 linear."""
        return self._pow2_qdq(x, 128, st.E4M3_GRID, 1e-4)

    def kv(self, x, nope):
        """E4M3 QDQ of the non-RoPE dims in blocks of 64 (window KV, compressed KV)."""
        out = np.array(x, dtype=np.float64)
        out[..., :nope] = self._pow2_qdq(out[..., :nope], 64, st.E4M3_GRID, 1e-4)
        return out

    def fp4(self, x):
        """E2M1 QDQ in blocks of 32 (indexer queries and keys, after the Hadamard)."""
        return self._pow2_qdq(x, 32, st.E2M1_GRID, 1e-4)


# ---- checkpoint -----------------------------------------------------------------------------

def dequantise(tensors, name):
    dt, shape, raw = tensors[name]
    if dt == "BF16":
        return st.bf16_decode(raw, shape).astype(np.float64)
    if dt == "F32":
        return np.frombuffer(raw, dtype=np.float32).reshape(shape).astype(np.float64)
    if dt == "I64":
        return np.frombuffer(raw, dtype=np.int64).reshape(shape)
    base = name[: -len(".weight")]
    sdt, sshape, sraw = tensors[base + ".scale"]
    if dt == "F8_E4M3" and sdt == "F32":
        # block scales as plain factors (checkpoints converted from other layouts)
        w = st.e4m3_decode(np.frombuffer(raw, dtype=np.uint8).reshape(shape))
        s = np.frombuffer(sraw, dtype=np.float32).reshape(sshape).astype(np.float64)
        return w * np.repeat(np.repeat(s, 128, 0), 128, 1)[: w.shape[0], : w.shape[1]]
    scale = np.frombuffer(sraw, dtype=np.uint8).reshape(sshape)
    if dt == "F8_E4M3":
        return st.fp8_dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(shape), scale)
    if dt == "I8":
        return st.fp4_dequantize(np.frombuffer(raw, dtype=np.int8).reshape(shape), scale)
    raise ValueError(f"tensor {name}: unsupported dtype {dt}")


class Checkpoint:
    def __init__(self, model_dir):
        self.tensors = st.read_dir(model_dir)
        self.cache = {}

    def __call__(self, name):
        if name not in self.cache:
            if name not in self.tensors:
                raise KeyError(f"checkpoint has no tensor {name}")
            self.cache[name] = dequantise(self.tensors, name)
        return self.cache[name]


# ---- small math ----------------------------------------------------------------------------

def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


def hadamard(x):
    """Normalised Walsh-Hadamard transform over the last axis (length a power of two)."""
    n = x.shape[-1]
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return x @ h.T / math.sqrt(n)


def rope_freqs(dim, base, yarn):
    """Per-pair frequencies base^(-2k/dim); YaRN blends in freq/factor for the slow pairs."""
    f = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    if yarn is None:
        return f
    L, factor = yarn["original_max_position_embeddings"], yarn["factor"]

    def corr(n_rot):
        return dim * math.log(L / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(yarn["beta_fast"])), 0)
    high = min(math.ceil(corr(yarn["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0.0, 1.0)
    return f / factor * ramp + f * (1.0 - ramp)


def rope(x, pos, freqs, inverse=False):
    """Rotate interleaved pairs (2k, 2k+1) of the last axis by pos*freqs[k] (backwards if inverse)."""
    ang = pos * freqs
    cos, sin = np.cos(ang), np.sin(ang) * (-1.0 if inverse else 1.0)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


# ---- the model -----------------------------------------------------------------------------

class DeepseekV4:
    def __init__(self, model_dir, qat, overrides=None, jitter=0.0, jitter_seed=0):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.cfg.update(overrides or {})
        self.w = Checkpoint(model_dir)
        self.num = Numerics(qat, jitter, jitter_seed)
        c = self.cfg
        self.n_layers = c["num_hidden_layers"]
        blocks = self.n_layers + c.get("num_nextn_predict_layers", 0)     # the MTP blocks follow the layers
        self.ratios = c["compress_ratios"][:blocks]
        self.hc = c["hc_mult"]
        self.eps = c["rms_norm_eps"]
        self.hd, self.rd = c["head_dim"], c["qk_rope_head_dim"]
        self.nope = self.hd - self.rd
        self.freqs_plain = rope_freqs(self.rd, c["rope_theta"], None)
        self.freqs_comp = rope_freqs(self.rd, c["compress_rope_theta"], c["rope_scaling"])
        # per-layer history (index = absolute position): window KV and compressor projections
        self.kv = [[] for _ in range(blocks)]
        self.comp_in = [[] for _ in range(blocks)]      # (a_t, s_t) of the main compressor
        self.idx_in = [[] for _ in range(blocks)]       # (a_t, s_t) of the indexer compressor
        self.comp = [[] for _ in range(blocks)]         # emitted main entries
        self.idx_keys = [[] for _ in range(blocks)]     # emitted indexer keys

    # -- building blocks --

    def rmsnorm(self, x, weight_name=None):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        if weight_name is not None:
            y = y * self.w(weight_name)
        return self.num.bf16(y)

    def qlinear(self, name, x):
        """FP8/FP4 linear: activation QDQ, matmul with the dequantised weight, BF16 output."""
        return self.num.bf16(self.w(name + ".weight") @ self.num.act(x))

    def hc_pre(self, H, prefix):
        c, hc = self.cfg, self.hc
        fn, base, scale = self.w(prefix + "_fn"), self.w(prefix + "_base"), self.w(prefix + "_scale")
        flat = H.reshape(-1)
        mix = (fn @ flat) / math.sqrt(np.mean(flat * flat) + self.eps)
        pre = sigmoid(mix[:hc] * scale[0] + base[:hc]) + c["hc_eps"]
        post = 2.0 * sigmoid(mix[hc:2 * hc] * scale[1] + base[hc:2 * hc])
        comb = (mix[2 * hc:] * scale[2] + base[2 * hc:]).reshape(hc, hc)
        comb = softmax(comb, axis=1) + c["hc_eps"]
        comb = comb / (comb.sum(axis=0, keepdims=True) + c["hc_eps"])
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(axis=1, keepdims=True) + c["hc_eps"])
            comb = comb / (comb.sum(axis=0, keepdims=True) + c["hc_eps"])
        return self.num.bf16(pre @ H), post, comb

    def hc_post(self, f, R, post, comb):
        # stream j = post_j * f + sum_i comb[i][j] * R_i
        return self.num.bf16(post[:, None] * f[None, :] + comb.T @ R)

    # -- compressor: entry w pools per feature over the tokens of its window(s) --

    def compressor_project(self, prefix, x, t, ratio):
        a = self.w(prefix + ".wkv.weight") @ x
        s = self.w(prefix + ".wgate.weight") @ x + self.w(prefix + ".ape")[t % ratio]
        return a, s

    def pool(self, inputs, w, ratio, dim):
        if ratio == 4:      # overlap: first halves of window w-1, second halves of window w
            a = [inputs[j][0][dim:] for j in range(4 * w, 4 * w + 4)]
            s = [inputs[j][1][dim:] for j in range(4 * w, 4 * w + 4)]
            if w > 0:
                a = [inputs[j][0][:dim] for j in range(4 * w - 4, 4 * w)] + a
                s = [inputs[j][1][:dim] for j in range(4 * w - 4, 4 * w)] + s
        else:
            a = [inputs[j][0] for j in range(ratio * w, ratio * (w + 1))]
            s = [inputs[j][1] for j in range(ratio * w, ratio * (w + 1))]
        return np.sum(softmax(np.array(s), axis=0) * np.array(a), axis=0)

    def emit_entries(self, l, p, x, t, ratio):
        """Record token t's compressor projections; when t closes a window, append its entries."""
        num = self.num
        self.comp_in[l].append(self.compressor_project(p + ".compressor", x, t, ratio))
        if ratio == 4:
            self.idx_in[l].append(self.compressor_project(p + ".indexer.compressor", x, t, ratio))
        if (t + 1) % ratio:
            return
        w = (t + 1) // ratio - 1
        e = num.bf16(self.pool(self.comp_in[l], w, ratio, self.hd))
        e = self.rmsnorm(e, p + ".compressor.norm.weight")
        e[self.nope:] = num.bf16(rope(e[self.nope:], ratio * w, self.freqs_comp))
        self.comp[l].append(num.kv(e, self.nope))
        if ratio == 4:
            ihd = self.cfg["index_head_dim"]
            k = num.bf16(self.pool(self.idx_in[l], w, ratio, ihd))
            k = self.rmsnorm(k, p + ".indexer.compressor.norm.weight")
            k[ihd - self.rd:] = num.bf16(rope(k[ihd - self.rd:], ratio * w, self.freqs_comp))
            self.idx_keys[l].append(num.fp4(num.bf16(hadamard(k))))

    def indexer_select(self, l, p, x, qr, t):
        """Lightning indexer: top-k visible compressed entries by sum_h w_h relu(q_h . k_s)."""
        c, num = self.cfg, self.num
        ih, ihd = c["index_n_heads"], c["index_head_dim"]
        keys = np.array(self.idx_keys[l])
        if len(keys) == 0:
            return []
        q = self.qlinear(p + ".indexer.wq_b", qr).reshape(ih, ihd)
        q[:, ihd - self.rd:] = num.bf16(rope(q[:, ihd - self.rd:], t, self.freqs_comp))
        q = num.fp4(num.bf16(hadamard(q)))
        wts = num.bf16(self.w(p + ".indexer.weights_proj.weight") @ x) * (ihd ** -0.5 * ih ** -0.5)
        score = wts @ np.maximum(q @ keys.T, 0.0)
        order = sorted(range(len(keys)), key=lambda s: (-score[s], s))
        return order[: min(c["index_topk"], len(keys))]

    # -- attention --

    def attention(self, l, x, t):
        c, num = self.cfg, self.num
        p = self.prefix(l) + ".attn"
        ratio = self.ratios[l]
        freqs = self.freqs_comp if ratio else self.freqs_plain
        nh, hd, nope = c["num_attention_heads"], self.hd, self.nope

        qr = self.rmsnorm(self.qlinear(p + ".wq_a", x), p + ".q_norm.weight")
        q = self.qlinear(p + ".wq_b", qr).reshape(nh, hd)
        q = num.bf16(q / np.sqrt(np.mean(q * q, axis=1, keepdims=True) + self.eps))
        q[:, nope:] = num.bf16(rope(q[:, nope:], t, freqs))

        kv = self.rmsnorm(self.qlinear(p + ".wkv", x), p + ".kv_norm.weight")
        kv[nope:] = num.bf16(rope(kv[nope:], t, freqs))
        self.kv[l].append(num.kv(kv, nope))

        keys = [self.kv[l][j] for j in range(max(0, t - c["sliding_window"] + 1), t + 1)]
        if ratio:
            self.emit_entries(l, p, x, t, ratio)
            if ratio == 4:
                keys += [self.comp[l][s] for s in self.indexer_select(l, p, x, qr, t)]
            else:
                keys += self.comp[l]
        K = np.array(keys)

        sink = self.w(p + ".attn_sink")
        o = np.empty((nh, hd))
        for h in range(nh):
            z = K @ q[h] / math.sqrt(hd)
            m = z.max()
            e = np.exp(z - m)
            o[h] = (e @ K) / (e.sum() + math.exp(sink[h] - m))
        o = num.bf16(o)
        o[:, nope:] = num.bf16(rope(o[:, nope:], t, freqs, inverse=True))

        g, ol = c["o_groups"], c["o_lora_rank"]
        wo_a = self.w(p + ".wo_a.weight").reshape(g, ol, -1)
        og = o.reshape(g, -1)
        u = num.bf16(np.concatenate([wo_a[i] @ og[i] for i in range(g)]))
        return self.qlinear(p + ".wo_b", u)

    # -- MoE --

    def expert(self, prefix, x, route_w):
        lim = self.cfg["swiglu_limit"]
        g = np.minimum(self.qlinear(prefix + ".w1", x), lim)
        u = np.clip(self.qlinear(prefix + ".w3", x), -lim, lim)
        h = self.num.bf16(route_w * silu(g) * u)
        return self.qlinear(prefix + ".w2", h)

    def moe(self, l, x, token):
        c = self.cfg
        p = self.prefix(l) + ".ffn"
        logits = self.w(p + ".gate.weight") @ x
        score = np.sqrt(np.logaddexp(0.0, logits))
        k = c["num_experts_per_tok"]
        if l < c["num_hash_layers"]:
            idx = [int(e) for e in self.w(p + ".gate.tid2eid")[token]]
        else:
            biased = score + self.w(p + ".gate.bias")
            idx = sorted(range(len(score)), key=lambda e: (-biased[e], e))[:k]
        wts = score[idx] / score[idx].sum() * c["routed_scaling_factor"]
        out = self.expert(p + ".shared_experts", x, 1.0)
        for e, rw in zip(idx, wts):
            out = out + self.expert(f"{p}.experts.{e}", x, rw)
        return self.num.bf16(out)

    # -- whole model --

    def prefix(self, l):
        return f"layers.{l}" if l < self.n_layers else f"mtp.{l - self.n_layers}"

    def block(self, l, H, token, t):
        p = self.prefix(l)
        x, post, comb = self.hc_pre(H, p + ".hc_attn")
        f = self.attention(l, self.rmsnorm(x, p + ".attn_norm.weight"), t)
        H = self.hc_post(f, H, post, comb)
        x, post, comb = self.hc_pre(H, p + ".hc_ffn")
        f = self.moe(l, self.rmsnorm(x, p + ".ffn_norm.weight"), token)
        return self.hc_post(f, H, post, comb)

    def head(self, H, p=""):
        """Logits from the streams H: HC head collapse, final norm, the shared head (p: an MTP
        block's own hc_head and norm)."""
        flat = H.reshape(-1)
        mix = (self.w(p + "hc_head_fn") @ flat) / math.sqrt(np.mean(flat * flat) + self.eps)
        pre = sigmoid(mix * self.w(p + "hc_head_scale")[0] + self.w(p + "hc_head_base")) + self.cfg["hc_eps"]
        y = self.num.bf16(pre @ H)
        return self.w("head.weight") @ self.rmsnorm(y, p + "norm.weight")

    def step(self, token, t):
        """Feed one token at absolute position t; returns its next-token logits. self.H keeps
        the final streams (what the MTP block reads)."""
        e = self.num.perturb(self.w("embed.weight")[token])
        H = np.tile(e, (self.hc, 1))
        for l in range(self.n_layers):
            H = self.block(l, H, token, t)
        self.H = H
        return self.head(H)

    def mtp_step(self, H, token, t):
        """MTP block 0 at position t (spec §6): the final streams H of main position t and the
        token at t + 1; returns the draft logits of token t + 2. Call for t = 0, 1, ... in order."""
        p = "mtp.0."
        e = self.qlinear(p + "e_proj", self.rmsnorm(self.w("embed.weight")[token], p + "enorm.weight"))
        h = np.array([self.qlinear(p + "h_proj", self.rmsnorm(H[i], p + "hnorm.weight")) for i in range(self.hc)])
        X = self.num.bf16(h + e[None, :])
        return self.head(self.block(self.n_layers, X, token, t), p)


def log_softmax(x):
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def run(model_dir, ids, numerics="exact", top=5, jitter=0.0, jitter_seed=0, overrides=None):
    """Returns [{"pos": i, "top": [{"id", "logprob"}, ...]}, ...] for every prompt position."""
    m = DeepseekV4(model_dir, numerics == "qat", overrides, jitter, jitter_seed)
    vocab = m.cfg["vocab_size"]
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"prompt ids {bad} outside the vocabulary [0, {vocab})")
    out = []
    for t, tok in enumerate(ids):
        lp = log_softmax(m.step(tok, t))
        best = sorted(range(vocab), key=lambda i: (-lp[i], i))[:top]
        out.append({"pos": t, "top": [{"id": i, "logprob": float(lp[i])} for i in best]})
    return out


def mtp_run(model_dir, ids, numerics="exact"):
    """Draft logits [len(ids) - 1][vocab]: row p predicts token p + 2 from the main model's state
    of ids[0..p] and the token ids[p + 1], MTP positions 0 .. len - 2 attending to each other."""
    m = DeepseekV4(model_dir, numerics == "qat")
    out = []
    for t, tok in enumerate(ids):
        m.step(tok, t)
        if t > 0:
            out.append(m.mtp_step(H_prev, tok, t - 1))
        H_prev = m.H
    return np.array(out)


def parse_override(s):
    key, sep, val = s.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set wants key=value, got {s!r}")
    return key, json.loads(val)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--numerics", choices=["exact", "qat"], default="exact")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--jitter-seed", type=int, default=0)
    ap.add_argument("--set", type=parse_override, action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    try:
        ids = [int(s) for s in a.prompt_ids.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--prompt-ids must be comma-separated integers, got {a.prompt_ids!r}")
    if not ids:
        ap.error("--prompt-ids is empty")
    try:
        rows = run(a.model, ids, a.numerics, a.top, a.jitter, a.jitter_seed, dict(a.set))
    except (OSError, KeyError, ValueError) as e:
        sys.exit(f"deepseek_v4 reference: {e}")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
