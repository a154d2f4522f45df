"""real_shape_line.py STDERR_FILE — the bench line of one real-shape step (scripts/bench.sh): RSS,
state bytes per token and time per decode step from `cairn run`'s closing stats line, and what the
expert cache read, from its counters line."""
import re
import sys


def fields(line):
    return dict(re.findall(r"(\w+)=([\d.]+)", line))


def main(path):
    text = open(path).read()
    run = [l for l in text.splitlines() if l.startswith("cairn: prompt=")]
    cache = [l for l in text.splitlines() if l.startswith("cairn: expert-cache:")]
    if not run or not cache:
        sys.exit(f"{path}: no stats lines from cairn run")
    s, c = fields(run[-1]), fields(cache[-1])
    step = 1 / float(s["decode_tok_s"]) if float(s["decode_tok_s"]) > 0 else float("inf")
    print(f"rss {float(s['rss_mb']):.0f} MB, state {s['state_bytes_per_token']} bytes/token "
          f"(+{int(s['state_fixed_bytes']) >> 10} KiB fixed), decode step {step:.1f} s, "
          f"expert cache read {int(c['bytes_read']) >> 20} MiB (hit rate {float(c['hit_rate']):.2f})")


if __name__ == "__main__":
    main(sys.argv[1])
