"""The producer's side of FA3's forward schedule: layouts, and the producer warpgroup that only
issues TMA loads (Q per tile, K/V into the ring). The tile order and the dynamic scheduler are in
:mod:`.scheduler`. See :mod:`.forward`."""

from __future__ import annotations

from ._lang import HAVE_GLUON

if HAVE_GLUON:
    from ._lang import gl, gluon, mbarrier, tma
    from .scheduler import (
        _draw_tile,
        _kv_range,
        _publish_stop,
        _publish_tile,
        _retire_scheduler,
        _tile_coords,
        _tile_start,
    )

    # ------------------------------------------------------------------ layouts
    @gluon.constexpr_function
    def _mma_layout(BM, N, dtype):
        # One warpgroup (4 warps) per consumer; wgmma instruction m64nNk16.
        return gl.NVMMADistributedLayout(
            version=[3, 0],
            warps_per_cta=[4, 1],
            instr_shape=[16, N, 256 // dtype.primitive_bitwidth],
        )

    @gluon.constexpr_function
    def _a_operand_layout(parent, dtype):
        return gl.DotOperandLayout(
            operand_index=0, parent=parent, k_width=32 // dtype.primitive_bitwidth
        )

    # ---------------------------------------------------------------- producer
    @gluon.jit
    def _load_tile(
        desc_q,
        desc_k,
        desc_v,
        ring,
        t,
        qc,
        kc,
        N,
        H,
        G,
        num_pid_m,
        num_tiles,
        BM: gl.constexpr,
        BN: gl.constexpr,
        NUM_CONSUMERS: gl.constexpr,
        STAGES: gl.constexpr,
        QSTAGES: gl.constexpr,
        CAUSAL: gl.constexpr,
        LPT: gl.constexpr,
        DYNAMIC: gl.constexpr,
        ALIGN_END: gl.constexpr,
        SECTION: gl.constexpr,
    ):
        """Issue the TMA loads of tile t: its Q tile into Q stage qc, then its K/V blocks into
        the ring from slot kc on.  Returns the next ring counter."""
        q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = ring[:9]
        BM_TILE: gl.constexpr = BM * NUM_CONSUMERS
        pid_m, off_hz = _tile_coords(t, num_pid_m, num_tiles, CAUSAL, LPT, SECTION)
        off_m = _tile_start(pid_m, N, num_pid_m, BM, BM_TILE, ALIGN_END)
        # GQA: query head h reads K/V head h // G of the same batch.
        kv_row = (off_hz // H * (H // G) + (off_hz % H) // G) * N
        # Q tile (freed by every consumer after its epilogue)
        qs = qc % QSTAGES
        mbarrier.wait(q_empty.index(qs), ((qc // QSTAGES) & 1) ^ 1)
        if DYNAMIC:  # the consumers learn which tile this is from Q stage qs
            _publish_tile(ring[9], qs, t)
        mbarrier.expect(q_ready.index(qs), NUM_CONSUMERS * desc_q.block_type.nbytes)
        for c in gl.static_range(NUM_CONSUMERS):  # one [BM, d] tile per consumer warpgroup
            q_row = off_hz * N + off_m + c * BM
            if ALIGN_END:  # a slice before row 0 (skipped by its warpgroup): any rows will do
                q_row = gl.maximum(q_row, 0)
            tma.async_copy_global_to_shared(
                desc_q,
                [q_row, 0],
                q_ready.index(qs),
                q_bufs.index(qs * NUM_CONSUMERS + c),
            )
        # K/V ring: K and V of a block on their own barriers
        n_blocks = _kv_range(off_m, N, BM_TILE, BN, CAUSAL)
        for j in range(n_blocks):
            s = kc % STAGES
            ph = ((kc // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(s), ph)
            mbarrier.expect(k_ready.index(s), desc_k.block_type.nbytes)
            tma.async_copy_global_to_shared(
                desc_k, [kv_row + j * BN, 0], k_ready.index(s), k_bufs.index(s)
            )
            mbarrier.wait(v_empty.index(s), ph)
            mbarrier.expect(v_ready.index(s), desc_v.block_type.nbytes)
            tma.async_copy_global_to_shared(
                desc_v, [kv_row + j * BN, 0], v_ready.index(s), v_bufs.index(s)
            )
            kc += 1
        return kc

    @gluon.jit
    def _producer(
        desc_q,
        desc_k,
        desc_v,
        ring,
        sched_ptr,
        N,
        H,
        G,
        num_pid_m,
        num_tiles,
        BM: gl.constexpr,
        BN: gl.constexpr,
        NUM_CONSUMERS: gl.constexpr,
        STAGES: gl.constexpr,
        QSTAGES: gl.constexpr,
        CAUSAL: gl.constexpr,
        LPT: gl.constexpr,
        DYNAMIC: gl.constexpr,
        ALIGN_END: gl.constexpr,
        SECTION: gl.constexpr,
    ):
        # ring: the shared-memory Q tiles, K/V stages, their mbarriers (and, with DYNAMIC,
        # the tile id of each Q stage), one tuple
        kc = 0
        qc = 0
        if DYNAMIC:
            t = gl.program_id(0)
            while t < num_tiles:
                t_next = _draw_tile(sched_ptr)  # early: its latency hides behind the loads
                kc = _load_tile(
                    desc_q, desc_k, desc_v, ring, t, qc, kc, N, H, G, num_pid_m, num_tiles,
                    BM, BN, NUM_CONSUMERS, STAGES, QSTAGES, CAUSAL, LPT, DYNAMIC, ALIGN_END, SECTION,
                )  # fmt: skip
                qc += 1
                t = t_next
            _publish_stop(ring[9], ring[3], ring[4], qc, num_tiles, QSTAGES)
            _retire_scheduler(sched_ptr)
        else:
            for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
                kc = _load_tile(
                    desc_q, desc_k, desc_v, ring, t, qc, kc, N, H, G, num_pid_m, num_tiles,
                    BM, BN, NUM_CONSUMERS, STAGES, QSTAGES, CAUSAL, LPT, DYNAMIC, ALIGN_END, SECTION,
                )  # fmt: skip
                qc += 1  # noqa: SIM113  (a counter carried across tiles; no enumerate in a kernel)
