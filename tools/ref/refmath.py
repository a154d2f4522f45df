"""Numerics every float64 reference shares (tools/ref/*.py): norms, activations, the top-k order
and the output format of their command lines. References share these with each other, never
with the engine."""
import json

import numpy as np


def rms(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def silu(x):
    return x / (1 + np.exp(-x))


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def top_indices(scores, k):
    """k best, ties to the lower index."""
    return np.lexsort((np.arange(len(scores)), -scores))[:k]


def print_top(lp, k):
    """One JSON line per position: {"pos": i, "top": [[id, logprob], ...]} of the k best."""
    for i, row in enumerate(lp):
        print(json.dumps({"pos": i, "top": [[int(t), float(row[t])] for t in top_indices(row, k)]}))
