#!/usr/bin/python3
"""Float64 reference forward pass of Kimi K3 (root model_type kimi_k3, text_config kimi_linear), written
from the public descriptions and independent of the C engine:
  - KDA (Hugging Face transformers models/kimi_linear: torch_recurrent_kda / torch_chunk_kda, the
    flash-linear-attention recurrence): causal depthwise short convs + SiLU on q/k/v, L2-normalised q/k
    (eps 1e-6 inside the rsqrt), q / sqrt(head_dim), per-channel log-decay
    g = lower_bound * sigmoid(exp(A_log) * (f_b(f_a(x)) + dt_bias)) (or -exp(A_log) * softplus(...)
    without a lower bound), beta = sigmoid(b_proj x), state decayed along the key dim, delta rule, read
    o = S^T q; per-head RMS o_norm times sigmoid(g_proj x); o_proj. Two paths: token by token
    (`recurrent`) and the chunked UT-transform form HF uses for prefill (`chunked`); they must agree.
  - Gated NoPE MLA: q_lora path, latent norms eps 1e-6, the "rope" dims used raw, k/v expanded through
    kv_b_proj (the engine uses the absorbed form), scale (nope + rope)^-1/2, sigmoid(g_proj x) gate.
  - Attention residuals (torchtitan KimiK3TransformerBlock._forward_attn_residual): block snapshots every
    attn_res_block_size layers, a softmax over proj . RMSNorm(v) of [blocks..., prefix] mixing the raw
    vectors before attention (from the second block on), before the MLP, and before the final norm.
  - Latent MoE: sigmoid router, correction bias for selection only, renormalised unbiased weights x
    routed_scaling_factor, routed_expert_down_proj to the latent, SiTU-GLU experts
    (beta * tanh(g / beta) * sigmoid(g) * linear_beta * tanh(u / linear_beta)), RMS-normalised weighted
    sum, routed_expert_up_proj, plus the fused SiTU-GLU shared experts; dense layer 0 SiTU-GLU.
MXFP4 experts are dequantized to float64 at load (E2M1 codes, low nibble = even column, 2^(s-127)).

usage: kimi_k3.py MODEL_DIR --ids 1,2,3 [--top 5] [--kda chunked|recurrent] [--chunk 64]
prints one JSON line per position: {"pos": i, "top": [[id, logprob], ...]} (next-token log-probs).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import st  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refmath import arg_parser, log_softmax, print_top, prompt_ids, rms, sigmoid, silu, top_indices  # noqa: E402,F401


def load(model_dir):
    """(text config, weights by name without the `language_model.` prefix, float64)."""
    root = json.load(open(os.path.join(model_dir, "config.json")))
    cfg = root.get("text_config", root)
    raw = st.read_dir(model_dir)
    w, packed = {}, {}
    for name, (dt, shape, data) in raw.items():
        name = name[len("language_model."):] if name.startswith("language_model.") else name
        if dt == "BF16":
            w[name] = st.bf16_decode(data, shape).astype(np.float64)
        elif dt == "F32":
            w[name] = np.frombuffer(data, dtype=np.float32).reshape(shape).astype(np.float64)
        elif dt in ("U8", "I8", "F8_E8M0"):
            packed[name] = np.frombuffer(data, dtype=np.uint8).reshape(shape)
    for name in [n for n in packed if n.endswith(".weight_packed")]:
        base = name[: -len("_packed")]
        w[base] = st.fp4_dequantize(packed[name], packed[base + "_scale"])
    return cfg, w





def softplus(x):
    return np.logaddexp(0, x)


def situ_glu(cfg, w, p, x):
    b1, b2 = cfg.get("activation_situ_beta", 4.0), cfg.get("activation_situ_linear_beta", 25.0)
    g, u = x @ w[p + "gate_proj.weight"].T, x @ w[p + "up_proj.weight"].T
    return (b1 * np.tanh(g / b1) * sigmoid(g) * b2 * np.tanh(u / b2)) @ w[p + "down_proj.weight"].T


def expert(cfg, w, p, z):
    b1, b2 = cfg.get("activation_situ_beta", 4.0), cfg.get("activation_situ_linear_beta", 25.0)
    g, u = z @ w[p + "w1.weight"].T, z @ w[p + "w3.weight"].T
    return (b1 * np.tanh(g / b1) * sigmoid(g) * b2 * np.tanh(u / b2)) @ w[p + "w2.weight"].T



def short_conv(x, taps):
    """Causal depthwise conv: x [S, C], taps [C, 1, K]; out[t] = sum_j taps[j] * x[t - K + 1 + j]."""
    k = taps.shape[-1]
    xp = np.concatenate([np.zeros((k - 1, x.shape[1])), x], 0)
    return sum(xp[j: j + len(x)] * taps[:, 0, j] for j in range(k))


def kda_recurrent(q, k, v, g, beta):
    """q, k, v, g [S, H, d]; beta [S, H] -> o [S, H, d] (one token at a time)."""
    S, H, d = q.shape
    state = np.zeros((H, d, v.shape[-1]))
    out = np.zeros_like(v)
    for t in range(S):
        state = state * np.exp(g[t])[:, :, None]
        pred = np.einsum("hkv,hk->hv", state, k[t])
        delta = (v[t] - pred) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", state, q[t])
    return out


def kda_chunked(q, k, v, g, beta, chunk=64):
    """The same recurrence in HF's chunked form: within a chunk the delta rule is solved with the UT
    transform (I + L)^-1 over decay-weighted key products, between chunks the state is carried."""
    S, H, d = q.shape
    dv = v.shape[-1]
    pad = (-S) % chunk
    q, k, v, g = [np.concatenate([a, np.zeros((pad,) + a.shape[1:])], 0) for a in (q, k, v, g)]
    beta = np.concatenate([beta, np.zeros((pad, H))], 0)
    state = np.zeros((H, d, dv))
    out = np.zeros((S + pad, H, dv))
    for c0 in range(0, S + pad, chunk):
        sl = slice(c0, c0 + chunk)
        for h in range(H):
            qc, kc, vc, gc, bc = q[sl, h], k[sl, h], v[sl, h], g[sl, h], beta[sl, h]
            cum = np.cumsum(gc, 0)                                # [C, d] log decay from chunk start
            n = len(qc)
            # A[i, j] = beta_i * sum_c k_i[c] k_j[c] exp(cum_i - cum_j) for j < i
            pair = np.exp(np.clip(cum[:, None, :] - cum[None, :, :], None, 0.0))
            kk = np.einsum("ic,jc,ijc->ij", kc, kc, pair) * bc[:, None]
            qk = np.einsum("ic,jc,ijc->ij", qc, kc, pair)
            lower = np.tril(np.ones((n, n)), -1)
            t_inv = np.linalg.inv(np.eye(n) + kk * lower)
            u = t_inv @ (vc * bc[:, None])                        # new values
            w_dec = t_inv @ (kc * bc[:, None] * np.exp(cum))      # decayed keys reading the old state
            v_new = u - w_dec @ state[h]
            out[sl, h] = (qc * np.exp(cum)) @ state[h] + (qk * np.tril(np.ones((n, n)))) @ v_new
            last = cum[-1]
            state[h] = state[h] * np.exp(last)[:, None] + (kc * np.exp(last[None, :] - cum)).T @ v_new
    return out[:S]


def kda(cfg, w, p, hn, path="chunked", chunk=64):
    la = cfg["linear_attn_config"]
    H, d = la["num_heads"], la["head_dim"]
    S = len(hn)
    qkv = []
    for name in ("q", "k", "v"):
        x = hn @ w[p + f"{name}_proj.weight"].T
        qkv.append(silu(short_conv(x, w[p + f"{name}_conv1d.weight"])).reshape(S, H, d))
    q, k, v = qkv
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(d)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    f = ((hn @ w[p + "f_a_proj.weight"].T) @ w[p + "f_b_proj.weight"].T).reshape(S, H, d)
    a = np.exp(w[p + "A_log"].reshape(-1)[:H])[None, :, None]
    z = f + w[p + "dt_bias"].reshape(H, d)
    lb = la.get("gate_lower_bound")
    g = lb * sigmoid(a * z) if lb is not None else -a * softplus(z)
    beta = sigmoid(hn @ w[p + "b_proj.weight"].T)
    o = kda_recurrent(q, k, v, g, beta) if path == "recurrent" else kda_chunked(q, k, v, g, beta, chunk)
    if p + "g_proj.weight" in w:
        gate = hn @ w[p + "g_proj.weight"].T
    else:
        gate = (hn @ w[p + "g_a_proj.weight"].T) @ w[p + "g_b_proj.weight"].T
    o = rms(o, w[p + "o_norm.weight"], cfg.get("rms_norm_eps", 1e-5)) * sigmoid(gate.reshape(S, H, d))
    return o.reshape(S, H * d) @ w[p + "o_proj.weight"].T


def mla(cfg, w, p, hn):
    h, nope, rd, vd = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                       cfg["v_head_dim"])
    kvl, S = cfg["kv_lora_rank"], len(hn)
    q = (rms(hn @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], 1e-6) @ w[p + "q_b_proj.weight"].T)
    q = q.reshape(S, h, nope + rd)
    ckv = hn @ w[p + "kv_a_proj_with_mqa.weight"].T
    latent = rms(ckv[:, :kvl], w[p + "kv_a_layernorm.weight"], 1e-6)
    k_pe = ckv[:, kvl:]                                           # NoPE: used raw, never rotated
    kv = (latent @ w[p + "kv_b_proj.weight"].T).reshape(S, h, nope + vd)
    scores = (np.einsum("shd,thd->hst", q[..., :nope], kv[..., :nope]) +
              np.einsum("shd,td->hst", q[..., nope:], k_pe)) * (nope + rd) ** -0.5
    scores = np.where(np.tril(np.ones((S, S), dtype=bool))[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("hst,thd->shd", probs, kv[..., nope:]).reshape(S, h * vd)
    out = out * sigmoid(hn @ w[p + "g_proj.weight"].T)
    return out @ w[p + "o_proj.weight"].T


def moe(cfg, w, p, x):
    eps = cfg.get("rms_norm_eps", 1e-5)
    s = sigmoid(x @ w[p + "gate.weight"].T)
    choice = s + w[p + "gate.e_score_correction_bias"]
    z = x @ w[p + "routed_expert_down_proj.weight"].T
    agg = np.zeros_like(z)
    for t in range(len(x)):
        idx = top_indices(choice[t], cfg["num_experts_per_token"])
        wt = s[t, idx]
        if cfg.get("moe_renormalize", True):
            wt = wt / (wt.sum() + 1e-20)
        wt = wt * cfg.get("routed_scaling_factor", 1.0)
        for e, we in zip(idx, wt):
            agg[t] += we * expert(cfg, w, f"{p}experts.{e}.", z[t: t + 1])[0]
    if cfg.get("latent_moe_use_norm", True):
        agg = rms(agg, w[p + "routed_expert_norm.weight"], eps)
    return agg @ w[p + "routed_expert_up_proj.weight"].T + situ_glu(cfg, w, p + "shared_experts.", x)


def res_mix(w, p, values, eps):
    """Softmax over proj . RMSNorm(v) of the candidate vectors, mixing the raw vectors."""
    v = np.stack(values)                                          # [N, S, D]
    score = rms(v, w[p + "_norm.weight"], eps) @ w[p + "_proj.weight"].reshape(-1)
    prob = np.exp(score - score.max(0))
    prob /= prob.sum(0)
    return np.einsum("ns,nsd->sd", prob, v)


def forward(cfg, w, ids, kda_path="chunked", chunk=64):
    """Logits [len(ids), vocab] of every position."""
    eps = cfg.get("rms_norm_eps", 1e-5)
    kda_layers = set(cfg["linear_attn_config"]["kda_layers"])
    bs = cfg.get("attn_res_block_size")
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    blocks = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        prefix = x
        if bs and blocks:
            x = res_mix(w, p + "self_attention_res", blocks + [prefix], eps)
        if bs and i % bs == 0:
            blocks.append(prefix)
            prefix = None
        hn = rms(x, w[p + "input_layernorm.weight"], eps)
        a = kda(cfg, w, p + "self_attn.", hn, kda_path, chunk) if i + 1 in kda_layers else mla(cfg, w, p + "self_attn.", hn)
        prefix = a if prefix is None else prefix + a
        m = res_mix(w, p + "mlp_res", blocks + [prefix], eps) if bs else prefix
        hn = rms(m, w[p + "post_attention_layernorm.weight"], eps)
        sparse = i >= cfg.get("first_k_dense_replace", 1)
        x = prefix + (moe(cfg, w, p + "block_sparse_moe.", hn) if sparse else situ_glu(cfg, w, p + "mlp.", hn))
    if bs:
        x = res_mix(w, "model.output_attn_res", blocks + [x], eps)
    x = rms(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T


def main():
    ap = arg_parser(__doc__)
    ap.add_argument("--kda", choices=["chunked", "recurrent"], default="chunked")
    ap.add_argument("--chunk", type=int, default=64)
    a = ap.parse_args()
    cfg, w = load(a.model)
    lp = log_softmax(forward(cfg, w, prompt_ids(a), a.kda, a.chunk))
    print_top(lp, a.top)


if __name__ == "__main__":
    main()
