"""The producer's side of FA3's schedule: layouts, the K/V blocks a forward tile visits (which the
producer loads and its consumers compute: ``_kv_range``, the window's and documents' first and
masked blocks), and the producer warpgroups that only issue TMA loads: the forward's (Q per
tile, K/V into the ring; :mod:`.forward`) and the backward's (K/V per key block, then Q, dO,
L, D into the ring; :mod:`.backward`). The tile order, the dynamic scheduler and the backward's
query-block ranges are in :mod:`.scheduler`."""

from __future__ import annotations

from ._lang import HAVE_GLUON

if HAVE_GLUON:
    from ._lang import gl, gluon, mbarrier, tma
    from .scheduler import _draw_tile, _publish_stop, _publish_tile, _retire_scheduler
    from .scheduler import _tile_coords
    from .scheduler import _after, _bwd_block, _bwd_runs, _bwd_tile, _q_range

    KEYS = gl.constexpr(64)  # the backward: keys per consumer warpgroup (the wgmma's M)

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

    # ------------------------------------------- the K/V blocks of a forward tile
    @gluon.jit
    def _tile_start(
        pid_m, N, num_pid_m, BM: gl.constexpr, BM_TILE: gl.constexpr, ALIGN_END: gl.constexpr
    ):
        """First row of query tile pid_m.  ALIGN_END: the tiles end at the last 64-row block
        instead of starting at row 0, so the partial tile is the first (under causal masking
        the lightest) one, and its first warpgroups' rows lie before row 0 (they skip the tile)."""
        off = pid_m * BM_TILE
        if ALIGN_END:
            off -= num_pid_m * BM_TILE - gl.cdiv(N, BM) * BM
        return off

    @gluon.jit
    def _live_blocks(off_m, N, n_blocks, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
        """K/V blocks [0, n) a warpgroup with rows [off_m, off_m + BM) has to compute: none if
        all its rows lie outside [0, N), under causal masking none past its last row."""
        n = n_blocks
        if CAUSAL:
            n = gl.minimum(n, gl.cdiv(gl.minimum(N, off_m + BM), BN))
        live = (off_m >= 0) & (off_m < N)
        return n * live.to(gl.int32)

    @gluon.jit
    def _kv_range(off_m_tile, N, BM_TILE: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
        """Number of K/V blocks a Q tile visits."""
        if CAUSAL:  # noqa: SIM108
            hi = gl.minimum(N, off_m_tile + BM_TILE)
        else:
            hi = N
        return gl.cdiv(hi, BN)

    @gluon.jit
    def _window_first(off_m, win_left, BN: gl.constexpr):
        """Sliding window (causal, row i sees keys [i - win_left, i]): the first K/V block that
        rows [off_m, ...) can see. Plain integer arithmetic (CPU tests run it on ints)."""
        first = off_m - win_left
        if first < 0:
            first = 0
        return first // BN

    @gluon.jit
    def _window_mid(off_m, win_left, j0, n_live, BM: gl.constexpr, BN: gl.constexpr):
        """Sliding window: the end of the blocks [j0, j_mid) masked on their left for rows
        [off_m, off_m + BM) (those that hold a key before the last row's first one; block j0,
        the prologue's, is always masked), clipped to [j0 + 1, n_live]. Plain integer arithmetic."""
        last_first = off_m + BM - 1 - win_left  # the last row's first visible key
        if last_first < 0:
            last_first = 0
        return _edge_mid(last_first, j0, n_live, BN)

    @gluon.jit
    def _edge_mid(last_first, j0, n_live, BN: gl.constexpr):
        """The end of the left-masked blocks [j0, j_mid) of rows whose last row sees keys from
        ``last_first`` on (a window's or a document's left edge: every earlier row's first key
        is at or before it), clipped to [j0 + 1, n_live]. Plain integer arithmetic."""
        j_mid = (last_first + BN - 1) // BN
        if j_mid < j0 + 1:
            j_mid = j0 + 1
        if j_mid > n_live:
            j_mid = n_live
        return j_mid

    @gluon.jit
    def _left_first(off_m, left, N, BN: gl.constexpr, DOCS: gl.constexpr):
        """The first K/V block rows [off_m, ...) can see: a sliding window's (``left[0]`` keys
        before the diagonal) or, with DOCS (documents packed into one sequence), the block of the
        first row's document start (``left[1]``: each token's document start, int32)."""
        if DOCS:
            first = gl.load(left[1] + gl.minimum(off_m, N - 1)) // BN
        else:
            first = _window_first(off_m, left[0], BN)
        return first

    @gluon.jit
    def _left_mid(
        off_m, left, N, j0, n_live, BM: gl.constexpr, BN: gl.constexpr, DOCS: gl.constexpr
    ):
        """:func:`_window_mid`, or with DOCS :func:`_edge_mid` of the last row's document start."""
        if DOCS:
            j_mid = _edge_mid(gl.load(left[1] + gl.minimum(off_m + BM - 1, N - 1)), j0, n_live, BN)
        else:
            j_mid = _window_mid(off_m, left[0], j0, n_live, BM, BN)
        return j_mid

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
        pid_m, off_hz = _tile_coords(
            t, num_pid_m, num_tiles, cfg.CAUSAL, cfg.LPT, cfg.SECTION, cfg.DEFER
        )
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

    # ------------------------------------------------------------ the backward's producer
    @gluon.jit
    def _bwd_producer(
        desc_q, desc_k, desc_v, desc_do, desc_lse, desc_d, ring, N, N_PAD, win_left, kend_ptr,
        n_heads, cfg,
    ):  # fmt: skip
        """One tile (key block, head), or with PERSIST (session 21) the tiles pid, pid + grid,
        ... (key blocks fastest, the plain grid's order): K/V of the next tile are loaded once the
        consumers are done with the last one's (kv_bars[1]), so the load overlaps their epilogue;
        the ring's step count runs on across tiles (each run's base lowered by step0)."""
        BN: gl.constexpr = KEYS * cfg.NUM_CONSUMERS
        args = (desc_q, desc_k, desc_v, desc_do, desc_lse, desc_d, ring, N, N_PAD, win_left)
        if cfg.PERSIST:
            n_kb = gl.cdiv(N, BN)
            step0 = gl.program_id(0) * 0
            it = gl.program_id(0) * 0
            for tile in range(gl.program_id(0), n_kb * n_heads, gl.num_programs(0)):
                mbarrier.wait(ring[9].index(1), (it & 1) ^ 1)  # K, V of the last tile released
                step0 += _bwd_produce(args, kend_ptr, (tile % n_kb) * BN, tile // n_kb, step0, cfg)
                it += 1
        else:
            n0, hz, _heads = _bwd_tile(N, BN, cfg.SECTION, cfg.TAIL)
            _bwd_produce(args, kend_ptr, n0, hz, 0, cfg)

    @gluon.jit
    def _bwd_produce(args, kend_ptr, n0, hz, step0, cfg):
        """The producer's loads of one tile: K and V, then (Q, dO, L, D) of its query blocks;
        returns how many ring steps it took."""
        desc_q, desc_k, desc_v, desc_do, desc_lse, desc_d, ring, N, N_PAD, win_left = args
        BM: gl.constexpr = cfg.BM
        NUM_CONSUMERS: gl.constexpr = cfg.NUM_CONSUMERS
        STAGES: gl.constexpr = cfg.STAGES
        CAUSAL: gl.constexpr = cfg.CAUSAL
        MASKED_LAST: gl.constexpr = cfg.MASKED_LAST
        ROTATE: gl.constexpr = cfg.ROTATE
        WINDOW: gl.constexpr = cfg.WINDOW
        DOCS: gl.constexpr = cfg.DOCS
        PACKED: gl.constexpr = cfg.PACKED
        _q, _do, _l, _d, k_bufs, v_bufs, _ds, _qr, _qe, kv_ready, _dsb = ring
        BN: gl.constexpr = KEYS * NUM_CONSUMERS
        rowp = hz * N_PAD  # the same head's first row in the padded L, D
        kvz = hz // cfg.GROUP  # its K/V head (GQA: GROUP query heads share one; 1: kvz = hz)
        if PACKED:  # (total, H x d) views: token rows, the head's d columns
            row0, kv_row0 = hz * 0, hz * 0
            col0, kv_col0 = hz * desc_k.block_type.shape[1], kvz * desc_k.block_type.shape[1]
        else:  # first row of this (batch, head) in the flat tensors
            row0, kv_row0 = hz * N, kvz * N
            col0, kv_col0 = 0, 0
        # K and V of the key block, once: one [64, d] slice per consumer warpgroup
        mbarrier.expect(
            kv_ready.index(0), NUM_CONSUMERS * 2 * desc_k.block_type.nbytes
        )  # fmt: skip
        for c in gl.static_range(NUM_CONSUMERS):
            tma.async_copy_global_to_shared(
                desc_k, [kv_row0 + n0 + c * KEYS, kv_col0], kv_ready.index(0), k_bufs.index(c)
            )
            tma.async_copy_global_to_shared(
                desc_v, [kv_row0 + n0 + c * KEYS, kv_col0], kv_ready.index(0), v_bufs.index(c)
            )
        lo, mid, far, hi = _q_range(n0, N, win_left, kend_ptr, BM, BN, CAUSAL, WINDOW, DOCS)
        if MASKED_LAST:  # the consumers' order (``_bwd_runs``): unmasked blocks first
            run0, run1, run2 = _after(_bwd_runs(lo, mid, far, hi, n0 // BM, MASKED_LAST, ROTATE),
                                      step0)  # fmt: skip
            _bwd_loads(desc_q, desc_do, desc_lse, desc_d, ring, run0, row0, col0, rowp, BM,
                       STAGES, ROTATE)  # fmt: skip
            _bwd_loads(desc_q, desc_do, desc_lse, desc_d, ring, run1, row0, col0, rowp, BM,
                       STAGES, False)  # fmt: skip
            if WINDOW or DOCS:  # the far edge (window, document end), masked
                _bwd_loads(desc_q, desc_do, desc_lse, desc_d, ring, run2, row0, col0, rowp, BM,
                           STAGES, False)  # fmt: skip
        else:  # the same order as the consumers' runs, in one loop
            _bwd_loads(desc_q, desc_do, desc_lse, desc_d, ring, (lo, hi, lo - step0, 0), row0,
                       col0, rowp, BM, STAGES, False)  # fmt: skip
        return hi - lo

    @gluon.jit
    def _bwd_loads(
        desc_q, desc_do, desc_lse, desc_d, ring, run, row0, col0, rowp, BM: gl.constexpr,
        STAGES: gl.constexpr, ROT: gl.constexpr,
    ):  # fmt: skip
        """(Q_i, dO_i, L_i log2 e, D_i) of the query blocks of one run (``_bwd_runs``) into
        their ring slots (the consumers take them in the same order)."""
        q_bufs, do_bufs, l_bufs, d_bufs, _k, _v, _ds, q_ready, q_empty, _kv, _dsb = ring
        start, stop, base, shift = run
        for t in range(start, stop):
            jc = t - base
            i = _bwd_block(t, start, stop, shift, ROT)
            s = jc % STAGES
            mbarrier.wait(q_empty.index(s), ((jc // STAGES) & 1) ^ 1)
            mbarrier.expect(
                q_ready.index(s), desc_q.block_type.nbytes + desc_do.block_type.nbytes
                + desc_lse.block_type.nbytes + desc_d.block_type.nbytes,
            )  # fmt: skip
            tma.async_copy_global_to_shared(
                desc_q, [row0 + i * BM, col0], q_ready.index(s), q_bufs.index(s)
            )
            tma.async_copy_global_to_shared(
                desc_do, [row0 + i * BM, col0], q_ready.index(s), do_bufs.index(s)
            )
            tma.async_copy_global_to_shared(
                desc_lse, [rowp + i * BM], q_ready.index(s), l_bufs.index(s)
            )
            tma.async_copy_global_to_shared(
                desc_d, [rowp + i * BM], q_ready.index(s), d_bufs.index(s)
            )
