"""The consumers' side of FA3's forward schedule: one tile's main loop over its K/V blocks
(the steps are in :mod:`.steps`), the epilogue (O / l, TMA store, the logsumexp), and the loop over
tiles (a static stride, or the tiles the producer draws from the dynamic scheduler of
:mod:`.scheduler`). See :mod:`.forward`."""

from __future__ import annotations

from ._lang import HAVE_GLUON

if HAVE_GLUON:
    from ._lang import fence_async_shared, gl, gluon, mbarrier, tma, warpgroup_mma_wait
    from .producer import _kv_range, _left_first, _left_mid, _live_blocks
    from .producer import _mma_layout, _tile_start
    from .scheduler import _read_tile, _tile_coords
    from .steps import (
        _mask_first,
        _overlap_blocks,
        _p_operand,
        _pass_turn,
        _pv,
        _qk,
        _serial_blocks,
        _skip_blocks,
        _softmax,
        _take_turn,
    )

    # ---------------------------------------------------------------- epilogue
    @gluon.jit
    def _epilogue(
        acc,
        m_i,
        l_i,
        o_smem,
        desc_o,
        o_ptr,
        lse_ptr,
        off_hz,
        off_m,
        N,
        BM: gl.constexpr,
        HEAD_DIM: gl.constexpr,
        dtype: gl.constexpr,
        s_layout: gl.constexpr,
        o_layout: gl.constexpr,
        O_STAGE: gl.constexpr = False,
        PACKED: gl.constexpr = False,
    ):
        """O / l and its store, the logsumexp. O goes through o_smem by TMA: the warpgroup's
        slice of the (dead) Q buffer, waited for at once since the producer refills it; or, with
        O_STAGE, its own staging tile, waited for only before the next tile overwrites it (the
        store then runs under the next tile's first blocks; FA3's epilogue). PACKED: O is
        (total, H, d) seen as (total, H * d), a head a column block; the TMA store clips the rows
        past the sequence's end, so the tail tile needs no masked store."""
        o = acc * gl.convert_layout(1.0 / l_i, gl.SliceLayout(1, o_layout))[:, None]
        o = o.to(dtype)
        rows = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        lse = (
            m_i + gl.log2(l_i)
        ) * 0.6931471805599453  # natural-log lse: base-2 lse * ln 2 (reference.LN2)
        gl.store(lse_ptr + off_hz * N + rows, lse, mask=rows < N)
        if PACKED or off_m + BM <= N:
            if O_STAGE:
                tma.store_wait(pendings=0)  # the previous tile's O has left o_smem
            o_smem.store(o)
            fence_async_shared()
            if PACKED:
                tma.async_copy_shared_to_global(desc_o, [off_m, off_hz * HEAD_DIM], o_smem)
            else:
                tma.async_copy_shared_to_global(desc_o, [off_hz * N + off_m, 0], o_smem)
            if not O_STAGE:
                tma.store_wait(pendings=0)
        else:  # tail tile: a TMA store would spill into the next head's rows
            orow = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
            ocol = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
            ptrs = o_ptr + (off_hz * N + orow).to(gl.int64)[:, None] * HEAD_DIM + ocol[None, :]
            gl.store(ptrs, o, mask=(orow < N)[:, None])

    # ---------------------------------------------------------------- consumer
    @gluon.jit
    def _tile_blocks(
        desc_o, o_ptr, lse_ptr, bufs, kc, j0, j_mid, n_free, n_blocks, off_hz, off_m, N,
        qk_scale, left, o_smem, cfg,
    ):  # fmt: skip
        """One warpgroup's K/V blocks [j0, n_blocks) of a tile from ring slot kc, and its
        epilogue (O staged in o_smem). Block j0 (the prologue's) and [j0 + 1, j_mid) (a sliding
        window's or a document's left edge) and [max(n_free, j_mid), n_blocks) (the diagonal and
        the sequence's end) are masked; [j_mid, n_free) are not. Returns the next ring slot."""
        q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = bufs[:7]
        BM: gl.constexpr = cfg.BM
        BN: gl.constexpr = cfg.BN
        HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
        STAGES: gl.constexpr = cfg.STAGES
        ROW_MASK: gl.constexpr = cfg.ROW_MASK
        dtype: gl.constexpr = desc_o.dtype
        s_layout: gl.constexpr = _mma_layout(BM, BN, dtype)
        o_layout: gl.constexpr = _mma_layout(BM, HEAD_DIM, dtype)
        m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.full([BM], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BM, HEAD_DIM], gl.float32, layout=o_layout)
        if cfg.OVERLAP:
            # prologue: block j0 (always masked: covers N < BN, the diagonal and a window's left
            # edge; ROW_MASK (no window): by one compare per score, which keeps all of it where
            # this warpgroup's rows see it all)
            _take_turn(bufs, kc, cfg)
            qk = _qk(q_smem, k_bufs, k_ready, kc, STAGES, BM, BN, s_layout)
            _pass_turn(bufs, cfg)
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
            mbarrier.arrive(k_empty.index(kc % STAGES), count=1)
            if ROW_MASK:
                qk = _mask_first(qk, n_free, off_m, N, cfg.CAUSAL, BM, BN, s_layout)
            p, alpha, m_i, l_i = _softmax(
                qk, m_i, l_i, qk_scale, j0 * BN, off_m, N, left, not ROW_MASK, cfg, s_layout
            )
            p = _p_operand(p, dtype, o_layout, cfg.PACK_P)
            kc += 1
            if cfg.WINDOW or cfg.DOCS:  # the window's (a document's) left edge
                kc, acc, p, m_i, l_i = _overlap_blocks(
                    bufs, kc, acc, p, m_i, l_i, j0 + 1, j_mid, qk_scale, off_m, N, left, True,
                    cfg, dtype, s_layout, o_layout,
                )  # fmt: skip
            kc, acc, p, m_i, l_i = _overlap_blocks(
                bufs, kc, acc, p, m_i, l_i, j_mid, gl.maximum(n_free, j_mid), qk_scale, off_m, N,
                left, False, cfg, dtype, s_layout, o_layout,
            )  # fmt: skip
            kc, acc, p, m_i, l_i = _overlap_blocks(
                bufs, kc, acc, p, m_i, l_i, gl.maximum(n_free, j_mid), n_blocks, qk_scale, off_m, N,
                left, True, cfg, dtype, s_layout, o_layout,
            )  # fmt: skip
            # drain: PV of the last block
            acc = _pv(p, acc, v_bufs, v_ready, kc - 1, STAGES)
            acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
            mbarrier.arrive(v_empty.index((kc - 1) % STAGES), count=1)
        else:  # serial: [j0, j_mid) masked (a window's left edge), then as without a window
            j_lo = j0
            if cfg.WINDOW or cfg.DOCS:
                kc, acc, m_i, l_i = _serial_blocks(
                    bufs, kc, acc, m_i, l_i, j0, j_mid, qk_scale, off_m, N, left, True,
                    cfg, dtype, s_layout, o_layout,
                )  # fmt: skip
                j_lo = j_mid
                n_free = gl.maximum(n_free, j_mid)
            kc, acc, m_i, l_i = _serial_blocks(
                bufs, kc, acc, m_i, l_i, j_lo, n_free, qk_scale, off_m, N, left, False,
                cfg, dtype, s_layout, o_layout,
            )  # fmt: skip
            kc, acc, m_i, l_i = _serial_blocks(
                bufs, kc, acc, m_i, l_i, n_free, n_blocks, qk_scale, off_m, N, left, True,
                cfg, dtype, s_layout, o_layout,
            )  # fmt: skip
        _epilogue(
            acc, m_i, l_i, o_smem, desc_o, o_ptr, lse_ptr, off_hz, off_m, N,
            BM, HEAD_DIM, dtype, s_layout, o_layout, cfg.O_STAGE, cfg.PACKED,
        )  # fmt: skip
        return kc

    @gluon.jit
    def _consumer_tile(
        desc_o, o_ptr, lse_ptr, ring, t, qc, kc, N, qk_scale, num_pid_m, num_tiles, left,
        CID: gl.constexpr, cfg,
    ):  # fmt: skip
        """Tile t for this warpgroup (its 64-row slice CID): the main loop over the K/V ring
        from slot kc, the epilogue, and the release of Q stage qc.  Returns the next ring slot."""
        q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = ring[:9]
        BM: gl.constexpr = cfg.BM
        BN: gl.constexpr = cfg.BN
        NUM_CONSUMERS: gl.constexpr = cfg.NUM_CONSUMERS
        QSTAGES: gl.constexpr = cfg.QSTAGES
        CAUSAL: gl.constexpr = cfg.CAUSAL
        BM_TILE: gl.constexpr = BM * NUM_CONSUMERS
        pid_m, off_hz = _tile_coords(
            t, num_pid_m, num_tiles, CAUSAL, cfg.LPT, cfg.SECTION, cfg.DEFER
        )
        off_m_tile = _tile_start(pid_m, N, num_pid_m, BM, BM_TILE, cfg.ALIGN_END)
        off_m = off_m_tile + CID * BM  # this warpgroup's rows
        n_blocks = _kv_range(off_m_tile, N, BM_TILE, BN, CAUSAL)
        # blocks [0, n_free) need no mask for this warpgroup's rows
        n_free = N // BN
        if CAUSAL:
            n_free = gl.minimum(n_free, off_m // BN)
        n_free = gl.minimum(n_free, n_blocks)

        qs = qc % QSTAGES
        mbarrier.wait(q_ready.index(qs), (qc // QSTAGES) & 1)
        q_smem = q_bufs.index(qs * NUM_CONSUMERS + CID)
        bufs = (q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty)  # one block's operands
        if cfg.PINGPONG:  # + this consumer's turn barrier and the next one's (ring's last)
            turns = ring[len(ring) - 1]
            bufs = bufs + (turns.index(CID), turns.index((CID + 1) % NUM_CONSUMERS))
        # O staged in this warpgroup's (then dead) slice of the Q buffer, or (O_STAGE) in its own
        o_last: gl.constexpr = len(ring) - 2 if cfg.PINGPONG else len(ring) - 1
        o_smem = ring[o_last].index(CID) if cfg.O_STAGE else q_smem

        if (
            cfg.WINDOW or cfg.DOCS
        ):  # the tile's blocks [j_lo, n_blocks); this warpgroup's [j0, n_live)
            j_lo = _left_first(off_m_tile, left, N, BN, cfg.DOCS)
            j0 = _left_first(off_m, left, N, BN, cfg.DOCS)
            n_live = _live_blocks(off_m, N, n_blocks, BM, BN, CAUSAL)
            if n_live > j0:
                kc = _skip_blocks(bufs, kc, j0 - j_lo, cfg)
                j_mid = _left_mid(off_m, left, N, j0, n_live, BM, BN, cfg.DOCS)
                kc = _tile_blocks(
                    desc_o, o_ptr, lse_ptr, bufs, kc, j0, j_mid, gl.minimum(n_free, n_live),
                    n_live, off_hz, off_m, N, qk_scale, left, o_smem, cfg,
                )  # fmt: skip
                kc = _skip_blocks(bufs, kc, n_blocks - n_live, cfg)
            else:  # rows past N (or before row 0): nothing to compute
                kc = _skip_blocks(bufs, kc, n_blocks - j_lo, cfg)
        elif cfg.SKIP_DEAD or cfg.ALIGN_END:  # only the blocks this warpgroup's rows can see
            n_live = _live_blocks(off_m, N, n_blocks, BM, BN, CAUSAL)
            if n_live > 0:
                kc = _tile_blocks(
                    desc_o, o_ptr, lse_ptr, bufs, kc, 0, 1, gl.minimum(n_free, n_live), n_live,
                    off_hz, off_m, N, qk_scale, left, o_smem, cfg,
                )  # fmt: skip
            kc = _skip_blocks(bufs, kc, n_blocks - n_live, cfg)
        else:
            kc = _tile_blocks(
                desc_o, o_ptr, lse_ptr, bufs, kc, 0, 1, n_free, n_blocks, off_hz, off_m, N,
                qk_scale, left, o_smem, cfg,
            )  # fmt: skip
        mbarrier.arrive(q_empty.index(qs), count=1)
        return kc

    @gluon.jit
    def _consumer(
        desc_o, o_ptr, lse_ptr, ring, N, qk_scale, num_pid_m, num_tiles, left,
        CID: gl.constexpr, cfg,
    ):  # fmt: skip
        # ring: the shared-memory Q tiles, K/V stages, their mbarriers (and, with DYNAMIC,
        # the tile id of each Q stage), one tuple; cfg: the forward's Schedule
        kc = 0
        qc = 0
        if cfg.DYNAMIC:  # the tiles the producer drew, until it publishes num_tiles
            t = _read_tile(ring[9], ring[3], qc, cfg.QSTAGES)
            while t < num_tiles:
                kc = _consumer_tile(
                    desc_o, o_ptr, lse_ptr, ring, t, qc, kc, N, qk_scale, num_pid_m, num_tiles,
                    left, CID, cfg,
                )  # fmt: skip
                qc += 1
                t = _read_tile(ring[9], ring[3], qc, cfg.QSTAGES)
        else:
            for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
                kc = _consumer_tile(
                    desc_o, o_ptr, lse_ptr, ring, t, qc, kc, N, qk_scale, num_pid_m, num_tiles,
                    left, CID, cfg,
                )  # fmt: skip
                qc += 1  # noqa: SIM113  (a counter carried across tiles; no enumerate in a kernel)
        if cfg.O_STAGE:  # the last tile's O store, before the CTA's shared memory goes away
            tma.store_wait(pendings=0)
