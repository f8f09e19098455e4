"""Session 17's prediction for the Gluon backward's CTA order (notes/gluon_backward.md): a
list-scheduling model of the hardware block scheduler. Each CTA is one key block of 128 keys
of one head; its cost is the query blocks of 64 rows it visits plus 3 for its prologue and
epilogue; 132 SMs take the CTAs in launch order, one at a time each (one CTA an SM: 168
registers x 384 threads), every SM starting its next CTA when the last ends. Printed: the
makespan over the ideal (total work / 132) for each order.

    python experiments/gluon/tail_model.py

Orders: ``plain`` (the grid (key blocks, heads), key blocks fastest: each head's heaviest
block first, the last head's last), ``sectionS`` (``scheduler._bwd_tile`` with SECTION = S:
heads innermost in sections of S), ``tailS`` (TAIL = S: the last S heads together).
"""

import heapq
import math

SMS, BN, BM, OVERHEAD = 132, 128, 64, 3


def doc_lengths(total=16384, weights=(5, 1, 3, 2, 4, 1)):
    """scripts/gpu_features.py's six documents."""
    lengths = [total * w // sum(weights) for w in weights]
    lengths[0] += total - sum(lengths)
    return lengths


def documents(total=16384):
    """Work of each key block of one head: query blocks from its own down to its document's end."""
    ends, start = [], 0
    for n in doc_lengths(total):
        ends.append((start, start + n))
        start += n
    work = []
    for n0 in range(0, total, BN):
        end = next(b for a, b in ends if a <= min(n0 + BN, total) - 1 < b)
        work.append(math.ceil((end - n0 // BM * BM) / BM) + OVERHEAD)
    return work


def causal(n):
    return [math.ceil((n - n0) / BM) + OVERHEAD for n0 in range(0, n, BN)]


def makespan(order):
    free = [0.0] * SMS
    for w in order:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def order(work, heads, section=0, tail=0):
    groups = [[h] for h in range(heads)]
    if section:
        groups = [list(range(f, min(f + section, heads))) for f in range(0, heads, section)]
    elif tail:
        lead = max(heads - tail, 0)
        groups = [[h] for h in range(lead)] + [list(range(lead, heads))]
    return [work[kb] for g in groups for kb in range(len(work)) for _ in g]


def main():
    cases = [("documents d=128 (16 heads)", documents(), 16),
             ("documents d=64 (32 heads)", documents(), 32)]  # fmt: skip
    cases += [(f"causal d={d} N={n} (B*H={bh})", causal(n), bh)
              for n in (4096, 8192, 16384) for d, bh in ((64, 128), (128, 64))]  # fmt: skip
    for name, work, heads in cases:
        ideal = sum(work) * heads / SMS
        cols = {"plain": order(work, heads)}
        cols.update({f"section{s}": order(work, heads, section=s) for s in (4, 8, 16)})
        cols.update({f"tail{s}": order(work, heads, tail=s) for s in (4, 8)})
        print(f"{name:32s}", "  ".join(f"{k} {makespan(v) / ideal:.3f}" for k, v in cols.items()))


if __name__ == "__main__":
    main()
