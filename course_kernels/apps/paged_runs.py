"""The Serving chapter's GPU run: one decode step over a paged KV cache vs the contiguous one.

Chapter: "Serving: KV cache, paged attention, chunked prefill" (book part two). Command line
(GPU only; writes ``paged_decode_bench.json`` with GPU, versions, date and the command)::

    python -m course_kernels apps paged --out DIR

For the Llama-3-8B decode shape (32 query heads, 8 KV heads, d = 128, fp16), batch 1 and 8,
caches of 4K to 128K tokens each: ``flash_decode`` on the contiguous cache, and
``flash_decode_paged`` on the same keys scattered over pages of 16, 64 and 256 tokens in random
order (as after many sequences have come and gone), both replayed from a CUDA graph (the device
time, as serving engines run decode steps) and the paged one also called eagerly. The bandwidth
column divides the least traffic (the cache read once) by the time.
"""

from __future__ import annotations

from functools import partial


def to_pages(x, table, page_size: int):
    """A contiguous cache ``x`` (B, kv_heads, N, d) scattered into a page pool
    (B * max_blocks, page_size, kv_heads, d): page ``table[b, i]`` holds tokens
    ``i * page_size ..`` of sequence b (torch; ``table`` (B, max_blocks) a permutation)."""
    import torch

    B, kv_heads, n, d = x.shape
    blocks = table.shape[1]
    pool = x.new_zeros(B * blocks, page_size, kv_heads, d)
    xs = torch.nn.functional.pad(x, (0, 0, 0, blocks * page_size - n))
    pool[table.long()] = xs.view(B, kv_heads, blocks, page_size, d).permute(0, 2, 3, 1, 4)
    return pool


def paged_decode_benchmark(
    contexts=(4096, 32768, 131072),
    batches=(1, 8),
    page_sizes=(16, 64, 256),
    heads=32,
    kv_heads=8,
    head_dim=128,
    log=print,
):
    """Rows of ``{context, batch, page_size, impl, us, gb_per_s, host_us, max_abs_err}``."""
    from .measure import _graphed, _host_us, _require_cuda, decode_bytes

    _require_cuda("paged_decode_benchmark")
    import torch
    import triton

    from ..serving.decode import default_num_splits, flash_decode
    from ..serving.paged_decode import flash_decode_paged

    rows = []
    for batch in batches:
        for n in contexts:
            torch.manual_seed(0)
            q = torch.randn(batch, heads, 1, head_dim, device="cuda", dtype=torch.float16)
            k = torch.randn(batch, kv_heads, n, head_dim, device="cuda", dtype=torch.float16)
            v = torch.randn_like(k)
            nbytes = decode_bytes(batch, kv_heads, n, head_dim, heads, 1, 2)
            want = flash_decode(q, k, v)
            splits = default_num_splits(batch * kv_heads, n)
            runs = {
                (None, "flash_decode_cudagraph"): (_graphed(partial(flash_decode, q, k, v)), None)
            }
            for P in page_sizes:
                pages_per_seq = -(-n // P)
                perm = torch.randperm(batch * pages_per_seq, device="cuda", dtype=torch.int32)
                table = perm.view(batch, pages_per_seq)  # random page order
                lens = torch.full((batch,), n, device="cuda", dtype=torch.int32)

                kp, vp = to_pages(k, table, P), to_pages(v, table, P)
                call = partial(flash_decode_paged, q, kp, vp, table, lens, check_table=False)
                err = (call().float() - want.float()).abs().max().item()
                runs[(P, "flash_decode_paged_cudagraph")] = (_graphed(call), err)
                runs[(P, "flash_decode_paged")] = (call, err)
                del kp, vp
            for (P, impl), (fn, err) in runs.items():
                us = triton.testing.do_bench(fn) * 1e3
                row = {
                    "context": n,
                    "batch": batch,
                    "heads": heads,
                    "kv_heads": kv_heads,
                    "head_dim": head_dim,
                    "dtype": "float16",
                    "page_size": P,
                    "impl": impl,
                    "num_splits": splits,
                    "us": us,
                    "gb_per_s": nbytes / (us * 1e-6) / 1e9,
                    "host_us": _host_us(fn),
                    "max_abs_err_vs_flash_decode": err,
                }
                rows.append(row)
                log(
                    f"B={batch} N={n:6d} page={P or '-':>4} {impl:30s} {us:8.1f} us "
                    f"{row['gb_per_s']:7.0f} GB/s host {row['host_us']:6.1f} us err {err}"
                )
            torch.cuda.empty_cache()
    return rows


def summary(rows, copy_bandwidth: float):
    """What the Serving chapter says about a run: ``(markdown, table_rows)``.

    Ratios are the paged kernel's CUDA-graph time over the contiguous ``flash_decode``'s at the
    same batch and cache length (above 1: paging costs time); bandwidth is the least traffic
    over the time, also as a share of ``copy_bandwidth`` (bytes/s, the measured copy ceiling).
    """
    base = {(r["batch"], r["context"]): r for r in rows if r["impl"] == "flash_decode_cudagraph"}
    graph = [r for r in rows if r["impl"] == "flash_decode_paged_cudagraph"]
    eager = [r for r in rows if r["impl"] == "flash_decode_paged"]
    table, by_page = [], {}
    for r in graph:
        b = base[(r["batch"], r["context"])]
        ratio = r["us"] / b["us"]
        by_page.setdefault(r["page_size"], []).append(ratio)
        table.append([r["batch"], f"{r['context']:,}", r["page_size"], f"{b['us']:.1f}",
                      f"{r['us']:.1f}", f"{ratio:.2f}", f"{r['gb_per_s']:,.0f}"])  # fmt: skip
    big = max(graph, key=lambda r: (r["context"] * r["batch"], -r["page_size"]))
    big_base = base[(big["batch"], big["context"])]
    ratios = [x for v in by_page.values() for x in v]
    per_page = "; ".join(
        f"pages of {p}: {min(v):.2f}-{max(v):.2f}" for p, v in sorted(by_page.items())
    )
    err = max(r["max_abs_err_vs_flash_decode"] for r in graph)
    text = (
        f"Replayed from a CUDA graph, the paged kernel took {min(ratios):.2f} to "
        f"{max(ratios):.2f} times the time of `flash_decode` on the contiguous cache ({per_page}). "
        f"At batch {big['batch']} and {big['context']:,} tokens per sequence it read the cache at "
        f"{big['gb_per_s']:,.0f} GB/s with pages of {big['page_size']} "
        f"({big['gb_per_s'] * 1e9 / copy_bandwidth:.0%} of the measured copy bandwidth), against "
        f"{big_base['gb_per_s']:,.0f} GB/s for the contiguous cache. Called eagerly, one paged "
        f"step cost {min(r['host_us'] for r in eager):.0f} to {max(r['host_us'] for r in eager):.0f}"
        f" us of host time. The outputs differed from the contiguous kernel's by at most "
        f"{err:.1e} (fp16)."
    )
    return text, table
