"""Numerics every float64 reference shares (tools/ref/*.py): norms, activations, the top-k order
and the output format of their command lines. References share these with each other, never
with the engine."""
import argparse
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


def arg_parser(doc):
    """The command line every reference shares: MODEL --ids A,B,... [--top K]; a reference adds its own."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--top", type=int, default=5)
    return ap


def prompt_ids(args):
    return [int(t) for t in args.ids.split(",")]
