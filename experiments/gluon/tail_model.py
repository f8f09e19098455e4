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

Session 29: ``DEFER`` (each head's lightest tiles moved to the end of the forward's order, the rest
head-major as before), which the model puts at 1.003 at 4K (head-major 1.052).

Session 23 added the causal forward (``forward_tiles``, ``forward_order``): its dynamic
scheduler hands tiles of NUM_CONSUMERS x 64 query rows to 132 persistent CTAs in
``scheduler._tile_coords``' order, each CTA drawing the next when it finishes, which is the same
list scheduling. A tile's cost is its busiest consumer's live key blocks of 128 (SKIP_DEAD: a
consumer skips the blocks wholly masked for its rows) plus 2 for its Q load and epilogue.
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


def forward_tiles(n, consumers=3, bm=64, bn=128, align_end=True, overhead=2):
    """Cost of each query tile of one head, tile 0 first (ALIGN_END: the tiles end at the last
    64-row block, so tile 0 is the partial one and its first consumers' rows lie before row 0)."""
    tile = bm * consumers
    n_tiles = math.ceil(n / tile)
    shift = n_tiles * tile - math.ceil(n / bm) * bm if align_end else 0
    costs = []
    for pm in range(n_tiles):
        live = [math.ceil(min(r0 + bm, n) / bn) for r0 in
                range(pm * tile - shift, (pm + 1) * tile - shift, bm) if r0 + bm > 0 and r0 < n]  # fmt: skip
        costs.append(max(live) + overhead)
    return costs


def forward_order(costs, heads, lpt=False, section=0, defer=0):
    """The tiles' costs in the order the scheduler hands them out: head-major, each head's
    heaviest (last) tile first (the default); with ``defer`` (DEFER, session 29) each head's
    ``defer`` lightest tiles after all the others, heaviest of them first, heads innermost; or
    LPT: the heaviest tiles of all heads first, within sections of ``section`` heads if given
    (FA3's L2 sections, LPT_SECTION_MB)."""
    last = len(costs) - 1
    if not lpt:
        keep = len(costs) - defer
        return [costs[last - r] for _ in range(heads) for r in range(keep)] + [
            costs[defer - 1 - r] for r in range(defer) for _ in range(heads)
        ]
    size = section or heads
    return [costs[last - r] for f in range(0, heads, size)
            for r in range(len(costs)) for _ in range(min(size, heads - f))]  # fmt: skip


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
    print(
        "forward, causal, makespan over the ideal (8 heads: the K/V of LPT_SECTION_MB = 8 at d = 64, 4K)"
    )
    for d, consumers, bh in ((64, 3, 128), (128, 2, 64)):
        for n in (4096, 8192, 16384):
            costs = forward_tiles(n, consumers, align_end=d == 64)
            ideal = sum(costs) * bh / SMS
            cols = {"head-major": forward_order(costs, bh), "LPT": forward_order(costs, bh, True)}
            cols.update({f"LPT section{s}": forward_order(costs, bh, True, s) for s in (8, 16)})
            cols.update({f"DEFER={k}": forward_order(costs, bh, defer=k) for k in (2, 4, 6)})
            print(
                f"  d={d} N={n:<6}",
                "  ".join(f"{k} {makespan(v) / ideal:.4f}" for k, v in cols.items()),
            )


if __name__ == "__main__":
    main()
