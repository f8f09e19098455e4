"""FlashAttention-3's backward schedule on Hopper, written in Gluon (Triton 3.6); design,
predictions and H200 measurements in notes/gluon_backward.md.

One CTA per (key block of ``BN = 64 * NUM_CONSUMERS`` keys, batch x head). Roles:

* ``_bwd_producer``  (:mod:`.producer`) one warpgroup, the default partition, issuing TMA loads: this
                     CTA's K and V once, then the (Q_i, dO_i) pairs of every query block the
                     key block needs, into a ``STAGES``-deep ring guarded by mbarriers
                     (``q_ready`` filled by TMA, ``q_empty`` released by the consumers).
* ``_bwd_consumer``  ``NUM_CONSUMERS`` warpgroups of 64 keys each, dK and dV in registers for
                     the whole CTA; per query block (``_bwd_step``) S^T = K Q^T, P^T =
                     exp2(S^T c - L log2 e), dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO,
                     dK += dS^T Q, and dQ += dS K into an fp32 dQ_acc in global memory
                     (``_bwd_dq``: dS^T through shared memory, the wgmma's A operand; session
                     9's DQ_VEC, DQ_SHARED, OVERLAP_DQ; both in :mod:`.backward_steps`).
* ``_bwd_epilogue``  dK *= scale; dK, dV stored in the input dtype (rows < N).
* ``_bwd_preprocess`` D = rowsum(dO * O) (FA2's preprocessing); ``_bwd_dq_epilogue`` dq = (scale
  x dQ_acc).to(dtype), or ``DQ_CONVERT`` in this kernel, by each head's last CTA (1) or each
  query block's (2, session 31; :mod:`.scheduler`).

L is the forward's NATURAL-log logsumexp (:func:`.launch.gluon_attention_forward`). The math is
FA2's Algorithm 2 transposed, as in :mod:`course_kernels.triton.backward`; the split into roles
follows FA3 (arXiv 2407.08608), except that dQ leaves from the consumers themselves (DQ_TMA,
the default: a TMA bulk reduce-add of a shared-memory tile, as FA3's; else atomics), not from
FA3's dedicated dQ warp. Host side: :mod:`.backward_launch`.

Masks beyond causal (session 14): ``WINDOW`` (a causal sliding window) and ``DOCS`` (causal
documents packed into one sequence), each key block visiting only the query blocks that see one
of its keys, in three runs (the unmasked middle first); ``PACKED`` reads flash-attn's (total, H,
d) layout in place. The switches reach the roles as one :class:`BwdSchedule` (no ``from
__future__ import annotations`` here: an ``aggregate`` reads its fields' annotations as objects).
"""

from ._lang import HAVE_GLUON
from .backward_steps import DqVecBases  # noqa: F401 (the dQ layout's bases, for the tests)


if HAVE_GLUON:
    from ._lang import aggregate, gl, gluon, mbarrier, set_fields, tma
    from .backward_steps import _bwd_step
    from .producer import KEYS, _bwd_producer, _mma_layout
    from .scheduler import _ID_LAYOUT, _after, _bulk_writes_done, _bwd_block, _bwd_runs, _bwd_tile
    from .scheduler import _dq_convert_blocks, _dq_convert_last, _grid_dependency, _q_range
    from .scheduler import _visits, _wg_cuts

    LOG2E_ = gl.constexpr(1.4426950408889634)  # log2(e) (course_kernels.numpy.reference.LOG2E)
    _ROW_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0]))  # 8 warps
    _FLAT_LAYOUT = gl.constexpr(gl.BlockedLayout([4], [32], [4], [0]))

    @gluon.constexpr_function
    def _ds_smem_layout(BM, dtype):
        return gl.NVMMASharedLayout.get_default_for([64, BM], dtype)

    @gluon.jit
    def _flat_rows(hz, r, N, PACKED: gl.constexpr):
        """Row of (batch x head hz, token r) in the [rows, d] view of q, k, v, o and their
        gradients: (B, H, N, d), or with PACKED flash-attn's (total, H, d), read in place."""
        if PACKED:
            return r * gl.num_programs(1) + hz
        else:
            return hz * N + r

    # ---------------------------------------------------------- small kernels
    @gluon.jit
    def _bwd_preprocess(
        o_ptr, do_ptr, lse_ptr, delta_ptr, lse2_ptr, N, N_PAD, acc_ptr, cnt_ptr, ACC_ROWS,
        win_left, kend_ptr, HEAD_DIM: gl.constexpr, PACKED: gl.constexpr = False,
        ZERO_ACC: gl.constexpr = False, PDL: gl.constexpr = False, COUNT_BM: gl.constexpr = 0,
        BN: gl.constexpr = 128, CAUSAL: gl.constexpr = False, WINDOW: gl.constexpr = False,
        DOCS: gl.constexpr = False,
    ):  # fmt: skip
        """Per (batch, head), 64 rows a program, into buffers padded to N_PAD rows a head (a
        multiple of the backward's BM, so TMA reads whole blocks of one head): D = rowsum(dO * O)
        in fp32 (0 past N) and L log2 e (+inf past N: P = 0 there, no query-tail mask). With
        ZERO_ACC (session 22) it also zeroes the head's rows of the fp32 dQ_acc (``acc_ptr``,
        ACC_ROWS a head) and, in its first program, the head's DQ_CONVERT counter (``cnt_ptr``,
        fp32 0.0 has int32 0's bits): no fill kernel before it (FA3's preprocessing clears its
        dQaccum too: ``Clear_dQaccum``). PDL: the main kernel may launch once all programs run.
        COUNT_BM (DQ_CONVERT = 2's BM): each query block's counter at minus its ``_visits``."""
        r = gl.program_id(0) * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, _ROW_LAYOUT))
        if PDL:
            r = _grid_dependency(r, False)
        hz = gl.program_id(1)
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, _ROW_LAYOUT))
        ok = r < N
        offs = _flat_rows(hz, r, N, PACKED).to(gl.int64)[:, None] * HEAD_DIM + cols[None, :]
        o = gl.load(o_ptr + offs, mask=ok[:, None], other=0.0).to(gl.float32)
        do = gl.load(do_ptr + offs, mask=ok[:, None], other=0.0).to(gl.float32)
        lse = gl.load(lse_ptr + hz * N + r, mask=ok, other=float("inf"))
        out = hz * N_PAD + r
        gl.store(delta_ptr + out, gl.sum(o * do, axis=1), mask=r < N_PAD)
        gl.store(lse2_ptr + out, lse * LOG2E_, mask=r < N_PAD)
        if ZERO_ACC:
            zero = gl.full([64, HEAD_DIM], 0.0, gl.float32, layout=_ROW_LAYOUT)
            acc = (hz * ACC_ROWS + r).to(gl.int64)[:, None] * HEAD_DIM + cols[None, :]
            gl.store(acc_ptr + acc, zero, mask=(r < ACC_ROWS)[:, None])
            gl.store(cnt_ptr + hz + 0 * r, 0 * r, mask=r == 0)
        if COUNT_BM > 0:  # noqa: SIM102 (a constexpr test, then a runtime one)
            if (gl.program_id(0) * 64) % COUNT_BM == 0:  # the program of block i's first rows
                i = gl.program_id(0) * 64 // COUNT_BM
                lay: gl.constexpr = gl.SliceLayout(1, _ROW_LAYOUT)
                seen = _visits(i, N, win_left, kend_ptr, COUNT_BM, BN, CAUSAL, WINDOW, DOCS, lay)
                cnt = cnt_ptr + hz * (N_PAD // COUNT_BM) + i + 0 * r
                gl.store(cnt, 0 * r - seen, mask=r == gl.program_id(0) * 64)

    @gluon.jit
    def _bwd_dq_epilogue(dq_acc_ptr, dq_ptr, n_elems, scale, PDL: gl.constexpr = False):
        """dq = (scale * dQ_acc).to(dq's dtype), 512 elements a program (PDL: after the wait)."""
        if PDL:  # launched while the main kernel ran: its dQ_acc only after it has completed
            _grid_dependency(gl.full([1], 0, gl.int32, _FLAT_LAYOUT), True)  # (keeps 16-B loads)
        offs = gl.program_id(0).to(gl.int64) * 512 + gl.arange(0, 512, layout=_FLAT_LAYOUT)
        ok = offs < n_elems
        acc = gl.load(dq_acc_ptr + offs, mask=ok, other=0.0)
        gl.store(dq_ptr + offs, (acc * scale).to(dq_ptr.dtype.element_ty), mask=ok)

    @gluon.jit
    def _bwd_dq_epilogue_rows(
        dq_acc_ptr, dq_ptr, N, N_PAD, scale, HEAD_DIM: gl.constexpr, PACKED: gl.constexpr = False,
        PDL: gl.constexpr = False,
    ):  # fmt: skip
        """DQ_TMA's dQ_acc has N_PAD rows a head: dq[hz, r] = (scale * dQ_acc[hz, r]).to(dq's
        dtype) for r < N, 64 rows a program (8 warps); dq dense or PACKED (``_flat_rows``)."""
        r = gl.program_id(0) * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, _ROW_LAYOUT))
        if PDL:  # as _bwd_dq_epilogue
            r = _grid_dependency(r, True)
        hz = gl.program_id(1)
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, _ROW_LAYOUT))[None, :]
        ok = (r < N)[:, None]
        acc = gl.load(
            dq_acc_ptr + (hz * N_PAD + r).to(gl.int64)[:, None] * HEAD_DIM + cols, mask=ok
        )
        out = dq_ptr + _flat_rows(hz, r, N, PACKED).to(gl.int64)[:, None] * HEAD_DIM + cols
        gl.store(out, (acc * scale).to(dq_ptr.dtype.element_ty), mask=ok)

    # ----------------------------------------------------------------- schedule
    BWD_SWITCHES = (
        "BM", "HEAD_DIM", "NUM_CONSUMERS", "STAGES", "CAUSAL", "DQ_SPLIT", "DQ_VEC", "DQ_SHARED",
        "OVERLAP_DQ", "DQ_TMA", "MASKED_LAST", "DV_EARLY", "ROTATE", "WINDOW", "DOCS", "PACKED",
        "SECTION", "TAIL", "DQ_CONVERT", "GROUP", "PERSIST", "WG_MASK",
    )  # fmt: skip

    @aggregate
    class BwdSchedule:
        """The backward's compile-time switches as one value, as the forward's ``Schedule``:
        the producer and the consumers take ``cfg`` and read ``cfg.BM`` and so on (each switch
        is explained at :func:`_attn_bwd_kernel` and in backward_launch.py)."""

        __annotations__ = dict.fromkeys(BWD_SWITCHES, gl.constexpr)  # the fields

        @gluon.constexpr_function
        def __init__(self, *values):  # one value per name of BWD_SWITCHES, in that order
            set_fields(self, BWD_SWITCHES, values)

    # ----------------------------------------------------------------- epilogue
    @gluon.jit
    def _bwd_epilogue(
        dk, dv, dk_ptr, dv_ptr, row0, k0, N, sm_scale, hz, heads, HEAD_DIM: gl.constexpr,
        dtype: gl.constexpr, PACKED: gl.constexpr,
    ):  # fmt: skip
        """dK *= scale; dK, dV stored in the input dtype (dense or PACKED: token row x heads +
        hz, ``_flat_rows``), rows < N only."""
        kv_layout: gl.constexpr = _mma_layout(KEYS, HEAD_DIM, dtype)
        key = k0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, kv_layout))
        col = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
        if PACKED:  # noqa: SIM108 (the dense branch keeps its measured code: row0 + key)
            rows = key * heads + hz
        else:
            rows = row0 + key
        offs = rows.to(gl.int64)[:, None] * HEAD_DIM + col[None, :]
        ok = (key < N)[:, None]
        gl.store(dk_ptr + offs, (dk * sm_scale).to(dtype), mask=ok)
        gl.store(dv_ptr + offs, dv.to(dtype), mask=ok)

    # ----------------------------------------------------------------- consumer
    @gluon.jit
    def _bwd_consumer(
        dq_ptr, dk_ptr, dv_ptr, ring, N, win_left, kend_ptr, qk_scale, sm_scale, n_heads,
        CID: gl.constexpr, cfg,
    ):  # fmt: skip
        """One tile, or with PERSIST the producer's sequence of tiles (``_bwd_producer``)."""
        BN: gl.constexpr = KEYS * cfg.NUM_CONSUMERS
        args = (dq_ptr, dk_ptr, dv_ptr, ring, N, win_left, kend_ptr, qk_scale, sm_scale)
        if cfg.PERSIST:
            n_kb = gl.cdiv(N, BN)
            step0 = gl.program_id(0) * 0
            it = gl.program_id(0) * 0
            for tile in range(gl.program_id(0), n_kb * n_heads, gl.num_programs(0)):
                step0 += _bwd_consume(
                    args, (tile % n_kb) * BN, tile // n_kb, n_heads, step0, it & 1, CID, cfg
                )  # fmt: skip
                it += 1
        else:
            n0, hz, heads = _bwd_tile(N, BN, cfg.SECTION, cfg.TAIL)
            _bwd_consume(args, n0, hz, heads, 0, 0, CID, cfg)

    @gluon.jit
    def _bwd_consume(args, n0, hz, heads, step0, kv_phase, CID: gl.constexpr, cfg):
        """One tile's steps and epilogue for consumer CID; returns its ring steps."""
        dq_ptr, dk_ptr, dv_ptr, ring, N, win_left, kend_ptr, qk_scale, sm_scale = args
        BM: gl.constexpr = cfg.BM
        HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
        NUM_CONSUMERS: gl.constexpr = cfg.NUM_CONSUMERS
        CAUSAL: gl.constexpr = cfg.CAUSAL
        DQ_TMA: gl.constexpr = cfg.DQ_TMA
        MASKED_LAST: gl.constexpr = cfg.MASKED_LAST
        ROTATE: gl.constexpr = cfg.ROTATE
        WINDOW: gl.constexpr = cfg.WINDOW
        DOCS: gl.constexpr = cfg.DOCS
        PACKED: gl.constexpr = cfg.PACKED
        (q_bufs, do_bufs, l_bufs, d_bufs, k_bufs, v_bufs, ds_bufs, q_ready, q_empty, kv_ready,
         ds_bars) = ring  # fmt: skip
        dtype: gl.constexpr = dk_ptr.dtype.element_ty
        kv_layout: gl.constexpr = _mma_layout(KEYS, HEAD_DIM, dtype)
        BN: gl.constexpr = KEYS * NUM_CONSUMERS
        k0 = n0 + CID * KEYS  # this warpgroup's keys
        row0 = hz * N
        if DQ_TMA:  # the descriptor, the staging tiles, the head's first row of the padded dQ
            dq_ptr = (dq_ptr[0], dq_ptr[1], hz * (gl.cdiv(N, BM) * BM))
        bufs = (q_bufs, do_bufs, l_bufs, d_bufs, k_bufs, v_bufs.index(CID), ds_bufs, q_ready,
                q_empty, ds_bars)  # fmt: skip
        dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout)
        lo, mid, far, hi = _q_range(n0, N, win_left, kend_ptr, BM, BN, CAUSAL, WINDOW, DOCS)
        mbarrier.wait(kv_ready.index(0), kv_phase)
        run0, run1, run2 = _after(
            _bwd_runs(lo, mid, far, hi, n0 // BM, MASKED_LAST, ROTATE), step0
        )  # fmt: skip
        args = (dq_ptr, row0, k0, N, win_left, kend_ptr, qk_scale)  # runtime values only
        dk, dv = _bwd_steps(bufs, run0, dk, dv, args, not MASKED_LAST, ROTATE, dtype, CID, cfg)
        if cfg.WG_MASK == 2 and MASKED_LAST and CAUSAL:  # session 25: per-warpgroup segments
            ends = (0, 0)
            if DOCS:  # the document ends of the warpgroup's first key and last one below N
                ends = (gl.load(kend_ptr + min(k0, N - 1)), gl.load(kend_ptr + min(k0 + 63, N - 1)))
            keys = (k0, N, min(win_left, N), ends[0], ends[1])
            dk, dv = _bwd_wg_run(bufs, run1, keys, dk, dv, args, dtype, CID, cfg)
            if WINDOW or DOCS:
                dk, dv = _bwd_wg_run(bufs, run2, keys, dk, dv, args, dtype, CID, cfg)
        else:
            dk, dv = _bwd_steps(bufs, run1, dk, dv, args, MASKED_LAST, False, dtype, CID, cfg)
            if WINDOW or DOCS:  # the far edge (past some key's window or document), masked
                dk, dv = _bwd_steps(bufs, run2, dk, dv, args, True, False, dtype, CID, cfg)
        if cfg.PERSIST:  # every wgmma of this warpgroup reading K, V has been waited for
            mbarrier.arrive(kv_ready.index(1), count=1)
        if DQ_TMA:  # the last reductions must have read their tiles before the CTA exits
            tma.store_wait(pendings=0)
        _bwd_epilogue(
            dk, dv, dk_ptr, dv_ptr, row0, k0, N, sm_scale, hz, heads, HEAD_DIM, dtype, PACKED
        )  # fmt: skip
        if cfg.DQ_CONVERT:  # its reduce-adds complete before the CTA counts itself in (below)
            _bulk_writes_done()
        return hi - lo

    @gluon.jit
    def _bwd_steps(
        bufs, run, dk, dv, args, MASK: gl.constexpr, ROT: gl.constexpr, dtype: gl.constexpr,
        CID: gl.constexpr, cfg,
    ):  # fmt: skip
        """The query blocks of one run (``_bwd_runs``), masked or not. ``args``: the runtime
        values every step reads (dq_ptr, row0, k0, N, win_left, kend_ptr, qk_scale)."""
        dq_ptr, row0, k0, N, win_left, kend_ptr, qk_scale = args
        start, stop, base, shift = run
        for t in range(start, stop):
            dk, dv = _bwd_step(
                bufs, t - base, _bwd_block(t, start, stop, shift, ROT), dk, dv, dq_ptr, row0, k0,
                N, win_left, kend_ptr, qk_scale, MASK, dtype, CID, cfg,
            )  # fmt: skip
        return dk, dv

    @gluon.jit
    def _bwd_wg_run(bufs, run, keys, dk, dv, args, dtype: gl.constexpr, CID: gl.constexpr, cfg):
        """WG_MASK = 2 (session 25): a masked run [start, stop) in this warpgroup's five segments
        (``_wg_cuts``), each a loop of its own: dead (MASK = 2: ``_bwd_dead``), masked, unmasked,
        masked, dead; the ring slots and blocks as in one loop (a masked run has no shift)."""
        start, stop, base, shift = run
        k0, N, w, end_first, end_last = keys
        c1, c2, c3, c4 = _wg_cuts(
            start, stop, k0, N, w, end_first, end_last, cfg.BM, cfg.WINDOW, cfg.DOCS
        )  # fmt: skip
        dk, dv = _bwd_steps(bufs, (start, c1, base, shift), dk, dv, args, 2, False, dtype, CID, cfg)
        dk, dv = _bwd_steps(bufs, (c1, c2, base, shift), dk, dv, args, True, False, dtype, CID, cfg)
        dk, dv = _bwd_steps(
            bufs, (c2, c3, base, shift), dk, dv, args, False, False, dtype, CID, cfg
        )
        dk, dv = _bwd_steps(bufs, (c3, c4, base, shift), dk, dv, args, True, False, dtype, CID, cfg)
        dk, dv = _bwd_steps(bufs, (c4, stop, base, shift), dk, dv, args, 2, False, dtype, CID, cfg)
        return dk, dv

    # ------------------------------------------------------------------- kernel
    @gluon.jit
    def _attn_bwd_kernel(
        desc_q, desc_k, desc_v, desc_do, desc_lse, desc_d, dq_ptr, dk_ptr, dv_ptr, N, N_PAD,
        qk_scale, sm_scale, win_left, kend_ptr, dq_acc_ptr, dq_final_ptr, count_ptr, n_heads,
        BM: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
        STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        DQ_SPLIT: gl.constexpr, DQ_VEC: gl.constexpr = 2, DQ_SHARED: gl.constexpr = False,
        OVERLAP_DQ: gl.constexpr = False, DQ_TMA: gl.constexpr = False,
        MASKED_LAST: gl.constexpr = False, DV_EARLY: gl.constexpr = False,
        ROTATE: gl.constexpr = False, WINDOW: gl.constexpr = False, DOCS: gl.constexpr = False,
        PACKED: gl.constexpr = False, SECTION: gl.constexpr = 0, TAIL: gl.constexpr = 0,
        DQ_CONVERT: gl.constexpr = False, GROUP: gl.constexpr = 1, PERSIST: gl.constexpr = False,
        WG_MASK: gl.constexpr = False, PDL: gl.constexpr = False, KEEP_ACC: gl.constexpr = False,
    ):  # fmt: skip
        """dq_ptr: the fp32 dQ accumulator, a pointer; with DQ_TMA a tensor descriptor of
        [BM, HEAD_DIM // NUM_CONSUMERS // DQ_SPLIT] blocks over it (N_PAD rows a head).
        WINDOW (with CAUSAL): query q sees keys [q - win_left, q]; DOCS (with CAUSAL, one
        sequence of packed documents): query q sees the keys of its own document, kend_ptr[k]
        the end (exclusive) of key k's; PACKED: q, k, v, do (descriptors over (total, H x d)) and
        dk, dv in flash-attn's (total, H, d) layout, B = 1 (all three session 14). DQ_CONVERT
        (with DQ_TMA): dq_acc_ptr (dQ_acc as a pointer), dq_final_ptr (dq) and count_ptr (int32:
        one a head, zero at launch and after it; with DQ_CONVERT = 2 one a query block, set by the
        preprocessing) for the in-kernel conversion. GROUP (session 19): query heads a K/V head serves
        (GQA): K, V read from head hz // GROUP, dK, dV written per query head (the host sums).
        PERSIST (session 21): a grid of at most one CTA an SM, n_heads (B x H) x key blocks tiles.
        WG_MASK (session 24, causal): masked steps chosen per consumer (``_bwd_step``).
        KEEP_ACC (with DQ_CONVERT, session 31): dQ_acc comes in zero and leaves zero (cleared
        where it is converted), so the launcher keeps the buffer."""
        dtype: gl.constexpr = desc_q.dtype
        q_bufs = gl.allocate_shared_memory(dtype, [STAGES, BM, HEAD_DIM], desc_q.layout)
        do_bufs = gl.allocate_shared_memory(dtype, [STAGES, BM, HEAD_DIM], desc_do.layout)
        l_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM], desc_lse.layout)
        d_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM], desc_d.layout)
        k_bufs = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, KEYS, HEAD_DIM], desc_k.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, KEYS, HEAD_DIM], desc_v.layout)
        ds_bufs = gl.allocate_shared_memory(
            dtype, [NUM_CONSUMERS, KEYS, BM], _ds_smem_layout(BM, dtype)
        )  # fmt: skip
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        # [0]: K, V loaded; PERSIST's [1]: every consumer done with them
        kv_ready = gl.allocate_shared_memory(
            gl.int64, [2 if PERSIST else 1, 1], mbarrier.MBarrierLayout()
        )  # fmt: skip
        for i in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=NUM_CONSUMERS)
        mbarrier.init(kv_ready.index(0), count=1)
        if PERSIST:
            mbarrier.init(kv_ready.index(1), count=NUM_CONSUMERS)
        if DQ_SHARED:  # [0]: every consumer's dS^T stored, [1]: every consumer's dQ wgmma done
            ds_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            mbarrier.init(ds_bars.index(0), count=NUM_CONSUMERS)
            mbarrier.init(ds_bars.index(1), count=NUM_CONSUMERS)
        else:
            ds_bars = kv_ready  # unused
        ring = (q_bufs, do_bufs, l_bufs, d_bufs, k_bufs, v_bufs, ds_bufs, q_ready, q_empty,
                kv_ready, ds_bars)  # fmt: skip
        if DQ_TMA:  # one fp32 staging tile per consumer and dQ chunk (DQ_SHARED's split)
            dq_tiles = gl.allocate_shared_memory(
                gl.float32,
                [NUM_CONSUMERS * DQ_SPLIT, BM, HEAD_DIM // NUM_CONSUMERS // DQ_SPLIT],
                dq_ptr.layout,
            )  # fmt: skip
            dq_ptr = (dq_ptr, dq_tiles)
        cfg = BwdSchedule(
            BM, HEAD_DIM, NUM_CONSUMERS, STAGES, CAUSAL, DQ_SPLIT, DQ_VEC, DQ_SHARED, OVERLAP_DQ,
            DQ_TMA, MASKED_LAST, DV_EARLY, ROTATE, WINDOW, DOCS, PACKED, SECTION,
            TAIL, DQ_CONVERT, GROUP, PERSIST, WG_MASK,
        )  # fmt: skip
        if PDL:  # launched during the preprocessing (PDL): its L, D (and ZERO_ACC's zeros) first
            _grid_dependency(_grid_dependency(gl.full([1], 0, gl.int32, _ID_LAYOUT), False), True)
        # (Gluon 3.6 takes each role's arguments written out: no *args, no shared tuple)
        if NUM_CONSUMERS == 1:
            gl.warp_specialize(
                [
                    (_bwd_producer, (desc_q, desc_k, desc_v, desc_do, desc_lse, desc_d, ring, N,
                                     N_PAD, win_left, kend_ptr, n_heads, cfg)),
                    (_bwd_consumer, (dq_ptr, dk_ptr, dv_ptr, ring, N, win_left, kend_ptr,
                                     qk_scale, sm_scale, n_heads, 0, cfg)),
                ],
                [4],
                [CONSUMER_REGS],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [
                    (_bwd_producer, (desc_q, desc_k, desc_v, desc_do, desc_lse, desc_d, ring, N,
                                     N_PAD, win_left, kend_ptr, n_heads, cfg)),
                    (_bwd_consumer, (dq_ptr, dk_ptr, dv_ptr, ring, N, win_left, kend_ptr,
                                     qk_scale, sm_scale, n_heads, 0, cfg)),
                    (_bwd_consumer, (dq_ptr, dk_ptr, dv_ptr, ring, N, win_left, kend_ptr,
                                     qk_scale, sm_scale, n_heads, 1, cfg)),
                ],
                [4, 4],
                [CONSUMER_REGS, CONSUMER_REGS],
            )  # fmt: skip
        if DQ_CONVERT:  # every role done: each head's last CTA (2: block's) converts dq
            BN: gl.constexpr = KEYS * NUM_CONSUMERS
            n0, hz, heads = _bwd_tile(N, BN, SECTION, TAIL)
            conv = (dq_acc_ptr, dq_final_ptr, count_ptr)
            if DQ_CONVERT == 2:
                _dq_convert_blocks(conv, hz, heads, n0, N, gl.cdiv(N, BM) * BM, win_left, kend_ptr,
                                   sm_scale, BM, BN, HEAD_DIM, CAUSAL, WINDOW, DOCS, PACKED,
                                   dk_ptr.dtype.element_ty, KEEP_ACC)  # fmt: skip
            else:
                _dq_convert_last(
                    conv, hz, heads, N, gl.cdiv(N, BM) * BM, gl.cdiv(N, BN), sm_scale, HEAD_DIM,
                    PACKED, dk_ptr.dtype.element_ty, KEEP_ACC,
                )  # fmt: skip
