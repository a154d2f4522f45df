#!/usr/bin/python3
"""Make a small model of a family in the official checkpoint layout.

usage: /usr/bin/python3 tools/make_tiny.py FAMILY OUTDIR [--size tiny|bench] [--seed N]
(another python3 without numpy re-runs itself with /usr/bin/python3, which has it)

Each family's generator is tools/tiny_<family>.py with a function
make(outdir, size, seed) that writes config.json, the safetensors and tokenizer.json.
"""
import argparse
import importlib
import os
import sys

try:
    import numpy  # noqa: F401  (the generators need it)
except ImportError:
    if not os.environ.get("CAIRN_MAKE_TINY_REEXEC") and os.path.exists("/usr/bin/python3"):
        os.environ["CAIRN_MAKE_TINY_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    sys.exit("make_tiny: numpy is missing: sudo apt-get install -y python3-numpy")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
FAMILIES = {"deepseek_v4": "tiny_deepseek_v4", "glm": "tiny_glm", "glm_moe_dsa": "tiny_glm", "kimi_k3": "tiny_kimi_k3",
            "inkling": "tiny_inkling"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("outdir")
    ap.add_argument("--size", choices=["tiny", "bench"], default="tiny")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    importlib.import_module(FAMILIES[a.family]).make(a.outdir, a.size, a.seed)


if __name__ == "__main__":
    main()
