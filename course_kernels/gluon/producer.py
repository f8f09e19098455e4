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
        _left_first,
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
        desc_q, desc_k, desc_v, ring, t, qc, kc, N, H, G, num_pid_m, num_tiles, left, cfg
    ):
        """Issue the TMA loads of tile t: its Q tile into Q stage qc, then its K/V blocks into
        the ring from slot kc on (``cfg``: the forward's Schedule; ``left``: the kernel's pair
        (a window's reach, each token's document start)).  Returns the next ring counter."""
        q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = ring[:9]
        NUM_CONSUMERS: gl.constexpr = cfg.NUM_CONSUMERS
        STAGES: gl.constexpr = cfg.STAGES
        QSTAGES: gl.constexpr = cfg.QSTAGES
        BM: gl.constexpr = cfg.BM
        BN: gl.constexpr = cfg.BN
        BM_TILE: gl.constexpr = BM * NUM_CONSUMERS
        pid_m, off_hz = _tile_coords(t, num_pid_m, num_tiles, cfg.CAUSAL, cfg.LPT, cfg.SECTION)
        off_m = _tile_start(pid_m, N, num_pid_m, BM, BM_TILE, cfg.ALIGN_END)
        # GQA: query head h reads K/V head h // G of the same batch.
        # PACKED: (total, H, d) seen as (total, H * d), a head a column block (B = 1)
        if cfg.PACKED:
            q_col, kv_row, kv_col = off_hz * cfg.HEAD_DIM, 0, off_hz // G * cfg.HEAD_DIM
        else:
            q_col, kv_col = 0, 0
            kv_row = (off_hz // H * (H // G) + (off_hz % H) // G) * N
        # Q tile (freed by every consumer after its epilogue)
        qs = qc % QSTAGES
        mbarrier.wait(q_empty.index(qs), ((qc // QSTAGES) & 1) ^ 1)
        if cfg.DYNAMIC:  # the consumers learn which tile this is from Q stage qs
            _publish_tile(ring[9], qs, t)
        mbarrier.expect(q_ready.index(qs), NUM_CONSUMERS * desc_q.block_type.nbytes)
        for c in gl.static_range(NUM_CONSUMERS):  # one [BM, d] tile per consumer warpgroup
            if cfg.PACKED:  # noqa: SIM108
                q_row = off_m + c * BM
            else:
                q_row = off_hz * N + off_m + c * BM
            if cfg.ALIGN_END:  # a slice before row 0 (skipped by its warpgroup): any rows will do
                q_row = gl.maximum(q_row, 0)
            tma.async_copy_global_to_shared(
                desc_q,
                [q_row, q_col],
                q_ready.index(qs),
                q_bufs.index(qs * NUM_CONSUMERS + c),
            )
        # K/V ring: K and V of a block on their own barriers; a sliding window or a document
        # starts at the block of the tile's first visible key
        n_blocks = _kv_range(off_m, N, BM_TILE, BN, cfg.CAUSAL)
        j_lo = _left_first(off_m, left, N, BN, cfg.DOCS) if cfg.WINDOW or cfg.DOCS else 0
        for j in range(j_lo, n_blocks):
            s = kc % STAGES
            ph = ((kc // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(s), ph)
            mbarrier.expect(k_ready.index(s), desc_k.block_type.nbytes)
            tma.async_copy_global_to_shared(
                desc_k, [kv_row + j * BN, kv_col], k_ready.index(s), k_bufs.index(s)
            )
            mbarrier.wait(v_empty.index(s), ph)
            mbarrier.expect(v_ready.index(s), desc_v.block_type.nbytes)
            tma.async_copy_global_to_shared(
                desc_v, [kv_row + j * BN, kv_col], v_ready.index(s), v_bufs.index(s)
            )
            kc += 1
        return kc

    @gluon.jit
    def _producer(
        desc_q, desc_k, desc_v, ring, sched_ptr, N, H, G, num_pid_m, num_tiles, left, cfg
    ):
        # ring: the shared-memory Q tiles, K/V stages, their mbarriers (and, with DYNAMIC,
        # the tile id of each Q stage), one tuple; cfg: the forward's Schedule
        kc = 0
        qc = 0
        if cfg.DYNAMIC:
            t = gl.program_id(0)
            while t < num_tiles:
                t_next = _draw_tile(sched_ptr)  # early: its latency hides behind the loads
                kc = _load_tile(
                    desc_q, desc_k, desc_v, ring, t, qc, kc, N, H, G, num_pid_m, num_tiles,
                    left, cfg,
                )  # fmt: skip
                qc += 1
                t = t_next
            _publish_stop(ring[9], ring[3], ring[4], qc, num_tiles, cfg.QSTAGES)
            _retire_scheduler(sched_ptr)
        else:
            for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
                kc = _load_tile(
                    desc_q, desc_k, desc_v, ring, t, qc, kc, N, H, G, num_pid_m, num_tiles,
                    left, cfg,
                )  # fmt: skip
                qc += 1  # noqa: SIM113  (a counter carried across tiles; no enumerate in a kernel)
