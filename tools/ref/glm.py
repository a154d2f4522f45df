#!/usr/bin/python3
"""Float64 reference forward pass of GLM-5 (`glm_moe_dsa`), written from the Hugging Face model
description, independent of the C engine: whole-sequence attention with k/v expanded through kv_b_proj
(the C side uses the absorbed latent form), RoPE in the de-interleaved layout HF uses, DSA masks built
per query row, and experts evaluated densely. Quantized checkpoints are dequantized to float64 at load:
F8_E4M3 with `_scale_inv` block scales, and colibri U8 + `.qs` int8/int4 containers (format by byte counts).

usage: glm.py MODEL_DIR --ids 1,2,3 [--top 5]
prints one JSON line per position: {"pos": i, "top": [[id, logprob], ...]} (next-token log-probs).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import st  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refmath import arg_parser, log_softmax, print_top, prompt_ids, rms, silu, top_indices  # noqa: E402,F401


def load(model_dir):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    raw = st.read_dir(model_dir)
    w = {}
    for name, (dt, shape, data) in raw.items():
        if dt == "BF16":
            w[name] = st.bf16_decode(data, shape).astype(np.float64)
        elif dt == "F32":
            w[name] = np.frombuffer(data, dtype=np.float32).reshape(shape).astype(np.float64)
        elif dt in ("F8_E4M3", "U8"):
            w[name] = (dt, np.frombuffer(data, dtype=np.uint8).reshape(shape))
    for name in [n for n, v in w.items() if isinstance(v, tuple)]:
        dt, q = w[name]
        if dt == "F8_E4M3":
            # FP8 checkpoints: weight (E4M3) + weight_scale_inv (F32, one per 128x128 block).
            s = w.pop(name[: -len("weight")] + "weight_scale_inv")
            big = np.repeat(np.repeat(s, 128, 0), 128, 1)[: q.shape[0], : q.shape[1]]
            w[name] = st.e4m3_decode(q) * big
        else:
            w[name] = colibri_dequant(q, w.pop(name + ".qs").reshape(-1), in_features(cfg, name), name)
    return cfg, w


def in_features(cfg, name):
    """Inputs per row of matrix `name`: a colibri container's U8 codes do not carry it."""
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    if name.endswith(("q_b_proj.weight", "indexer.wq_b.weight")):
        return cfg["q_lora_rank"]
    if name.endswith("kv_b_proj.weight"):
        return cfg["kv_lora_rank"]
    if name.endswith("o_proj.weight"):
        return h * cfg["v_head_dim"]
    if name.endswith("eh_proj.weight"):
        return 2 * d
    if name.endswith("down_proj.weight"):
        if ".experts." in name:
            return cfg["moe_intermediate_size"]
        if ".shared_experts." in name:
            return cfg["moe_intermediate_size"] * cfg.get("n_shared_experts", 1)
        return cfg["intermediate_size"]
    return d


def colibri_dequant(codes, scales, cols, name):
    """colibri QT formats from byte arithmetic (spec glm_kimi_inkling.md §1.3): int8 with one scale
    per row (1), int4 nibbles (value = nibble - 8, low nibble = even column) with one scale per row
    (2) or per 64 inputs (4)."""
    rows, half = codes.shape[0], (cols + 1) // 2
    scales = scales.astype(np.float64)
    if codes.size == rows * cols and scales.size == rows:
        return codes.reshape(rows, cols).view(np.int8).astype(np.float64) * scales[:, None]
    groups = -(-cols // 64)
    if codes.size != rows * half or scales.size not in (rows, rows * groups):
        raise ValueError(f"{name}: {codes.size} bytes, {scales.size} scales fit no int8/int4 layout of {cols} inputs")
    b = codes.reshape(rows, half)
    v = np.empty((rows, 2 * half))
    v[:, 0::2], v[:, 1::2] = (b & 15) - 8.0, (b >> 4) - 8.0
    per = scales.reshape(rows, -1)
    width = cols if per.shape[1] == 1 else 64
    return v[:, :cols] * np.repeat(per, width, axis=1)[:, :cols]



def layer_norm(x, g, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def rope(x, pos, theta, interleave):
    """x [..., S, (H,) d] rotated at positions pos; interleaved pairs are first de-interleaved (HF)."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(pos, inv)
    cos, sin = np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)
    if x.ndim == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    if interleave:
        x = np.concatenate([x[..., 0::2], x[..., 1::2]], -1)
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin



def swiglu(w, p, x):
    return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T



def indexer_select(cfg, w, p, hn, q_resid, pos, theta):
    nh, hd, rd = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
    inter = cfg.get("indexer_rope_interleave", False)
    q = (q_resid @ w[p + "wq_b.weight"].T).reshape(len(pos), nh, hd)
    q = np.concatenate([rope(q[..., :rd], pos, theta, inter), q[..., rd:]], -1)
    k = layer_norm(hn @ w[p + "wk.weight"].T, w[p + "k_norm.weight"], w[p + "k_norm.bias"], 1e-6)
    k = np.concatenate([rope(k[..., :rd], pos, theta, inter), k[..., rd:]], -1)
    hw = (hn @ w[p + "weights_proj.weight"].T) * nh ** -0.5
    dots = np.maximum(np.einsum("shd,td->sht", q, k) * hd ** -0.5, 0)
    score = np.einsum("sht,sh->st", dots, hw)
    sel = np.zeros((len(pos), len(pos)), dtype=bool)
    for s in range(len(pos)):
        sel[s, top_indices(score[s, : s + 1], min(cfg["index_topk"], s + 1))] = True
    return sel


def attention(cfg, w, p, hn, pos, theta, prev_sel, full):
    h, nope, rd, vd = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                       cfg["v_head_dim"])
    kvl, S = cfg["kv_lora_rank"], len(pos)
    inter = cfg.get("rope_interleave", True)
    q_resid = rms(hn @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], 1e-6)
    q = (q_resid @ w[p + "q_b_proj.weight"].T).reshape(S, h, nope + rd)
    q_nope, q_pe = q[..., :nope], rope(q[..., nope:], pos, theta, inter)
    ckv = hn @ w[p + "kv_a_proj_with_mqa.weight"].T
    latent = rms(ckv[:, :kvl], w[p + "kv_a_layernorm.weight"], 1e-6)
    k_pe = rope(ckv[:, kvl:], pos, theta, inter)
    kv = (latent @ w[p + "kv_b_proj.weight"].T).reshape(S, h, nope + vd)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    sel = indexer_select(cfg, w, p + "indexer.", hn, q_resid, pos, theta) if full else prev_sel
    scores = (np.einsum("shd,thd->hst", q_nope, k_nope) + np.einsum("shd,td->hst", q_pe, k_pe)) * (nope + rd) ** -0.5
    mask = np.tril(np.ones((S, S), dtype=bool)) & sel
    scores = np.where(mask[None], scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    out = np.einsum("hst,thd->shd", probs, v).reshape(S, h * vd)
    return out @ w[p + "o_proj.weight"].T, sel


def moe(cfg, w, p, x):
    logits = x @ w[p + "gate.weight"].T
    s = 1 / (1 + np.exp(-logits))
    choice = s + w[p + "gate.e_score_correction_bias"]
    out = swiglu(w, p + "shared_experts.", x)
    for t in range(len(x)):
        idx = top_indices(choice[t], cfg["num_experts_per_tok"])
        wt = s[t, idx]
        if cfg.get("norm_topk_prob", True):
            wt = wt / (wt.sum() + 1e-20)
        wt = wt * cfg.get("routed_scaling_factor", 2.5)
        for e, we in zip(idx, wt):
            out[t] += we * swiglu(w, f"{p}experts.{e}.", x[t: t + 1])[0]
    return out


def indexer_types(cfg):
    if "indexer_types" in cfg:
        return cfg["indexer_types"]
    freq, off = max(cfg.get("index_topk_freq", 1), 1), cfg.get("index_skip_topk_offset", 2)
    return ["full" if max(i - off + 1, 0) % freq == 0 else "shared" for i in range(cfg["num_hidden_layers"])]


def settings(cfg):
    theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    return theta, cfg.get("rms_norm_eps", 1e-5)


def layer(cfg, w, i, x, pos, sel, full, sparse):
    """Decoder layer i (the MTP layer is i = num_hidden_layers) over rows x at positions pos."""
    theta, eps = settings(cfg)
    p = f"model.layers.{i}."
    hn = rms(x, w[p + "input_layernorm.weight"], eps)
    a, sel = attention(cfg, w, p + "self_attn.", hn, pos, theta, sel, full)
    x = x + a
    hn = rms(x, w[p + "post_attention_layernorm.weight"], eps)
    return x + (moe(cfg, w, p + "mlp.", hn) if sparse else swiglu(w, p + "mlp.", hn)), sel


def hidden(cfg, w, ids):
    """Final hidden states [len(ids), hidden] after model.norm (what lm_head and the MTP layer read)."""
    pos = np.arange(len(ids))
    types = indexer_types(cfg)
    dense = cfg.get("mlp_layer_types") or (["dense"] * cfg["first_k_dense_replace"] +
                                           ["sparse"] * (cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]))
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    sel = None
    for i in range(cfg["num_hidden_layers"]):
        x, sel = layer(cfg, w, i, x, pos, sel, types[i] == "full" or sel is None, dense[i] == "sparse")
    return rms(x, w["model.norm.weight"], settings(cfg)[1])


def forward(cfg, w, ids):
    """Logits [len(ids), vocab] of every position."""
    return hidden(cfg, w, ids) @ w["lm_head.weight"].T


def mtp_forward(cfg, w, ids):
    """MTP draft logits [len(ids) - 1, vocab]: row p predicts token p + 2 from the final hidden state
    of p and the token at p + 1 (DeepSeek-V3 MTP: eh_proj over [enorm(embed) ; hnorm(hidden)], one
    decoder layer with its own indexer and MoE, shared_head.norm, the shared lm_head), MTP positions
    p = 0 .. len(ids) - 2 attending to each other causally."""
    n, eps = cfg["num_hidden_layers"], settings(cfg)[1]
    p = f"model.layers.{n}."
    h = hidden(cfg, w, ids)[:-1]
    e = w["model.embed_tokens.weight"][np.asarray(ids[1:])]
    x = np.concatenate([rms(e, w[p + "enorm.weight"], eps), rms(h, w[p + "hnorm.weight"], eps)], -1)
    x = x @ w[p + "eh_proj.weight"].T
    x, _ = layer(cfg, w, n, x, np.arange(len(ids) - 1), None, p + "self_attn.indexer.wq_b.weight" in w, True)
    return rms(x, w[p + "shared_head.norm.weight"], eps) @ w["lm_head.weight"].T


def main():
    ap = arg_parser(__doc__)
    a = ap.parse_args()
    cfg, w = load(a.model)
    lp = log_softmax(forward(cfg, w, prompt_ids(a)))
    print_top(lp, a.top)


if __name__ == "__main__":
    main()
