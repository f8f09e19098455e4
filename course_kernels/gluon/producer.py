"""The producer's side of FA3's forward schedule: layouts, the tile order, and the producer
warpgroup that only issues TMA loads (Q per tile, K/V into the ring). See :mod:`.forward`."""

from __future__ import annotations

from ._lang import HAVE_GLUON

if HAVE_GLUON:
    from ._lang import gl, gluon, mbarrier, tma

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

    # --------------------------------------------------------------- schedule
    @gluon.jit
    def _tile_coords(t, num_pid_m, num_tiles, CAUSAL: gl.constexpr, LPT: gl.constexpr):
        """Tile t -> (query block, batch*head).  Head-major so the CTAs running at
        the same time share one head's K/V in L2; under causal masking the
        heaviest block of each head (the last rows) comes first.  LPT (causal,
        persistent): heaviest blocks of ALL heads first (longest-processing-time
        order, better balance, less L2 sharing)."""
        if LPT:
            n_hz = num_tiles // num_pid_m
            off_hz = t % n_hz
            pid_m = num_pid_m - 1 - t // n_hz
        else:
            off_hz = t // num_pid_m
            r = t % num_pid_m
            if CAUSAL:  # noqa: SIM108  (constexpr branches read better in a kernel)
                pid_m = num_pid_m - 1 - r
            else:
                pid_m = r
        return pid_m, off_hz

    @gluon.jit
    def _kv_range(off_m_tile, N, BM_TILE: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
        """Number of K/V blocks a Q tile visits."""
        if CAUSAL:  # noqa: SIM108
            hi = gl.minimum(N, off_m_tile + BM_TILE)
        else:
            hi = N
        return gl.cdiv(hi, BN)

    # ---------------------------------------------------------------- producer
    @gluon.jit
    def _producer(
        desc_q,
        desc_k,
        desc_v,
        ring,
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
    ):
        # the shared-memory ring (Q tiles, K/V stages) and its mbarriers, one tuple
        q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = ring
        BM_TILE: gl.constexpr = BM * NUM_CONSUMERS
        kc = 0
        qc = 0
        for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            pid_m, off_hz = _tile_coords(t, num_pid_m, num_tiles, CAUSAL, LPT)
            off_m = pid_m * BM_TILE
            # GQA: query head h reads K/V head h // G of the same batch.
            kv_row = (off_hz // H * (H // G) + (off_hz % H) // G) * N
            # Q tile (freed by every consumer after its epilogue)
            qs = qc % QSTAGES
            mbarrier.wait(q_empty.index(qs), ((qc // QSTAGES) & 1) ^ 1)
            mbarrier.expect(q_ready.index(qs), NUM_CONSUMERS * desc_q.block_type.nbytes)
            for c in gl.static_range(NUM_CONSUMERS):  # one [BM, d] tile per consumer warpgroup
                tma.async_copy_global_to_shared(
                    desc_q,
                    [off_hz * N + off_m + c * BM, 0],
                    q_ready.index(qs),
                    q_bufs.index(qs * NUM_CONSUMERS + c),
                )
            qc += 1  # noqa: SIM113  (a counter carried across tiles; no enumerate in a kernel)
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
