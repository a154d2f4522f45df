#!/usr/bin/python3
"""Float64 reference forward pass of Inkling, written from Hugging Face transformers `models/inkling`
(modeling_inkling.py, configuration_inkling.py), independent of the C engine: whole-sequence
attention with dense masks and dense relative-position bias matrices, convolutions as explicit
zero-padded sums, experts evaluated per token. Loads the HF layout and the released raw layout
(renamed tensors, gate/up rows interleaved), both mapped to the HF text-model names.

usage: inkling.py MODEL_DIR --ids 1,2,3 [--top 5] [--dmel FILE]
prints one JSON line per position: {"pos": i, "top": [[id, logprob], ...]} (next-token log-probs).
--dmel: raw u8 file of [frames][n_mel_bins] DMel levels, consumed by the audio placeholder ids.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import st  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refmath import arg_parser, log_softmax, print_top, prompt_ids, rms, silu, top_indices  # noqa: E402,F401

RAW_TO_HF = [("attn.wq_du", "self_attn.q_proj"), ("attn.wk_dv", "self_attn.k_proj"), ("attn.wv_dv", "self_attn.v_proj"),
             ("attn.wr_du", "self_attn.r_proj"), ("attn.wo_ud", "self_attn.o_proj"),
             ("attn.k_sconv.", "self_attn.k_sconv.conv1d."), ("attn.v_sconv.", "self_attn.v_sconv.conv1d."),
             ("attn_sconv.", "attn_sconv.conv1d."), ("mlp_sconv.", "mlp_sconv.conv1d."),
             ("attn.q_norm", "self_attn.q_norm"), ("attn.k_norm", "self_attn.k_norm"),
             ("attn.rel_logits_proj", "self_attn.rel_logits_proj"),
             ("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"),
             ("gate.bias", "gate.e_score_correction_bias")]


def deinterleave(w, axis):
    """[g0, u0, g1, u1, ...] -> ([g...], [u...]) along axis."""
    return np.take(w, np.arange(0, w.shape[axis], 2), axis), np.take(w, np.arange(1, w.shape[axis], 2), axis)


def canonical(name, v, out):
    """Map one checkpoint tensor to HF text-model-relative names (raw tensors may become two)."""
    if name.startswith("model.language_model."):
        out[name[len("model.language_model."):]] = v
    elif name == "lm_head.weight" or name == "model.llm.unembed.weight":
        out["lm_head.weight"] = v
    elif name in ("model.audio_tower.embed_audio_tokens.embed_audio_tokens.weight", "model.audio.encoder.weight"):
        out["audio.embed"] = v
    elif name in ("model.audio_tower.norm.weight", "model.audio.final_norm.weight"):
        out["audio.norm"] = v
    elif name == "model.llm.embed.weight":
        out["embed_tokens.weight"] = v
    elif name == "model.llm.embed_norm.weight":
        out["embed_tokens.embed_norm.weight"] = v
    elif name == "model.llm.norm.weight":
        out["norm.weight"] = v
    elif name.startswith("model.llm.layers."):
        n = name[len("model.llm."):]
        if n.endswith("mlp.w13_dn.weight"):
            p = n[: -len("w13_dn.weight")]
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = deinterleave(v, 0)
        elif n.endswith("mlp.w2_md.weight"):
            out[n[: -len("w2_md.weight")] + "down_proj.weight"] = v
        elif n.endswith("experts.w13_weight"):
            out[n[: -len("w13_weight")] + "gate_up_proj"] = np.concatenate(deinterleave(v, 1), axis=1)
        elif n.endswith("experts.w2_weight"):
            out[n[: -len("w2_weight")] + "down_proj"] = v
        elif n.endswith("shared_w13_weight"):
            p = n[: -len("shared_w13_weight")]
            out[p + "gate_proj"], out[p + "up_proj"] = deinterleave(v, 1)
        elif n.endswith("shared_w2_weight"):
            out[n[: -len("shared_w2_weight")] + "down_proj"] = v
        else:
            for a, b in RAW_TO_HF:
                n = n.replace(a, b)
            out[n] = v


def load(model_dir):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = {}
    for name, (dt, shape, data) in st.read_dir(model_dir).items():
        if dt == "BF16":
            v = st.bf16_decode(data, shape).astype(np.float64)
        elif dt == "F32":
            v = np.frombuffer(data, dtype=np.float32).reshape(shape).astype(np.float64)
        else:
            raise ValueError(f"{name}: dtype {dt} not handled by the reference")
        canonical(name, v, w)
    return cfg, w


def text_config(cfg):
    """HF InklingTextConfig defaults and __post_init__ (layer_types, mlp_layer_types, sizes)."""
    t = dict(cfg.get("text_config", cfg))
    n = t["num_hidden_layers"]
    if "layer_types" not in t:
        local = set(t["local_layer_ids"]) if t.get("local_layer_ids") is not None else \
            {i for i in range(n) if (i + 1) % 6}
        t["layer_types"] = ["hybrid_sliding" if i in local else "hybrid" for i in range(n)]
    if "mlp_layer_types" not in t:
        t["mlp_layer_types"] = ["dense" if i < t.get("dense_mlp_idx", 0) else "sparse" for i in range(n)]
    if t.get("dense_intermediate_size") is not None:
        t["intermediate_size"] = t["dense_intermediate_size"]
    t.setdefault("conv_kernel_size", t.get("sconv_kernel_size", 4))
    t.setdefault("rms_norm_eps", 1e-6)
    t.setdefault("log_scaling_alpha", 0.1)
    t.setdefault("log_scaling_n_floor", None)
    t.setdefault("route_scale", 8.0)
    t.setdefault("logits_mup_width_multiplier", 24.0)
    return t




def short_conv(x, weight):
    """Depthwise causal conv (kernel K, zero history) plus the residual: out[t] = x[t] +
    sum_j w[:, j] * x[t - K + 1 + j]."""
    k = weight.shape[-1]
    taps = weight.reshape(weight.shape[0], k)
    pad = np.concatenate([np.zeros((k - 1, x.shape[1])), x], 0)
    out = sum(pad[j: j + len(x)] * taps[:, j] for j in range(k))
    return out + x


def attention(t, w, p, hn, sliding):
    S = len(hn)
    pre = "swa_" if sliding else ""
    h, kv, hd = t[pre + "num_attention_heads"], t[pre + "num_key_value_heads"], t[pre + "head_dim"]
    extent = t["sliding_window_size"] if sliding else t["rel_extent"]
    q = (hn @ w[p + "q_proj.weight"].T).reshape(S, h, hd)
    k = short_conv(hn @ w[p + "k_proj.weight"].T, w[p + "k_sconv.conv1d.weight"]).reshape(S, kv, hd)
    v = short_conv(hn @ w[p + "v_proj.weight"].T, w[p + "v_sconv.conv1d.weight"]).reshape(S, kv, hd)
    r = (hn @ w[p + "r_proj.weight"].T).reshape(S, h, t["d_rel"])
    q = rms(q, w[p + "q_norm.weight"], t["rms_norm_eps"])
    k = rms(k, w[p + "k_norm.weight"], t["rms_norm_eps"])
    pos = np.arange(S)
    dist = pos[:, None] - pos[None, :]
    prof = np.einsum("shd,de->hse", r, w[p + "rel_logits_proj.proj"])          # [h, S, extent]
    bias = np.take_along_axis(prof, np.broadcast_to(np.clip(dist, 0, extent - 1), (h, S, S)), axis=2)
    bias = np.where((dist < 0) | (dist >= extent), 0.0, bias)
    if not sliding and t["log_scaling_n_floor"] is not None:
        tau = 1.0 + t["log_scaling_alpha"] * np.log(np.maximum((pos + 1) / t["log_scaling_n_floor"], 1.0))
        q = q * tau[:, None, None]
        bias = bias * tau[None, :, None]
    k = np.repeat(k, h // kv, axis=1)
    v = np.repeat(v, h // kv, axis=1)
    scores = np.einsum("shd,thd->hst", q, k) / hd + bias
    allowed = dist >= 0
    if sliding:
        allowed &= dist < t["sliding_window_size"]
    scores = np.where(allowed[None], scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    out = np.einsum("hst,thd->shd", probs, v).reshape(S, h * hd)
    return out @ w[p + "o_proj.weight"].T


def logsigmoid(x):
    return -np.logaddexp(0, -x)


def moe(t, w, p, x):
    e, ns, k = t["n_routed_experts"], t["n_shared_experts"], t["num_experts_per_tok"]
    mi = t["moe_intermediate_size"]
    logits = x @ w[p + "gate.weight"].T
    choice = 1 / (1 + np.exp(-logits[:, :e])) + w[p + "gate.e_score_correction_bias"]
    out = np.zeros_like(x)
    for s in range(len(x)):
        idx = np.lexsort((np.arange(e), -choice[s]))[:k]
        lsig = logsigmoid(np.concatenate([logits[s, idx], logits[s, e:]]))
        gam = np.exp(lsig - np.logaddexp.reduce(lsig)) * t["route_scale"] * w[p + "gate.global_scale"][0]
        for j, ex in enumerate(idx):
            gu = w[p + "experts.gate_up_proj"][ex] @ x[s]
            out[s] += gam[j] * (w[p + "experts.down_proj"][ex] @ (silu(gu[:mi]) * gu[mi:]))
        for j in range(ns):
            act = silu(w[p + "shared_experts.gate_proj"][j] @ x[s]) * (w[p + "shared_experts.up_proj"][j] @ x[s])
            out[s] += w[p + "shared_experts.down_proj"][j] @ (act * gam[k + j])
    return out


def dense_mlp(w, p, x):
    act = silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)
    return (act @ w[p + "down_proj.weight"].T) * w[p + "global_scale"][0]


def embed(cfg, t, w, ids, dmel):
    """Normed token embeddings; audio placeholders take the audio tower's embedding instead."""
    x = rms(w["embed_tokens.weight"][np.asarray(ids)], w["embed_tokens.embed_norm.weight"], t["rms_norm_eps"])
    slots = [i for i, tok in enumerate(ids) if tok == cfg.get("audio_token_id")]
    if dmel is None:
        dmel = np.zeros((0, 0), dtype=np.int64)
    if len(slots) != len(dmel):
        raise ValueError(f"{len(slots)} audio placeholders but {len(dmel)} DMel frames")
    if slots:
        mv = cfg["audio_config"]["mel_vocab_size"]
        offsets = np.arange(dmel.shape[1]) * mv
        a = w["audio.embed"][dmel.astype(np.int64) + offsets].sum(axis=1)
        x[slots] = rms(a, w["audio.norm"], 1e-6)
    return x


def forward(cfg, w, ids, dmel=None):
    """Logits [len(ids), unpadded vocab] of every position."""
    t = text_config(cfg)
    x = embed(cfg, t, w, ids, dmel)
    eps = t["rms_norm_eps"]
    for i in range(t["num_hidden_layers"]):
        p = f"layers.{i}."
        sliding = t["layer_types"][i] == "hybrid_sliding"
        a = attention(t, w, p + "self_attn.", rms(x, w[p + "input_layernorm.weight"], eps), sliding)
        x = x + short_conv(a, w[p + "attn_sconv.conv1d.weight"])
        hn = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        m = moe(t, w, p + "mlp.", hn) if t["mlp_layer_types"][i] == "sparse" else dense_mlp(w, p + "mlp.", hn)
        x = x + short_conv(m, w[p + "mlp_sconv.conv1d.weight"])
    x = rms(x, w["norm.weight"], eps) / t["logits_mup_width_multiplier"]
    logits = x @ w["lm_head.weight"].T
    return logits[:, : t.get("unpadded_vocab_size") or logits.shape[1]]


def main():
    ap = arg_parser(__doc__)
    ap.add_argument("--dmel", help="u8 file [frames][n_mel_bins]")
    a = ap.parse_args()
    cfg, w = load(a.model)
    dmel = None
    if a.dmel:
        dmel = np.fromfile(a.dmel, dtype=np.uint8).reshape(-1, cfg["audio_config"]["n_mel_bins"])
    lp = log_softmax(forward(cfg, w, prompt_ids(a), dmel))
    print_top(lp, a.top)


if __name__ == "__main__":
    main()
