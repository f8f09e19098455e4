"""One K/V block of a consumer warpgroup: QK^T and PV on the tensor cores with asynchronous
``warpgroup_mma``, the online softmax, and the two ways to chain them: serial (each GEMM waited
for) and overlapped (FA3's intra-warpgroup pipelining: the softmax of block j while PV of block
j-1 runs). Called by :func:`.consumer._consumer_tile`. See :mod:`.forward`."""

from __future__ import annotations

from ._lang import HAVE_GLUON

if HAVE_GLUON:
    from ._lang import gl, gluon, mbarrier, warpgroup_mma, warpgroup_mma_wait
    from .producer import _a_operand_layout

    # LAZY (session 38, FlashAttention-4's conditional rescaling): in an unmasked step a row's
    # running maximum moves only when the block's maximum exceeds it by more than LAZY_TAU (log2
    # units), so P <= 2**LAZY_TAU and most steps skip the correction of O
    LAZY_TAU = gl.constexpr(8.0)

    # ----------------------------------------------------------------- softmax
    @gluon.jit
    def _mask_first(
        qk,
        n_free,
        off_m,
        N,
        CAUSAL: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        s_layout: gl.constexpr,
    ):
        """ROW_MASK: block 0's mask as one compare per score against the last key each row sees
        (min(row, N - 1) under causal masking, N - 1 otherwise) instead of a key-range and a
        causal compare, and past the block where the warpgroup's rows see all of it (n_free > 0).
        Only for block 0: in the loop's masked steps the same form spilled 84-156 bytes (ptxas,
        sm_90a, three consumers; notes/gluon.md, session 9)."""
        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        rows = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        last = gl.full([BM], N - 1, gl.int32, layout=gl.SliceLayout(1, s_layout))
        if CAUSAL:
            last = gl.minimum(last, rows)
        last = gl.where(n_free > 0, BN, last)
        return gl.where(cols[None, :] <= last[:, None], qk, float("-inf"))

    @gluon.jit
    def _softmax(
        qk, m_i, l_i, qk_scale, start_n, off_m, N, left, MASK: gl.constexpr, cfg, s_layout: gl.constexpr
    ):  # fmt: skip
        """One online-softmax step in the exp2 domain; returns (p, alpha, m, l). With ``MASK``
        the keys past N, past the diagonal (causal) and, with a sliding window, before
        row - left[0] (with DOCS: before the row's document start, left[1][row]) are masked; a
        window's or a document's left edge can mask a row's whole block before the row has seen a
        key, so there the row maximum -inf is replaced by 0 (p = alpha = 0)."""
        BM: gl.constexpr = cfg.BM
        BN: gl.constexpr = cfg.BN
        if MASK:
            cols = start_n + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            keep = (cols < N)[None, :]
            if cfg.CAUSAL:
                rows = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
                keep = keep & (cols[None, :] <= rows[:, None])
                if cfg.WINDOW:
                    keep = keep & (cols[None, :] >= rows[:, None] - left[0])
                if cfg.DOCS:
                    first = gl.load(left[1] + gl.minimum(rows, N - 1))
                    keep = keep & (cols[None, :] >= first[:, None])
            qk = gl.where(keep, qk, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(qk, axis=1) * qk_scale)
        if cfg.LAZY and not MASK:  # a row keeps its maximum unless it grew by more than LAZY_TAU
            m_new = gl.where(m_new - m_i > LAZY_TAU, m_new, m_i)
        if (cfg.WINDOW or cfg.DOCS) and MASK:
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(qk * qk_scale - m_use[:, None])
            alpha = gl.exp2(m_i - m_use)
        else:
            p = gl.exp2(qk * qk_scale - m_new[:, None])
            alpha = gl.exp2(m_i - m_new)
        l_new = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_new

    @gluon.jit
    def _p_operand(p, dtype: gl.constexpr, o_layout: gl.constexpr, PACK_P: gl.constexpr):
        """P (fp32, the QK^T accumulator's layout) as PV's A operand in registers. ``PACK_P``
        (session 36): each pair of scores becomes one f16x2 / bf16x2 register by one ``cvt``
        (FA3 converts so, through CUTLASS); ``p.to(dtype)`` gives 16-bit values that ptxas packs
        in the other half-order and swaps back (a ``PRMT`` a register before every PV wgmma,
        32 a step). The same rounding (to nearest even): the same bits."""
        # (cvt.rn.f16x2.f32 d, a, b puts a in d's high half: p[i] = $1 goes low, as it should)
        if PACK_P and dtype == gl.float16:
            p = gl.inline_asm_elementwise(
                "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [p], gl.float16, True, 2
            )
        elif PACK_P:
            p = gl.inline_asm_elementwise(
                "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [p], gl.bfloat16, True, 2
            )
        else:
            p = p.to(dtype)
        return gl.convert_layout(p, _a_operand_layout(o_layout, dtype))

    @gluon.jit
    def _correction(acc, alpha, o_layout: gl.constexpr):
        """FA3's correction: the running O of each row rescaled by alpha = exp2(m_old - m_new)
        when the row's maximum grew (the online softmax's second half)."""
        return acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]

    # ------------------------------------------------------------ consumer steps
    @gluon.jit
    def _qk(
        q_smem,
        k_bufs,
        k_ready,
        kc,
        STAGES: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        s_layout: gl.constexpr,
    ):
        """Issue S = Q K^T for ring slot kc (asynchronous)."""
        s = kc % STAGES
        mbarrier.wait(k_ready.index(s), (kc // STAGES) & 1)
        zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
        return warpgroup_mma(
            q_smem, k_bufs.index(s).permute((1, 0)), zero, use_acc=False, is_async=True
        )

    @gluon.jit
    def _pv(p, acc, v_bufs, v_ready, kc, STAGES: gl.constexpr):
        """Issue O += P V for ring slot kc (asynchronous, P from registers)."""
        s = kc % STAGES
        mbarrier.wait(v_ready.index(s), (kc // STAGES) & 1)
        return warpgroup_mma(p, v_bufs.index(s), acc, is_async=True)

    @gluon.jit
    def _step_serial(
        bufs,
        kc,
        acc,
        m_i,
        l_i,
        qk_scale,
        start_n,
        off_m,
        N,
        left,
        MASK: gl.constexpr,
        cfg,
        dtype: gl.constexpr,
        s_layout: gl.constexpr,
        o_layout: gl.constexpr,
    ):
        """QK^T -> softmax -> correction -> PV, each waited for (no overlap). ``bufs``: the
        warpgroup's Q tile, the K/V ring and its barriers (:func:`.consumer._consumer_tile`)."""
        q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = bufs[:7]
        STAGES: gl.constexpr = cfg.STAGES
        BM: gl.constexpr = cfg.BM
        BN: gl.constexpr = cfg.BN
        s = kc % STAGES
        qk = _qk(q_smem, k_bufs, k_ready, kc, STAGES, BM, BN, s_layout)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
        mbarrier.arrive(k_empty.index(s), count=1)
        p, alpha, m_i, l_i = _softmax(
            qk, m_i, l_i, qk_scale, start_n, off_m, N, left, MASK, cfg, s_layout
        )
        acc = _correction(acc, alpha, o_layout)
        p = _p_operand(p, dtype, o_layout, cfg.PACK_P)
        acc = _pv(p, acc, v_bufs, v_ready, kc, STAGES)
        acc, p = warpgroup_mma_wait(
            num_outstanding=0, deps=(acc, p)
        )  # P (registers) read until here
        mbarrier.arrive(v_empty.index(s), count=1)
        return acc, m_i, l_i

    @gluon.jit
    def _step_overlap(
        bufs,
        kc,
        acc,
        p,
        m_i,
        l_i,
        qk_scale,
        start_n,
        off_m,
        N,
        left,
        MASK: gl.constexpr,
        cfg,
        dtype: gl.constexpr,
        s_layout: gl.constexpr,
        o_layout: gl.constexpr,
    ):
        """FA3's intra-warpgroup overlap: issue QK^T(j) and PV(j-1), then run the
        softmax of block j while PV(j-1) is still on the tensor cores. ``bufs`` as in
        :func:`_step_serial`."""
        q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = bufs[:7]
        STAGES: gl.constexpr = cfg.STAGES
        BM: gl.constexpr = cfg.BM
        BN: gl.constexpr = cfg.BN
        s = kc % STAGES
        sp = (kc + STAGES - 1) % STAGES
        _take_turn(bufs, kc, cfg)
        qk = _qk(q_smem, k_bufs, k_ready, kc, STAGES, BM, BN, s_layout)
        acc = _pv(p, acc, v_bufs, v_ready, kc - 1, STAGES)
        _pass_turn(bufs, cfg)
        qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk,))
        mbarrier.arrive(k_empty.index(s), count=1)
        p_new, alpha, m_i, l_i = _softmax(
            qk, m_i, l_i, qk_scale, start_n, off_m, N, left, MASK, cfg, s_layout
        )
        acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
        mbarrier.arrive(v_empty.index(sp), count=1)
        if cfg.LAZY and not MASK:  # the correction only when some row's maximum moved
            if gl.min(alpha, axis=0) < 1.0:
                acc = _correction(acc, alpha, o_layout)
        else:
            acc = _correction(acc, alpha, o_layout)
        p = _p_operand(p_new, dtype, o_layout, cfg.PACK_P)
        return acc, p, m_i, l_i

    @gluon.jit
    def _overlap_blocks(
        bufs, kc, acc, p, m_i, l_i, j_from, j_to, qk_scale, off_m, N, left,
        MASK: gl.constexpr, cfg, dtype: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
    ):  # fmt: skip
        """Blocks [j_from, j_to) of the overlapped main loop, all masked or none (``MASK``)."""
        for j in range(j_from, j_to):
            acc, p, m_i, l_i = _step_overlap(
                bufs, kc, acc, p, m_i, l_i, qk_scale, j * cfg.BN, off_m, N, left, MASK, cfg,
                dtype, s_layout, o_layout,
            )  # fmt: skip
            kc += 1
        return kc, acc, p, m_i, l_i

    @gluon.jit
    def _serial_blocks(
        bufs, kc, acc, m_i, l_i, j_from, j_to, qk_scale, off_m, N, left,
        MASK: gl.constexpr, cfg, dtype: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
    ):  # fmt: skip
        """Blocks [j_from, j_to) of the serial main loop, all masked or none (``MASK``)."""
        for j in range(j_from, j_to):
            acc, m_i, l_i = _step_serial(
                bufs, kc, acc, m_i, l_i, qk_scale, j * cfg.BN, off_m, N, left, MASK, cfg,
                dtype, s_layout, o_layout,
            )  # fmt: skip
            kc += 1
        return kc, acc, m_i, l_i

    @gluon.jit
    def _take_turn(bufs, kc, cfg):
        """PINGPONG (FA3's warp-scheduler barriers): wait until this consumer may issue the GEMMs
        of ring slot kc. Consumer c's turn barrier (bufs[7]) completes once for each slot of the
        consumer before it (consumer 0: of the last one, after one arrive at launch), and every
        consumer takes one turn per ring slot it consumes, computed or skipped, so the k-th wait
        of each is for phase k: parity kc & 1."""
        if cfg.PINGPONG:
            mbarrier.wait(bufs[7], kc & 1)

    @gluon.jit
    def _pass_turn(bufs, cfg):
        """PINGPONG: the GEMMs are issued (not finished); the next consumer may issue its own."""
        if cfg.PINGPONG:
            mbarrier.arrive(bufs[8], count=1)

    @gluon.jit
    def _skip_blocks(bufs, kc, n, cfg):
        """Release n ring slots from kc on without computing them (SKIP_DEAD / ALIGN_END / a
        window's dead front: the blocks are wholly masked for this warpgroup's rows).  Each slot
        is waited for first, so that the arrive counts toward this fill's phase of the empty
        barrier, not the last one's; with PINGPONG each still takes and passes its turn."""
        STAGES: gl.constexpr = cfg.STAGES
        k_ready, k_empty, v_ready, v_empty = bufs[3], bufs[4], bufs[5], bufs[6]
        for _ in range(n):
            s = kc % STAGES
            ph = (kc // STAGES) & 1
            _take_turn(bufs, kc, cfg)
            _pass_turn(bufs, cfg)
            mbarrier.wait(k_ready.index(s), ph)
            mbarrier.arrive(k_empty.index(s), count=1)
            mbarrier.wait(v_ready.index(s), ph)
            mbarrier.arrive(v_empty.index(s), count=1)
            kc += 1
        return kc
