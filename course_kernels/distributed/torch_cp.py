"""PyTorch's own context parallelism
(``torch.distributed.tensor.experimental.context_parallel``) on the same inputs as the ring.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb). Re-exported from
:mod:`course_kernels.distributed.bench`.
"""

from __future__ import annotations


import torch
import torch.distributed as dist

from .ring import (
    gather_sequence,
    ring_attention,
    shard_sequence,
)
from .check import DTYPES, _inputs
from .measure import _all, _time_ms
from .spawn import device_here


def compare_torch_cp(
    ns=(4096,), B=1, Hq=16, d=128, dtype="bfloat16", causals=(False, True), repeats=5, log=print
) -> list[dict]:
    """PyTorch's context parallelism vs ring_attention (zigzag) on the same inputs.

    Runs ``F.scaled_dot_product_attention`` inside
    ``torch.distributed.tensor.experimental.context_parallel`` (it shards the buffers with its
    head-tail load balancer when N is a multiple of 2W: our zigzag layout), forward and
    backward, unshards with ``context_parallel_unshard`` and compares output and gradients
    with ours gathered; times both. A row records ``error`` when this torch cannot run it
    (for example on CPU/gloo, where CP has no SDPA kernel to dispatch to).
    """
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    device, dt = device_here(), DTYPES[dtype]
    rows, mesh = [], None
    for n in ns:
        for causal in causals:
            row = {
                "n": n,
                "B": B,
                "Hq": Hq,
                "kv_heads": Hq,
                "d": d,
                "dtype": dtype,
                "causal": causal,
                "world": world,
                "torch": torch.__version__,
            }
            q, k, v, do = _inputs(B, Hq, Hq, n, d, seed=n)
            try:
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.tensor.experimental import context_parallel
                from torch.distributed.tensor.experimental._attention import (
                    context_parallel_unshard,
                )

                try:  # a ring of K/V rotations, like ours (the default all-gathers K/V)
                    from torch.distributed.tensor.experimental._attention import (
                        set_rotate_method,
                    )

                    set_rotate_method("alltoall")
                    row["cp_rotate_method"] = "alltoall"
                except ImportError:
                    row["cp_rotate_method"] = "default (this torch has no set_rotate_method)"
                if mesh is None:  # one mesh (one process group) for every case
                    mesh = init_device_mesh(device.type, (world,))

                bufs = [x.to(device, dt) for x in (q, k, v, do)]
                with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2]):
                    # inside: bufs are this rank's shards and SDPA is PyTorch's ring
                    try:  # the buffers are resized back on exit: only without grad
                        for b in bufs[:3]:
                            b.requires_grad_(True)
                        out = F.scaled_dot_product_attention(*bufs[:3], is_causal=causal)
                        out.backward(bufs[3])
                        res = [out.detach()] + [b.grad.clone() for b in bufs[:3]]

                        def cp_fwd(bufs=bufs, causal=causal):
                            with torch.no_grad():
                                F.scaled_dot_product_attention(*bufs[:3], is_causal=causal)

                        def cp_fwd_bwd(bufs=bufs, causal=causal):
                            F.scaled_dot_product_attention(*bufs[:3], is_causal=causal).backward(
                                bufs[3]
                            )

                        cp_ms = (
                            _time_ms(cp_fwd, device, repeats),
                            _time_ms(cp_fwd_bwd, device, repeats),
                        )
                    finally:
                        for b in bufs[:3]:
                            b.requires_grad_(False)
                theirs = context_parallel_unshard(mesh, res, [2] * len(res))
                row["cp_fwd_ms"] = max(_all(cp_ms[0]))
                row["cp_fwd_bwd_ms"] = max(_all(cp_ms[1]))
                res = None  # free the shards before our run
            except Exception as exc:  # noqa: BLE001 - record what this torch cannot do
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(row)
                if rank == 0:
                    log(f"torch CP N={n} causal={causal}: {row['error']}")
                continue
            sh = [
                shard_sequence(x, world, rank, "zigzag").to(device, dt).requires_grad_()
                for x in (q, k, v)
            ]
            dsh = shard_sequence(do, world, rank, "zigzag").to(device, dt)

            def ours_fwd(sh=sh, causal=causal):
                with torch.no_grad():
                    ring_attention(*sh, causal=causal, layout="zigzag")

            def ours_fwd_bwd(sh=sh, causal=causal, dsh=dsh):
                ring_attention(*sh, causal=causal, layout="zigzag").backward(dsh)

            out = ring_attention(*sh, causal=causal, layout="zigzag")
            out.backward(dsh)
            mine = [gather_sequence(x, "zigzag") for x in [out.detach()] + [s.grad for s in sh]]
            for name, a, b in zip(("o", "dq", "dk", "dv"), mine, theirs, strict=True):
                row[f"{name}_max_diff"] = (a.float() - b.float()).abs().max().item()
            row["ours_fwd_ms"] = max(_all(_time_ms(ours_fwd, device, repeats)))
            row["ours_fwd_bwd_ms"] = max(_all(_time_ms(ours_fwd_bwd, device, repeats)))
            rows.append(row)
            if rank == 0:
                log(
                    f"torch CP vs ring (zigzag) N={n} causal={causal}: max |diff| o "
                    f"{row['o_max_diff']:.2e} dq {row['dq_max_diff']:.2e} dk "
                    f"{row['dk_max_diff']:.2e} dv {row['dv_max_diff']:.2e}; fwd+bwd ms: CP "
                    f"{row['cp_fwd_bwd_ms']:.2f}, ours {row['ours_fwd_bwd_ms']:.2f}"
                )
    return rows
