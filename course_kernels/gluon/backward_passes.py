"""The Gluon backward's passes over O(N d) data around its main kernel (:mod:`.backward`).

* ``_bwd_preprocess``  D = rowsum(dO * O) and L log2 e, per head padded to whole query blocks
                       (FA2's preprocessing, a kernel of its own).
* ``_bwd_dq_epilogue`` / ``_bwd_dq_epilogue_rows``  dq = (scale * dQ_acc).to(dtype): the fp32
                       dQ accumulator, summed by the main kernel's reduce-adds, converted by a
                       kernel of its own (the default).
* ``_dq_convert_last`` (``DQ_CONVERT``, session 18, off: not yet run on a GPU) the same
                       conversion inside the main kernel, by the consumer warpgroup that arrives
                       last for its head: each consumer, once its last reduce-add has completed,
                       adds one to its head's arrival counter; the one that finds every other
                       arrival in converts the head's rows (and resets the counter). No one waits
                       for anyone, so it cannot hang; what it must get right is the order between
                       the TMA engine's reduce-adds and the converter's loads (notes/gluon_backward.md).

On an H100 the three separate passes take 17% of a window-1K backward at d = 128, N = 4K, at
2.9-3.0 TB/s (course_kernels/data/gluon/h100_profile_backward_session18.json): they cannot get
much faster alone; the conversion can move into the main kernel.
"""

from ._lang import HAVE_GLUON

if HAVE_GLUON:
    from ._lang import gl, gluon

    LOG2E_ = gl.constexpr(1.4426950408889634)  # log2(e) (course_kernels.numpy.reference.LOG2E)
    _ROW_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0]))  # 8 warps
    _FLAT_LAYOUT = gl.constexpr(gl.BlockedLayout([4], [32], [4], [0]))

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
        o_ptr, do_ptr, lse_ptr, delta_ptr, lse2_ptr, N, N_PAD, HEAD_DIM: gl.constexpr,
        PACKED: gl.constexpr = False,
    ):  # fmt: skip
        """Per (batch, head), 64 rows a program, into buffers padded to N_PAD rows a head (a
        multiple of the backward's BM, so TMA reads whole blocks of one head): D = rowsum(dO * O)
        in fp32 (0 past N) and L log2 e (+inf past N: P = 0 there, no query-tail mask)."""
        r = gl.program_id(0) * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, _ROW_LAYOUT))
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

    @gluon.jit
    def _bwd_dq_epilogue(dq_acc_ptr, dq_ptr, n_elems, scale):
        """dq = (scale * dQ_acc).to(dq's dtype), 512 elements a program."""
        offs = gl.program_id(0).to(gl.int64) * 512 + gl.arange(0, 512, layout=_FLAT_LAYOUT)
        ok = offs < n_elems
        acc = gl.load(dq_acc_ptr + offs, mask=ok, other=0.0)
        gl.store(dq_ptr + offs, (acc * scale).to(dq_ptr.dtype.element_ty), mask=ok)

    @gluon.jit
    def _bwd_dq_epilogue_rows(
        dq_acc_ptr, dq_ptr, N, N_PAD, scale, HEAD_DIM: gl.constexpr, PACKED: gl.constexpr = False
    ):  # fmt: skip
        """DQ_TMA's dQ_acc has N_PAD rows a head: dq[hz, r] = (scale * dQ_acc[hz, r]).to(dq's
        dtype) for r < N, 64 rows a program (8 warps); dq dense or PACKED (``_flat_rows``)."""
        r = gl.program_id(0) * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, _ROW_LAYOUT))
        hz = gl.program_id(1)
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, _ROW_LAYOUT))[None, :]
        ok = (r < N)[:, None]
        acc = gl.load(
            dq_acc_ptr + (hz * N_PAD + r).to(gl.int64)[:, None] * HEAD_DIM + cols, mask=ok
        )
        out = dq_ptr + _flat_rows(hz, r, N, PACKED).to(gl.int64)[:, None] * HEAD_DIM + cols
        gl.store(out, (acc * scale).to(dq_ptr.dtype.element_ty), mask=ok)

    # ------------------------------------------- the conversion inside the main kernel
    _ONE_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))  # a warpgroup, one value

    @gluon.constexpr_function
    def _convert_layout(HEAD_DIM):
        """[rows, HEAD_DIM] fp32 over one warpgroup, 4 contiguous columns (16 bytes) a thread."""
        return gl.BlockedLayout([1, 4], [128 // HEAD_DIM, HEAD_DIM // 4], [4, 1], [1, 0])

    @gluon.jit
    def _bulk_writes_done():
        """Wait until this thread's TMA bulk operations have completed, their global writes
        included (``cp.async.bulk.wait_group 0``; ``tma.store_wait`` only waits for their reads of
        shared memory), and order those async-proxy writes before this thread's later accesses."""
        zero = gl.full([1], 0, gl.int32, layout=_ONE_LAYOUT)
        gl.inline_asm_elementwise(
            "cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.b32 $0, $1;",
            "=r,r", [zero], dtype=gl.int32, is_pure=False, pack=1,
        )  # fmt: skip

    @gluon.jit
    def _dq_convert_last(
        conv, hz, heads, N, N_PAD, arrivals, scale, HEAD_DIM: gl.constexpr, PACKED: gl.constexpr,
        dtype: gl.constexpr,
    ):  # fmt: skip
        """Consumer warpgroup, after its last dQ reduce-add: count this warpgroup in for head hz
        (``arrivals`` in all: NUM_CONSUMERS x key blocks); the last one in converts the head's
        dQ_acc rows [0, N) to dq (dense or PACKED) and resets the counter for the next launch.
        ``conv``: (dQ_acc as a pointer, dq, the per-head int32 counters)."""
        acc_ptr, dq_ptr, count_ptr = conv
        _bulk_writes_done()
        gl.thread_barrier()  # every thread of the warpgroup past its wait
        before = gl.atomic_add(count_ptr + hz, 1, sem="acq_rel", scope="gpu")
        if before == arrivals - 1:
            gl.thread_barrier()
            gl.atomic_xchg(count_ptr + hz, 0)
            layout: gl.constexpr = _convert_layout(HEAD_DIM)
            ROWS: gl.constexpr = 16384 // HEAD_DIM  # 64 KB of fp32 a pass
            cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))[None, :]
            for r0 in range(0, N, ROWS):
                r = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
                ok = (r < N)[:, None]
                src = acc_ptr + (hz * N_PAD + r).to(gl.int64)[:, None] * HEAD_DIM + cols
                acc = gl.load(src, mask=ok, cache_modifier=".cg")
                if PACKED:  # noqa: SIM108
                    rows = r * heads + hz
                else:
                    rows = hz * N + r
                out = dq_ptr + rows.to(gl.int64)[:, None] * HEAD_DIM + cols
                gl.store(out, (acc * scale).to(dtype), mask=ok)
