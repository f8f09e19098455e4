"""Which tile a CTA works on: the tile order (head-major, heaviest causal tile first, a head's
lightest tiles deferred, or longest-processing-time first; a forward tile's K/V blocks are
:mod:`.producer`'s), FA3's dynamic persistent scheduler, and which CTA of the backward converts
dq: a head's last one out, or each query block's (``DQ_CONVERT = 2``).

Dynamic scheduling (``DYNAMIC``): a grid of #SMs CTAs; each CTA's producer takes its first tile
from ``program_id`` and every next one from a global atomic counter (``num_programs +
atomic_add``), so a CTA that drew light tiles draws more, as the hardware block scheduler does,
while it keeps the next tile's Q load in flight during this tile's epilogue. The tile id reaches
the consumers through shared memory, in the slot of the Q stage loaded for it (``q_ready``);
after the last tile, ``num_tiles`` is the stop sign. No memset launch: each CTA counts itself
out on a second counter and the last one out resets both (launches on one stream only).

The backward's last CTA of a head (``DQ_CONVERT``, session 18): the same counting, per head,
after the CTA's reduce-adds have completed (``_bulk_writes_done``); the last one in converts the
head's fp32 dQ to dq there and then, not in a kernel of its own (notes/gluon_backward.md). Its
walk over query blocks (``_q_range``, ``_edge_range``, ``_bwd_runs``, ``_bwd_block``; ``_after``
for PERSIST) is read by the producer and the consumers alike.
"""

from __future__ import annotations

from ._lang import HAVE_GLUON

if HAVE_GLUON:
    from ._lang import gl, gluon, mbarrier

    # one int32 per Q stage, every thread of a 4-warp partition holding a copy
    _ID_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))
    _ID_SMEM_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, order=[0]))

    @gluon.jit
    def _tile_coords(
        t, num_pid_m, num_tiles, CAUSAL: gl.constexpr, LPT: gl.constexpr, SECTION: gl.constexpr,
        DEFER: gl.constexpr = 0,
    ):  # fmt: skip
        """Tile t -> (query block, batch*head).  Head-major, so the CTAs running at the same time
        share one head's K/V in L2; causal: each head's heaviest block (its last rows) first.
        DEFER (causal, 0 < DEFER < num_pid_m; session 29): each head's DEFER lightest tiles come
        after all the others, the heaviest of them first, heads innermost, so that the launch
        ends on its shortest tiles.  LPT (causal): heaviest blocks of ALL heads first (better
        balance, less L2 sharing); SECTION > 0: FA3's sectioned order, heads in sections of
        SECTION (the last may hold fewer), heaviest first within one, heads innermost (a
        section's K/V sized to stay in L2). Plain integer arithmetic (CPU tests run it on ints)."""
        if LPT:
            n_hz = num_tiles // num_pid_m
            if SECTION > 0:
                per_sec = SECTION * num_pid_m
                first = t // per_sec * SECTION  # the section's first head
                rem = t - first * num_pid_m
                n_sec = n_hz - first  # heads in this section
                if n_sec > SECTION:
                    n_sec = SECTION
                off_hz = first + rem % n_sec
                pid_m = num_pid_m - 1 - rem // n_sec
            else:
                off_hz = t % n_hz
                pid_m = num_pid_m - 1 - t // n_hz
        elif DEFER:  # (a number of tiles; 0: off)
            n_hz = num_tiles // num_pid_m
            keep = num_pid_m - DEFER  # each head's tiles taken head-major
            if t < keep * n_hz:
                off_hz = t // keep
                pid_m = num_pid_m - 1 - t % keep
            else:  # the deferred ones
                off_hz = (t - keep * n_hz) % n_hz
                pid_m = DEFER - 1 - (t - keep * n_hz) // n_hz
        else:
            off_hz = t // num_pid_m
            r = t % num_pid_m
            if CAUSAL:  # noqa: SIM108  (constexpr branches read better in a kernel)
                pid_m = num_pid_m - 1 - r
            else:
                pid_m = r
        return pid_m, off_hz

    @gluon.jit
    def _bwd_tile(N, BN: gl.constexpr, SECTION: gl.constexpr, TAIL: gl.constexpr):
        """The backward's CTA -> (first key n0, batch*head hz, batch*heads). Default: the grid
        (key blocks, batch*heads), key blocks fastest, so each head's key block 0 (under causal
        masking its heaviest: it sees every query) starts first, the last head's last (the tail).
        SECTION > 0: a 1-D grid in :func:`_tile_coords`' sectioned order, heads innermost in
        sections of SECTION heads, key block 0 of each section's heads first. TAIL > 0: a 1-D
        grid, head after head except the last TAIL heads, taken together, heads innermost."""
        if SECTION == 0 and TAIL == 0:
            return gl.program_id(0) * BN, gl.program_id(1), gl.num_programs(1)
        else:
            n_kb = gl.cdiv(N, BN)
            n_tiles = gl.num_programs(0)
            pid = gl.program_id(0)
            if TAIL > 0:
                lead = gl.maximum(n_tiles // n_kb - TAIL, 0)  # heads run one after another
                hz = pid // n_kb
                kb = pid - hz * n_kb
                if hz >= lead:
                    r = pid - lead * n_kb
                    width = n_tiles // n_kb - lead
                    kb = r // width
                    hz = lead + r % width
                return kb * BN, hz, n_tiles // n_kb
            else:
                last, hz = _tile_coords(pid, n_kb, n_tiles, True, True, SECTION)
                return (n_kb - 1 - last) * BN, hz, n_tiles // n_kb

    # ------------------------------------------------ dynamic persistent scheduler
    @gluon.jit
    def _alloc_tile_ids(QSTAGES: gl.constexpr):
        """Shared memory for the tile id of each Q stage."""
        return gl.allocate_shared_memory(gl.int32, [QSTAGES, 1], _ID_SMEM_LAYOUT)

    @gluon.jit
    def _draw_tile(sched_ptr):
        """Producer: the next tile of this CTA (one atomic per tile, issued by one thread)."""
        return gl.num_programs(0) + gl.atomic_add(sched_ptr, 1)

    @gluon.jit
    def _publish_tile(tile_ids, qs, t):
        """Producer: write tile t into Q stage qs's slot, visible to the thread that then
        arrives on q_ready (the arrive releases it to the consumers)."""
        tile_ids.index(qs).store(gl.full([1], t, gl.int32, layout=_ID_LAYOUT))
        gl.thread_barrier()

    @gluon.jit
    def _publish_stop(tile_ids, q_ready, q_empty, qc, num_tiles, QSTAGES: gl.constexpr):
        """Producer: after the last tile, hand the consumers ``num_tiles`` (stop) through the
        next Q stage, with a plain arrive (no TMA bytes) on its q_ready."""
        qs = qc % QSTAGES
        mbarrier.wait(q_empty.index(qs), ((qc // QSTAGES) & 1) ^ 1)
        _publish_tile(tile_ids, qs, num_tiles)
        mbarrier.arrive(q_ready.index(qs), count=1)

    @gluon.jit
    def _retire_scheduler(sched_ptr):
        """Producer, after its last draw: count this CTA out; the last CTA out resets both
        counters, so the next launch starts from 0 without a memset."""
        out = gl.atomic_add(sched_ptr + 1, 1)
        if out == gl.num_programs(0) - 1:
            gl.atomic_xchg(sched_ptr, 0)
            gl.atomic_xchg(sched_ptr + 1, 0)

    @gluon.jit
    def _read_tile(tile_ids, q_ready, qc, QSTAGES: gl.constexpr):
        """Consumer: wait for Q stage qc and read the tile id the producer published there."""
        qs = qc % QSTAGES
        mbarrier.wait(q_ready.index(qs), (qc // QSTAGES) & 1)
        return gl.max(tile_ids.index(qs).load(_ID_LAYOUT), axis=0)

    # ------------------------------------------- the backward's last CTA of a head (DQ_CONVERT)
    @gluon.constexpr_function
    def _convert_layout(HEAD_DIM):
        """[rows, HEAD_DIM] fp32 over one warpgroup, 4 contiguous columns (16 bytes) a thread."""
        return gl.BlockedLayout([1, 4], [128 // HEAD_DIM, HEAD_DIM // 4], [4, 1], [1, 0])

    @gluon.jit
    def _bulk_writes_done():
        """Wait until this thread's TMA bulk operations have completed, their global writes
        included (``cp.async.bulk.wait_group 0``; ``tma.store_wait`` only waits for their reads of
        shared memory), and order those async-proxy writes before this thread's later accesses."""
        zero = gl.full([1], 0, gl.int32, layout=_ID_LAYOUT)
        gl.inline_asm_elementwise(
            "cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.b32 $0, $1;",
            "=r,r", [zero], dtype=gl.int32, is_pure=False, pack=1,
        )  # fmt: skip

    @gluon.jit
    def _grid_dependency(x, WAIT: gl.constexpr):
        """The backward's PDL (programmatic dependent launch): ``griddepcontrol.wait`` (WAIT:
        the stream's previous kernel done, its writes visible) or ``.launch_dependents`` (the next
        kernel, launched with launch_pdl, may start once every CTA has passed here). x (int32)
        comes back through the asm: addresses computed from it are not read before it."""
        if WAIT:
            asm: gl.constexpr = "griddepcontrol.wait;\n\tmov.b32 $0, $1;"
        else:
            asm: gl.constexpr = "griddepcontrol.launch_dependents;\n\tmov.b32 $0, $1;"
        return gl.inline_asm_elementwise(asm, "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _dq_convert_last(
        conv, hz, heads, N, N_PAD, arrivals, scale, HEAD_DIM: gl.constexpr, PACKED: gl.constexpr,
        dtype: gl.constexpr, KEEP_ACC: gl.constexpr = False,
    ):  # fmt: skip
        """Kernel body, after ``gl.warp_specialize`` has joined: count this CTA in for head hz
        (``arrivals``: its key blocks); the last one in converts the head's dQ_acc rows [0, N) to
        dq (dense or PACKED) and resets the counter. Not at the end of a consumer: a branch on the
        counter there made ptxas spill in their hot loop at d = 128 (window, documents).
        ``conv``: (dQ_acc as a pointer, dq, the counters). KEEP_ACC (session 31): it zeroes the
        head's N_PAD rows too (in L2): the buffer is zero again for the launcher's next call."""
        gl.thread_barrier()
        before = gl.atomic_add(conv[2] + hz, 1, sem="acq_rel", scope="gpu")
        if before == arrivals - 1:
            gl.thread_barrier()
            gl.atomic_xchg(conv[2] + hz, 0)
            stop = N_PAD if KEEP_ACC else N
            _convert_rows(conv, hz, heads, 0, stop, N, N_PAD, scale, 16384 // HEAD_DIM, HEAD_DIM,
                          PACKED, dtype, KEEP_ACC)  # fmt: skip

    @gluon.jit
    def _convert_rows(
        conv, hz, heads, r0, r1, N, N_PAD, scale, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr,
        PACKED: gl.constexpr, dtype: gl.constexpr, KEEP_ACC: gl.constexpr,
    ):  # fmt: skip
        """dq rows [r0, min(r1, N)) of head hz (dense or PACKED) = scale x its dQ_acc rows (N_PAD
        a head), ROWS a pass; KEEP_ACC: then dQ_acc rows [r0, r1) zeroed (padding rows included:
        they hold reduce-adds of zeros, and another shape maps other heads' rows there)."""
        acc_ptr, dq_ptr, _counters = conv
        layout: gl.constexpr = _convert_layout(HEAD_DIM)
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))[None, :]
        for a in range(r0, r1, ROWS):
            r = a + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
            ok = ((r < r1) & (r < N))[:, None]
            src = acc_ptr + (hz * N_PAD + r).to(gl.int64)[:, None] * HEAD_DIM + cols
            acc = gl.load(src, mask=ok, cache_modifier=".cg")
            if PACKED:  # noqa: SIM108
                rows = r * heads + hz
            else:
                rows = hz * N + r
            out = dq_ptr + rows.to(gl.int64)[:, None] * HEAD_DIM + cols
            gl.store(out, (acc * scale).to(dtype), mask=ok)
            if KEEP_ACC:
                zero = gl.full([ROWS, HEAD_DIM], 0.0, gl.float32, layout=layout)
                gl.store(src, zero, mask=(r < r1)[:, None])

    @gluon.jit
    def _dq_convert_blocks(
        conv, hz, heads, n0, N, N_PAD, win_left, kend_ptr, scale, BM: gl.constexpr,
        BN: gl.constexpr, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
        DOCS: gl.constexpr, PACKED: gl.constexpr, dtype: gl.constexpr, KEEP_ACC: gl.constexpr,
    ):  # fmt: skip
        """DQ_CONVERT = 2 (session 31), after the join: count this CTA in on each query block it
        visited (its ``_q_range``: one atomic a block, 128 at once; the preprocessing set each
        block's counter to minus its visitors, ``_visits``) and convert (KEEP_ACC: and clear)
        the blocks it came in last on: the conversion spread over a head's CTAs, no head's
        conversion on one SM at its end. Each counter ends at 0."""
        lo, _mid, _far, hi = _q_range(n0, N, win_left, kend_ptr, BM, BN, CAUSAL, WINDOW, DOCS)
        counters = conv[2] + hz * (N_PAD // BM)
        gl.thread_barrier()
        for b0 in range(lo, hi, 128):
            i = b0 + gl.arange(0, 128, layout=_ID_LAYOUT)  # one block a thread, no copies
            one = gl.full([128], 1, gl.int32, layout=_ID_LAYOUT)
            before = gl.atomic_add(counters + i, one, mask=i < hi, sem="acq_rel", scope="gpu")
            mine = (i < hi) & (before == -1)
            todo = gl.sum(gl.where(mine, 1, 0), axis=0)
            gl.thread_barrier()  # the acquiring threads' view, the whole CTA's
            for _ in range(todo):
                j = gl.min(gl.where(mine, i, hi), axis=0)
                _convert_rows(conv, hz, heads, j * BM, j * BM + BM, N, N_PAD, scale, BM,
                              HEAD_DIM, PACKED, dtype, KEEP_ACC)  # fmt: skip
                mine = mine & (i != j)

    @gluon.jit
    def _visits(
        i, N, win_left, kend_ptr, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr,
        WINDOW: gl.constexpr, DOCS: gl.constexpr, layout: gl.constexpr,
    ):  # fmt: skip
        """DQ_CONVERT = 2: how many of a head's key blocks have query block i in their
        ``_q_range`` [lo, hi): lo = n0 // BM under causal masking (else 0), hi = the blocks, cut
        at the last key's reach (n0 + BN + win_left with a WINDOW, its document's end with DOCS).
        64 key blocks a pass over ``layout`` (1-D; the CPU test runs it on NumPy)."""
        n_kb = gl.cdiv(N, BN)
        seen = gl.zeros([64], gl.int32, layout=layout)
        for k0 in range(0, n_kb, 64):
            kb = k0 + gl.arange(0, 64, layout=layout)
            n0 = kb * BN
            hi = gl.zeros([64], gl.int32, layout=layout) + gl.cdiv(N, BM)
            if WINDOW:
                hi = gl.minimum(hi, (n0 + BN + win_left + BM - 1) // BM)
            if DOCS:
                end = gl.load(kend_ptr + gl.minimum(n0 + BN, N) - 1, mask=kb < n_kb, other=0)
                hi = gl.minimum(hi, (end + BM - 1) // BM)
            if CAUSAL:  # noqa: SIM108
                lo = n0 // BM
            else:
                lo = n0 * 0
            seen += gl.where((kb < n_kb) & (lo <= i) & (i < hi), 1, 0)
        return gl.sum(seen, axis=0)

    # ------------------------------------------- the backward: a key block's query blocks
    @gluon.jit
    def _q_range(
        n0, N, win_left, kend_ptr, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr,
        WINDOW: gl.constexpr, DOCS: gl.constexpr,
    ):  # fmt: skip
        """Query blocks of key block [n0, n0 + BN): [lo, hi), the masked ones [lo, mid) and
        [far, hi). Masked: the causal diagonal blocks, every block of the key-tail CTA, and with
        a causal sliding WINDOW (query q sees keys [q - win_left, q]) or packed causal DOCS
        (query q sees the keys of its own document; kend_ptr[k]: the end of key k's) the blocks
        past some key's reach (``_edge_range``); otherwise far = hi = the number of blocks."""
        n_blocks = gl.cdiv(N, BM)
        if CAUSAL:
            lo = n0 // BM
            mid = gl.minimum(n_blocks, gl.cdiv(n0 + BN, BM))
        else:
            lo = n0 * 0
            mid = lo
        if n0 + BN > N:  # keys past N: the next head's K rows (or TMA's zeros) must give P = 0
            mid = n_blocks
        if WINDOW:  # key n0 is unseen from query n0 + win_left + 1 on
            mid, far, hi = _edge_range(mid, n_blocks, n0 + win_left + 1, n0 + BN + win_left, BM)
            return lo, mid, far, hi
        elif DOCS:  # key n0 is unseen past its document's end; the last key, past its own
            last = gl.minimum(n0 + BN, N) - 1
            ends = (gl.load(kend_ptr + n0), gl.load(kend_ptr + last))
            mid, far, hi = _edge_range(mid, n_blocks, ends[0], ends[1], BM)
            return lo, mid, far, hi
        else:
            return lo, mid, n_blocks, n_blocks

    @gluon.jit
    def _edge_range(mid, hi, unseen, reach, BM: gl.constexpr):
        """A causal range (masked [lo, mid), then [mid, hi)) cut at the far edge of what the key
        block sees: ``unseen``, the first query its first key does not see; ``reach``, one past
        the last query its last key sees. Returns (mid, far, hi): [far, hi) masked, [mid, far)
        unmasked, none from hi on. Windows (session 12) and documents (session 14); plain ints."""
        reach = (reach + BM - 1) // BM
        if reach < hi:
            hi = reach
        if mid > hi:
            mid = hi
        far = unseen // BM  # the first block holding a query that key n0 does not see
        if far > hi:
            far = hi
        if far < mid:
            far = mid
        return mid, far, hi

    @gluon.jit
    def _bwd_runs(lo, mid, far, hi, rot, MASKED_LAST: gl.constexpr, ROTATE: gl.constexpr):
        """The CTA's query blocks in ring order, as three runs (start, stop, base, shift): the
        loop ``for t in range(start, stop)`` visits block i = start + (t - start + shift) %
        (stop - start), in ring slot jc = t - base; [lo, mid) and [far, hi) are masked (the
        last is empty without a window). Default: in block order, shift 0. MASKED_LAST (session
        13): the unmasked run [mid, far) first, which ptxas then compiles without spills (it
        spills in whichever loop comes later). ROTATE (with MASKED_LAST): the unmasked run
        starts at block ``rot`` (mod its length) and wraps, so that the CTAs of one head do not
        all read the same Q block and add to the same dQ rows at once."""
        if MASKED_LAST:
            shift = rot * 0
            if ROTATE:  # noqa: SIM102 (a constexpr test, then a runtime one)
                if far > mid:
                    shift = rot % (far - mid)
            return (
                (mid, far, mid, shift), (lo, mid, lo - (far - mid), rot * 0), (far, hi, lo, rot * 0)
            )  # fmt: skip
        else:
            return (lo, mid, lo, rot * 0), (mid, far, lo, rot * 0), (far, hi, lo, rot * 0)

    @gluon.jit
    def _bwd_block(t, start, stop, shift, ROT: gl.constexpr):
        """Query block of step t of a run (``_bwd_runs``): t itself, or rotated by ``shift``."""
        if ROT:
            return start + (t - start + shift) % (stop - start)
        else:
            return t

    @gluon.jit
    def _after(runs, step0):
        """The three runs of ``_bwd_runs`` with their ring steps after step0 (PERSIST)."""
        r0, r1, r2 = runs
        return ((r0[0], r0[1], r0[2] - step0, r0[3]), (r1[0], r1[1], r1[2] - step0, r1[3]),
                (r2[0], r2[1], r2[2] - step0, r2[3]))  # fmt: skip

    @gluon.jit
    def _wg_cuts(start, stop, k0, N, w, end_first, end_last, BM: gl.constexpr,
                 WINDOW: gl.constexpr, DOCS: gl.constexpr):  # fmt: skip
        """WG_MASK = 2 (session 25), causal calls: a masked run [start, stop) cut for the keys
        [k0, k0 + 64) of one warpgroup into [start, c1) and [c4, stop), blocks whose rows see
        none of them, [c2, c3), blocks that see every pair (by backward_steps._keep_seen's rule;
        w = min(win_left, N); end_first, end_last: the document ends of key k0 and of the last
        key below N), and the masked rest. Plain integer code: the CPU tests run it on ints."""
        big, last = N // BM + 2, k0 + 63  # past every block; the warpgroup's last key
        # dead below d1; every pair seen from e1 on (top >= last: none if last >= N, as top < N)
        d1, e1, e2, d2 = k0 // BM, (last + BM - 1) // BM, big, big
        if WINDOW:  # every while bottom - k0 <= w; dead once top - min(last, N - 1) > w
            e2, d2 = (w + k0 + 1) // BM, (w + min(last, N - 1)) // BM + 1
        elif DOCS:  # every while bottom < end(k0); dead once top >= end(last)
            e2, d2 = end_first // BM, (end_last + BM - 1) // BM
        if k0 >= N:
            d1 = big
        c1 = min(max(d1, start), stop)
        c2 = min(max(e1, c1), stop)
        c3 = min(max(e2, c2), stop)
        return c1, c2, c3, min(max(d2, c3), stop)
