"""The Gluon backward's consumer work per query block (:mod:`.backward`; which blocks a key block
visits and in what order is :mod:`.scheduler`'s): ``_bwd_step``
(S^T, P^T, dP^T, dS^T, dV, dK of one query block), ``_bwd_dq`` (its dQ wgmma(s) and atomics),
and session 9's lever (b), ``OVERLAP_DQ``: the last dQ chunk of block i left in flight, waited
and added by ``_bwd_dq_flush`` after block i+1's S^T / dP^T wgmmas are issued (design in
notes/gluon_backward.md, "Session 9: lever (b)").
"""

from __future__ import annotations

from ._lang import HAVE_GLUON


class DqVecBases(dict):
    """The bases (as ``gl.DistributedLinearLayout`` takes them, coordinates [row, col]) of the
    ``DQ_VEC = 4`` layout of a [BM, cols] fp32 dQ partial: the wgmma accumulator layout (4 warps
    of 16 rows, +64 rows in registers at BM = 128; lane = 4 (row % 8) + (col % 8) // 2; the
    registers hold col % 2, row bit 8 and col // 8) with its register basis "row + 8" swapped for
    the lane basis "col + 2". So every thread owns 4 contiguous columns (one 16-byte
    ``red.global.add.v4.f32``), every warp owns the same elements as in the accumulator (the
    conversion is warp shuffles, no shared memory), and one warp instruction covers 16 rows x 8
    columns: 16 whole 32-byte sectors (the accumulator layout's ``.v2`` covers 8 rows).
    A dict subclass, not a function: Triton's jit dependency scan refuses plain functions
    referenced from a ``constexpr_function``; this one is plain Python for the CPU tests."""

    def __init__(self, BM: int, cols: int):
        if BM not in (64, 128) or cols < 8 or cols & (cols - 1):
            raise ValueError(f"BM in (64, 128) and cols a power of two >= 8, got {BM}, {cols}")
        reg = [[0, 1], [0, 2]] + [[0, 1 << b] for b in range(3, cols.bit_length() - 1)]
        if BM == 128:
            reg.append([64, 0])
        lanes = [[8, 0], [0, 4], [1, 0], [2, 0], [4, 0]]
        super().__init__(reg_bases=reg, lane_bases=lanes, warp_bases=[[16, 0], [32, 0]],
                         block_bases=[], shape=[BM, cols])  # fmt: skip


if HAVE_GLUON:
    from ._lang import fence_async_shared, gl, gluon, mbarrier, tma, tma_reduce_add
    from ._lang import warpgroup_mma
    from ._lang import warpgroup_mma_wait
    from .producer import KEYS, _a_operand_layout, _mma_layout

    @gluon.constexpr_function
    def _dq_vec_layout(BM, cols):
        return gl.DistributedLinearLayout(**DqVecBases(BM, cols))

    # ------------------------------------------------------------ consumer step
    @gluon.jit
    def _reach(key, N, win_left, kend_ptr, WINDOW: gl.constexpr, DOCS: gl.constexpr):
        """How many queries from key k on see it, per key row: win_left + 1 in a causal sliding
        WINDOW (session 14), the end of k's document minus k for packed DOCS, 2**30 (all) for
        plain causal; 0 for a key past N (its row belongs to the next head or is TMA's zeros)."""
        ok = key < N
        if WINDOW:
            return gl.where(ok, gl.minimum(win_left, N) + 1, 0)
        elif DOCS:
            return gl.where(ok, gl.load(kend_ptr + key, mask=ok, other=0) - key, 0)
        else:
            return gl.where(ok, 1 << 30, 0)

    @gluon.jit
    def _keep_seen(pT, qrow, key, reach, layout: gl.constexpr):
        """P^T with the pairs no query sees set to 0: kept where 0 <= q - k < reach(k), one
        unsigned compare (a negative q - k wraps above any reach) and one select an element, in
        inline PTX (session 16). Written as ``gl.where`` the 32 compares of a thread become one
        LLVM ``<32 x i1>`` vector, which the PTX backend packs into bits and unpacks again: about
        a hundred instructions more a masked step (10-13% of it, notes/gluon_backward.md)."""
        zero = gl.zeros(pT.shape, gl.int32, layout=layout)
        return gl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b32 t; sub.s32 t, $1, $2; setp.lt.u32 p, t, $3; "
            "selp.f32 $0, $4, 0f00000000, p; }",
            "=r,r,r,r,r", [qrow[None, :] + zero, key[:, None] + zero, reach[:, None] + zero, pT],
            dtype=gl.float32, is_pure=True, pack=1,
        )  # fmt: skip

    @gluon.jit
    def _wg_sees(i, k0, N, win_left, kend_ptr, BM: gl.constexpr, WINDOW: gl.constexpr,
                 DOCS: gl.constexpr):  # fmt: skip
        """WG_MASK (session 24), causal calls: (none, every): query block i's rows [i BM, i BM +
        BM) see none of this warpgroup's keys [k0, k0 + 64), or every pair of them, by the rule
        ``_keep_seen`` applies (0 <= q - k < reach(k)); kend_ptr[k] never decreases with k (the
        documents are packed in order). Rows past N need neither: their P is 0 from L = +inf."""
        top = i * BM
        bottom = top + BM - 1
        last = k0 + KEYS - 1
        none = (bottom < k0) | (k0 >= N)
        every = (top >= last) & (last < N)
        if WINDOW:
            w = gl.minimum(win_left, N)
            none = none | (top - last > w)
            every = every & (bottom - k0 <= w)
        elif DOCS:
            none = none | (top >= gl.load(kend_ptr + gl.minimum(last, N - 1)))
            every = every & (bottom < gl.load(kend_ptr + gl.minimum(k0, N - 1)))
        return none, every

    @gluon.jit
    def _bwd_step(
        bufs, jc, i, dk, dv, dq_ptr, row0, k0, N, win_left, kend_ptr, qk_scale,
        MASK: gl.constexpr, dtype: gl.constexpr, CID: gl.constexpr, cfg,
    ):  # fmt: skip
        """Query block i (ring slot jc) for this warpgroup's 64 keys starting at k0. dq_ptr: the
        fp32 dQ (a pointer), or with DQ_TMA a (tensor descriptor, staging tiles) pair.
        WG_MASK (session 24): a masked run's step is chosen per warpgroup, not per CTA: a block
        whose rows see none of this warpgroup's keys takes ``_bwd_dead`` (no wgmma of its own),
        one that sees all of them the unmasked step, the rest the masked one."""
        q_ready = bufs[7]
        s = jc % cfg.STAGES
        mbarrier.wait(q_ready.index(s), (jc // cfg.STAGES) & 1)
        if MASK == 2:  # WG_MASK = 2 (session 25): a dead segment of this warpgroup's run
            _bwd_dead(bufs, s, jc, i, dq_ptr, row0, N, dtype, CID, cfg)
        elif cfg.WG_MASK == 1 and MASK and cfg.CAUSAL:
            none, every = _wg_sees(i, k0, N, win_left, kend_ptr, cfg.BM, cfg.WINDOW, cfg.DOCS)
            if none:
                _bwd_dead(bufs, s, jc, i, dq_ptr, row0, N, dtype, CID, cfg)
            else:
                dk, dv = _bwd_live(
                    bufs, s, jc, i, dk, dv, dq_ptr, row0, k0, N, win_left, kend_ptr, qk_scale,
                    MASK, ~every, dtype, CID, cfg,
                )  # fmt: skip
        else:
            dk, dv = _bwd_live(
                bufs, s, jc, i, dk, dv, dq_ptr, row0, k0, N, win_left, kend_ptr, qk_scale, MASK,
                True, dtype, CID, cfg,
            )  # fmt: skip
        return dk, dv

    @gluon.jit
    def _bwd_dead(bufs, s, jc, i, dq_ptr, row0, N, dtype: gl.constexpr, CID: gl.constexpr, cfg):
        """WG_MASK: a step whose rows see none of this warpgroup's keys. P = dS = 0, so dK and
        dV keep their values and its dS^T tile is zeros; it issues no S^T, dP^T, dV or dK
        wgmma, but keeps ``_bwd_live``'s protocol: the dS exchange (ds_bars), the ring slot's
        release (q_empty) and its share of the block's dQ, which the other warpgroup's keys may
        feed."""
        BM: gl.constexpr = cfg.BM
        DQ_SHARED: gl.constexpr = cfg.DQ_SHARED
        ds_bufs, k_bufs, q_empty, ds_bars = bufs[6], bufs[4], bufs[8], bufs[9]
        if DQ_SHARED:  # both consumers' dQ wgmmas of the previous block have read our dS^T tile
            mbarrier.wait(ds_bars.index(1), (jc & 1) ^ 1)
        st_layout: gl.constexpr = _mma_layout(KEYS, BM, dtype)
        ds_bufs.index(CID).store(gl.zeros([KEYS, BM], dtype, layout=st_layout))
        fence_async_shared()
        gl.thread_barrier()
        if DQ_SHARED:
            mbarrier.arrive(ds_bars.index(0), count=1)
        mbarrier.arrive(q_empty.index(s), count=1)
        _bwd_dq(
            ds_bufs, k_bufs, ds_bars, jc, i, dq_ptr, row0, N, BM, cfg.HEAD_DIM, cfg.DQ_SPLIT,
            dtype, CID, cfg.NUM_CONSUMERS, cfg.DQ_VEC, DQ_SHARED, cfg.DQ_TMA,
        )  # fmt: skip

    @gluon.jit
    def _bwd_live(
        bufs, s, jc, i, dk, dv, dq_ptr, row0, k0, N, win_left, kend_ptr, qk_scale,
        MASK: gl.constexpr, need, dtype: gl.constexpr, CID: gl.constexpr, cfg,
    ):  # fmt: skip
        """The step proper, its Q/dO slot s filled. ``need`` (WG_MASK only): the mask applies.
        DV_EARLY (session 13, FA3's order): dV += P^T dO issued as soon as P^T is known, before
        the wait for dP^T, so that it runs while dS^T is computed."""
        CAUSAL: gl.constexpr = cfg.CAUSAL
        WINDOW: gl.constexpr = cfg.WINDOW
        DOCS: gl.constexpr = cfg.DOCS
        BM: gl.constexpr = cfg.BM
        HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
        DQ_SPLIT: gl.constexpr = cfg.DQ_SPLIT
        NUM_CONSUMERS: gl.constexpr = cfg.NUM_CONSUMERS
        DQ_VEC: gl.constexpr = cfg.DQ_VEC
        DQ_SHARED: gl.constexpr = cfg.DQ_SHARED
        OVERLAP_DQ: gl.constexpr = cfg.OVERLAP_DQ
        DQ_TMA: gl.constexpr = cfg.DQ_TMA
        DV_EARLY: gl.constexpr = cfg.DV_EARLY
        q_bufs, do_bufs, l_bufs, d_bufs, k_bufs, v_smem, ds_bufs, q_ready, q_empty, ds_bars = bufs
        k_smem = k_bufs.index(CID)
        ds_smem = ds_bufs.index(CID)
        st_layout: gl.constexpr = _mma_layout(KEYS, BM, dtype)  # S^T, dP^T: [64 keys, BM]
        kv_layout: gl.constexpr = _mma_layout(KEYS, HEAD_DIM, dtype)  # dK, dV: [64, d]
        q_smem = q_bufs.index(s)
        do_smem = do_bufs.index(s)
        zero = gl.zeros([KEYS, BM], gl.float32, layout=st_layout)
        sT = warpgroup_mma(k_smem, q_smem.permute((1, 0)), zero, use_acc=False, is_async=True)
        dpT = warpgroup_mma(v_smem, do_smem.permute((1, 0)), zero, use_acc=False, is_async=True)
        sT = warpgroup_mma_wait(num_outstanding=1, deps=(sT,))
        # L log2 e and D of the block's rows from the ring (rows past N: +inf and 0, so P = 0)
        col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
        pT = gl.exp2(sT * qk_scale - l_bufs.index(s).load(col_layout)[None, :])
        if MASK:
            key = k0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, st_layout))
            if CAUSAL:  # query q sees key k when 0 <= q - k < reach(k) (``_reach``)
                qrow = i * BM + gl.arange(0, BM, layout=col_layout)
                reach = _reach(key, N, win_left, kend_ptr, WINDOW, DOCS)
                if cfg.WG_MASK == 1:
                    if need:
                        pT = _keep_seen(pT, qrow, key, reach, st_layout)
                else:
                    pT = _keep_seen(pT, qrow, key, reach, st_layout)
            else:
                pT = gl.where((key < N)[:, None], pT, 0.0)
        a_layout: gl.constexpr = _a_operand_layout(kv_layout, dtype)
        if DV_EARLY:  # groups retire in order: waiting for dP^T leaves dV running
            pT_a = gl.convert_layout(pT.to(dtype), a_layout)
            dv = warpgroup_mma(pT_a, do_smem, dv, is_async=True)
            dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))
        else:
            dpT = warpgroup_mma_wait(num_outstanding=0, deps=(dpT,))
        delta = d_bufs.index(s).load(col_layout)
        dsT = (pT * (dpT - delta[None, :])).to(dtype)
        if DQ_SHARED:  # both consumers' dQ wgmmas of the previous block have read our dS^T tile
            mbarrier.wait(ds_bars.index(1), (jc & 1) ^ 1)
        if not DV_EARLY:
            pT_a = gl.convert_layout(pT.to(dtype), a_layout)
        dsT_a = gl.convert_layout(dsT, a_layout)
        if OVERLAP_DQ:
            return _bwd_dkdv_dq(
                pT_a, dsT_a, dsT, dk, dv, q_smem, do_smem, ds_bufs, k_bufs, ds_bars,
                q_empty.index(s), jc, i, dq_ptr, row0, N, BM, HEAD_DIM, DQ_SPLIT, dtype, CID,
                NUM_CONSUMERS, DQ_VEC, DQ_TMA,
            )  # fmt: skip
        if not DV_EARLY:
            dv = warpgroup_mma(pT_a, do_smem, dv, is_async=True)
        dk = warpgroup_mma(dsT_a, q_smem, dk, is_async=True)
        ds_smem.store(dsT)  # without DQ_SHARED: our previous dQ wgmma has been waited for
        fence_async_shared()
        gl.thread_barrier()
        if DQ_SHARED:  # our dS^T is in shared memory, visible to the other consumer's wgmma
            mbarrier.arrive(ds_bars.index(0), count=1)
        dv, dk, pT_a, dsT_a = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pT_a, dsT_a))
        mbarrier.arrive(q_empty.index(s), count=1)  # Q_i, dO_i no longer read
        _bwd_dq(
            ds_bufs, k_bufs, ds_bars, jc, i, dq_ptr, row0, N, BM, HEAD_DIM, DQ_SPLIT, dtype,
            CID, NUM_CONSUMERS, DQ_VEC, DQ_SHARED, DQ_TMA,
        )  # fmt: skip
        return dk, dv

    @gluon.jit
    def _bwd_dq(
        ds_bufs, k_bufs, ds_bars, jc, i, dq_ptr, row0, N,
        BM: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_SPLIT: gl.constexpr, dtype: gl.constexpr,
        CID: gl.constexpr, NUM_CONSUMERS: gl.constexpr, DQ_VEC: gl.constexpr,
        DQ_SHARED: gl.constexpr, DQ_TMA: gl.constexpr,
    ):  # fmt: skip
        """dQ_i += dS K, added to the fp32 dQ in global memory, in DQ_SPLIT column chunks (a
        smaller accumulator, fewer live atomic addresses). A = (dS^T in shared memory)^T.
        Default: B = this warpgroup's K slice, the [BM, d] partial of its 64 keys.
        DQ_SHARED: this warpgroup's d / NUM_CONSUMERS columns of the partial of ALL the CTA's
        keys (two chained wgmmas over both consumers' dS^T tiles and K slices): one [BM, d]
        partial per CTA step instead of one per consumer, half the atomic bytes (FA3's split).
        DQ_VEC = 4: red.global.add.v4.f32 instead of .v2 (``_bwd_dq_add``)."""
        if DQ_SHARED:
            mbarrier.wait(ds_bars.index(0), jc & 1)  # every consumer's dS^T is in shared memory
        for h in gl.static_range(DQ_SPLIT):
            dq0, col0 = _bwd_dq_issue(
                ds_bufs, k_bufs, h, BM, HEAD_DIM, DQ_SPLIT, dtype, CID, NUM_CONSUMERS, DQ_SHARED
            )  # fmt: skip
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq0,))
            if DQ_SHARED and h == DQ_SPLIT - 1:  # both dS^T tiles read: free them
                mbarrier.arrive(ds_bars.index(1), count=1)
            _bwd_dq_out(
                dq, i, dq_ptr, row0, N, col0, h, CID, DQ_SPLIT, BM, HEAD_DIM, DQ_VEC, DQ_TMA
            )  # fmt: skip

    @gluon.jit
    def _bwd_dkdv_dq(
        pT_a, dsT_a, dsT, dk, dv, q_smem, do_smem, ds_bufs, k_bufs, ds_bars, q_free, jc, i,
        dq_ptr, row0, N, BM: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_SPLIT: gl.constexpr,
        dtype: gl.constexpr, CID: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
        DQ_VEC: gl.constexpr, DQ_TMA: gl.constexpr,
    ):  # fmt: skip
        """OVERLAP_DQ (with DQ_SHARED): the end of ``_bwd_step`` with the dQ atomics overlapped
        with the dV / dK wgmmas. dS^T stored and exchanged first; then dQ chunk 0, dV, dK (and
        chunk h + 1 before chunk h's atomics) are issued back to back; each chunk is waited with
        the newer wgmma groups still running (they retire in order) and added meanwhile. The dS^T
        tiles are freed after the last chunk, the Q/dO slot after dV and dK, as before."""
        G: gl.constexpr = NUM_CONSUMERS  # wgmma groups per dQ chunk
        ds_bufs.index(CID).store(dsT)  # the previous block's dQ wgmmas are done (ds_free)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_bars.index(0), count=1)
        mbarrier.wait(ds_bars.index(0), jc & 1)  # every consumer's dS^T is in shared memory
        dq0, col0 = _bwd_dq_issue(ds_bufs, k_bufs, 0, BM, HEAD_DIM, DQ_SPLIT, dtype, CID, G, True)
        dv = warpgroup_mma(pT_a, do_smem, dv, is_async=True)
        dk = warpgroup_mma(dsT_a, q_smem, dk, is_async=True)
        for h in gl.static_range(1, DQ_SPLIT):  # chunk h queued, then chunk h - 1 added
            dq1, col1 = _bwd_dq_issue(
                ds_bufs, k_bufs, h, BM, HEAD_DIM, DQ_SPLIT, dtype, CID, G, True
            )  # fmt: skip
            dq = warpgroup_mma_wait(num_outstanding=G + (2 if h == 1 else 0), deps=(dq0,))
            _bwd_dq_out(
                dq, i, dq_ptr, row0, N, col0, h - 1, CID, DQ_SPLIT, BM, HEAD_DIM, DQ_VEC, DQ_TMA
            )  # fmt: skip
            dq0, col0 = dq1, col1
        if DQ_SPLIT == 1:  # the last chunk waited, dV and dK still running
            dq = warpgroup_mma_wait(num_outstanding=2, deps=(dq0,))
            mbarrier.arrive(ds_bars.index(1), count=1)  # both dS^T tiles read: free them
            _bwd_dq_out(
                dq, i, dq_ptr, row0, N, col0, 0, CID, DQ_SPLIT, BM, HEAD_DIM, DQ_VEC, DQ_TMA
            )  # fmt: skip
        dv, dk, pT_a, dsT_a, dq0 = warpgroup_mma_wait(
            num_outstanding=0, deps=(dv, dk, pT_a, dsT_a, dq0)
        )  # fmt: skip
        mbarrier.arrive(q_free, count=1)  # Q_i, dO_i no longer read
        if DQ_SPLIT > 1:
            mbarrier.arrive(ds_bars.index(1), count=1)  # both dS^T tiles read: free them
            _bwd_dq_out(
                dq0, i, dq_ptr, row0, N, col0, DQ_SPLIT - 1, CID, DQ_SPLIT, BM, HEAD_DIM, DQ_VEC,
                DQ_TMA,
            )  # fmt: skip
        return dk, dv

    @gluon.jit
    def _bwd_dq_issue(
        ds_bufs, k_bufs, h: gl.constexpr, BM: gl.constexpr, HEAD_DIM: gl.constexpr,
        DQ_SPLIT: gl.constexpr, dtype: gl.constexpr, CID: gl.constexpr,
        NUM_CONSUMERS: gl.constexpr, DQ_SHARED: gl.constexpr,
    ):  # fmt: skip
        """Issues dQ chunk h's wgmma(s) (async; one group per consumer's dS^T tile with
        DQ_SHARED, else one) and returns it with its first column in dQ."""
        OWN: gl.constexpr = HEAD_DIM // NUM_CONSUMERS if DQ_SHARED else HEAD_DIM
        DQ_COLS: gl.constexpr = OWN // DQ_SPLIT
        col0: gl.constexpr = (CID * OWN if DQ_SHARED else 0) + h * DQ_COLS
        dq0 = gl.zeros([BM, DQ_COLS], gl.float32, layout=_mma_layout(BM, DQ_COLS, dtype))
        if DQ_SHARED:
            for c in gl.static_range(NUM_CONSUMERS):
                kh = k_bufs.index(c).slice(col0, DQ_COLS, dim=1)
                dq0 = warpgroup_mma(
                    ds_bufs.index(c).permute((1, 0)), kh, dq0, use_acc=c > 0, is_async=True
                )  # fmt: skip
        else:
            k_smem = k_bufs.index(CID)
            kh = k_smem.slice(col0, DQ_COLS, dim=1) if DQ_SPLIT > 1 else k_smem
            dq0 = warpgroup_mma(
                ds_bufs.index(CID).permute((1, 0)), kh, dq0, use_acc=False, is_async=True
            )  # fmt: skip
        return dq0, col0

    @gluon.jit
    def _bwd_dq_out(
        dq, i, dq_ptr, row0, N, col0: gl.constexpr, h: gl.constexpr, CID: gl.constexpr,
        DQ_SPLIT: gl.constexpr, BM: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_VEC: gl.constexpr,
        DQ_TMA: gl.constexpr,
    ):  # fmt: skip
        """Chunk h of this step's dQ partial into the fp32 dQ: fp32 atomics from registers
        (``_bwd_dq_add``) or, with DQ_TMA, one TMA reduce-add from shared memory (FA3's way)."""
        if DQ_TMA:
            desc, tiles, rowp = dq_ptr
            _bwd_dq_tma(dq, i, desc, tiles.index(CID * DQ_SPLIT + h), rowp, col0, h, BM)
        else:
            _bwd_dq_add(dq, i, dq_ptr, row0, N, col0, BM, HEAD_DIM, DQ_VEC)

    @gluon.jit
    def _bwd_dq_tma(
        dq, i, desc, tile, rowp, col0: gl.constexpr, h: gl.constexpr, BM: gl.constexpr
    ):  # fmt: skip
        """DQ_TMA: dq into this chunk's own fp32 staging tile, then dQ_acc[rowp + rows of block i,
        col0:col0 + cols] += tile by one bulk TMA reduction (``tma_reduce_add``), which runs on
        while the warpgroup goes on. dQ_acc has N_PAD rows a head (whole query blocks), so rows
        past N add their zeros to the head's own padding, never to the next head. Chunk 0 first
        waits until every reduction this thread issued has read its tile (they were issued a
        whole step earlier; every chunk has its own tile, so one wait covers the step)."""
        if h == 0:
            tma.store_wait(pendings=0)
        tile.store(dq)
        fence_async_shared()
        tma_reduce_add(desc, [rowp + i * BM, col0], tile)

    @gluon.jit
    def _bwd_dq_add(
        dq, i, dq_ptr, row0, N, col0: gl.constexpr, BM: gl.constexpr, HEAD_DIM: gl.constexpr,
        DQ_VEC: gl.constexpr,
    ):  # fmt: skip
        """dQ[rows of block i < N, col0:col0 + cols] += dq with relaxed fp32 atomics. DQ_VEC = 4:
        dq first moved (warp shuffles) into a layout where every thread owns 4 contiguous
        columns: red.global.add.v4.f32 instead of the accumulator layout's .v2."""
        DQ_COLS: gl.constexpr = dq.shape[1]
        if DQ_VEC == 4:
            red_layout: gl.constexpr = _dq_vec_layout(BM, DQ_COLS)
            dq = gl.convert_layout(dq, red_layout)
        else:
            red_layout: gl.constexpr = dq.type.layout
        drow = i * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, red_layout))
        dcol = gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, red_layout))
        ptrs = dq_ptr + (row0 + drow).to(gl.int64)[:, None] * HEAD_DIM + (col0 + dcol)[None, :]
        gl.atomic_add(ptrs, dq, mask=(drow < N)[:, None], sem="relaxed")
