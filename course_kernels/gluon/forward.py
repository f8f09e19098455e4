"""FlashAttention-3's forward schedule on Hopper, written in Gluon (Triton 3.6).

Roles, named as in the FA3 paper (arXiv 2407.08608):

* ``_producer``   one warpgroup (the default partition) that only issues TMA
                  loads: a Q tile per output tile, and K/V blocks into a ring of
                  ``STAGES`` shared-memory slots guarded by mbarriers
                  (``k_ready``/``v_ready`` filled by TMA, ``k_empty``/``v_empty``
                  released by the consumers).
* ``_consumer``   ``NUM_CONSUMERS`` warpgroups (worker partitions), each owning
                  its own 64-row slice of the Q tile: QK^T and PV on the tensor
                  cores with asynchronous ``warpgroup_mma``, the online softmax
                  on the CUDA cores.  With ``OVERLAP`` the softmax of block j runs
                  while PV of block j-1 is still in flight (FA3's intra-warpgroup
                  pipelining); K and V have separate barriers so a 2-stage ring
                  suffices for that.
* ``_softmax``    one online-softmax step in the exp2 domain (optional mask).
* ``_correction`` the running O rescaled when a row's maximum grows.
* ``_epilogue``   O / l, TMA store of O (masked store on a tail tile), and the
                  natural-log logsumexp.

Register budgets: the producer warpgroup gives its registers away
(``gl.warp_specialize(..., worker_num_regs=...)`` lowers to ``setmaxnreg``).
Tile order is causal-aware (heaviest tile of each head first); ``persistent=True``
runs a grid of #SMs CTAs looping over tiles with a static stride (measured slower
than one CTA per tile on the H200, so off by default; ``LPT=True`` orders causal
tiles heaviest-first across all heads, in either grid); ``DYNAMIC=True`` is FA3's
dynamic persistent scheduler (:mod:`.scheduler`: tiles drawn from an atomic counter,
the tile id handed to the consumers through shared memory). ``SKIP_DEAD``: a consumer only waits
for and releases the K/V blocks wholly masked for its own rows; ``ALIGN_END``: the query tiles
end at the last row, so the partial tile is the first (both off by default; session 8).
Session 9: ``SECTION`` (> 0, with ``LPT``) orders the tiles heaviest-first within
sections of that many heads (FA3's L2-sized sections); ``ROW_MASK`` masks block 0 with one compare
per score against each row's last visible key, and not at all where the rows see the whole block
(both on for d = 128 causal calls since session 10, ``launch.CAUSAL_CONFIG``). Session 10 (off,
measured in session 11, mixed, off): ``O_STAGE`` gives each consumer its own O staging tile, so an
epilogue's TMA store is waited for only before the next tile's, not at once (FA3's epilogue).
Session 11: ``WINDOW`` (a causal sliding window, ``win_left`` keys before the diagonal: the
producer loads a tile's window only, each consumer starts at its own first visible block) and
``PINGPONG`` (FA3's warp-scheduler barriers: the consumers take turns to issue their GEMMs, so
one's softmax runs under another's GEMMs; measured in session 12, on for d = 64 non-causal calls
only, ``launch.NONCAUSAL_CONFIG``). Session 15: ``DOCS`` (causal documents packed into one
sequence: a row sees the keys of its own document, ``doc_start`` holding each token's document
start; the window's block ranges with that left edge) and ``PACKED`` (flash-attn's (total, H, d)
layout read and written in place). Session 29: ``DEFER`` (causal, head-major order: each head's
DEFER lightest tiles handed out after all the others, so the launch ends on short tiles; on for
d = 64 causal calls of at most ``launch.DEFER_MAX_TILES`` tiles a head). Session 36: ``PACK_P``
(P packed into PV's 16-bit operand by one ``cvt`` a pair: no register half-swap before each PV
wgmma; the same bits; timed in session 37; d = 64 causal calls since session 38). Session 38:
``LAZY`` (FlashAttention-4's conditional rescaling: in unmasked steps a row's maximum moves only
when it grows by more than 2**8, and O is corrected only in steps where one moved; not yet
timed, off). The switches reach the roles as one :class:`Schedule`.

Only the forward; the lse returned is the NATURAL logsumexp of the scaled
scores (float32, shape (B, H, N)). The host side (availability, configs, the launch) is
:mod:`.launch`; the roles live in :mod:`.producer`, :mod:`.consumer` (one tile, the
epilogue) and :mod:`.steps` (one K/V block), the tile order in :mod:`.scheduler`.
"""

from ._lang import HAVE_GLUON

if HAVE_GLUON:
    from ._lang import aggregate, gl, gluon, mbarrier, set_fields
    from .consumer import _consumer
    from .producer import _producer
    from .scheduler import _alloc_tile_ids

    # ---------------------------------------------------------------- schedule
    SWITCHES = (
        "BM", "BN", "HEAD_DIM", "NUM_CONSUMERS", "STAGES", "QSTAGES", "CAUSAL", "OVERLAP", "LPT",
        "DYNAMIC", "SKIP_DEAD", "ALIGN_END", "SECTION", "ROW_MASK", "O_STAGE", "WINDOW",
        "PINGPONG", "DOCS", "PACKED", "DEFER", "PACK_P", "LAZY",
    )  # fmt: skip

    @aggregate
    class Schedule:
        """The schedule's compile-time switches as one value (Gluon's ``aggregate``, as in
        Triton's own Gluon examples): the roles take ``cfg`` and read ``cfg.BM`` and so on, so a
        new switch is one field here, not one argument more in every call."""

        __annotations__ = dict.fromkeys(SWITCHES, gl.constexpr)  # the fields

        @gluon.constexpr_function
        def __init__(self, *values):  # one value per name of SWITCHES, in that order
            set_fields(self, SWITCHES, values)

    # ------------------------------------------------------------------ kernel
    @gluon.jit
    def _attn_fwd_kernel(
        desc_q,
        desc_k,
        desc_v,
        desc_o,
        o_ptr,
        lse_ptr,
        sched_ptr,
        N,
        H,
        G,
        qk_scale,
        num_pid_m,
        num_tiles,
        win_left,
        doc_start,
        BM: gl.constexpr,
        BN: gl.constexpr,
        HEAD_DIM: gl.constexpr,
        NUM_CONSUMERS: gl.constexpr,
        STAGES: gl.constexpr,
        QSTAGES: gl.constexpr,
        CAUSAL: gl.constexpr,
        OVERLAP: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        LPT: gl.constexpr,
        DYNAMIC: gl.constexpr,
        SKIP_DEAD: gl.constexpr,
        ALIGN_END: gl.constexpr,
        SECTION: gl.constexpr = 0,
        ROW_MASK: gl.constexpr = False,
        O_STAGE: gl.constexpr = False,
        WINDOW: gl.constexpr = False,
        PINGPONG: gl.constexpr = False,
        DOCS: gl.constexpr = False,
        PACKED: gl.constexpr = False,
        DEFER: gl.constexpr = 0,
        PACK_P: gl.constexpr = False,
        LAZY: gl.constexpr = False,
    ):
        dtype: gl.constexpr = desc_q.dtype
        q_bufs = gl.allocate_shared_memory(
            dtype, [QSTAGES * NUM_CONSUMERS, BM, HEAD_DIM], desc_q.layout
        )
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, HEAD_DIM], desc_k.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, HEAD_DIM], desc_v.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [QSTAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [QSTAGES, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(QSTAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=NUM_CONSUMERS)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NUM_CONSUMERS)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=NUM_CONSUMERS)

        # The ring and its barriers travel as one tuple (runtime values only), the switches as
        # one Schedule.
        if DYNAMIC:  # + the tile id of each Q stage, published by the producer
            ring = (
                q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                _alloc_tile_ids(QSTAGES),
            )  # fmt: skip
        else:
            ring = (q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)
        if O_STAGE:  # + one O staging tile per consumer, last (session 10, consumer.py)
            ring = ring + (
                gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, BM, HEAD_DIM], desc_o.layout),
            )
        if PINGPONG:  # + one "turn" mbarrier per consumer, last (session 11, steps.py)
            turns = gl.allocate_shared_memory(
                gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout()
            )
            for i in gl.static_range(NUM_CONSUMERS):
                mbarrier.init(turns.index(i), count=1)
            mbarrier.arrive(turns.index(0), count=1)  # consumer 0 issues first
            ring = ring + (turns,)
        cfg = Schedule(
            BM, BN, HEAD_DIM, NUM_CONSUMERS, STAGES, QSTAGES, CAUSAL, OVERLAP, LPT, DYNAMIC,
            SKIP_DEAD, ALIGN_END, SECTION, ROW_MASK, O_STAGE, WINDOW, PINGPONG, DOCS, PACKED, DEFER,
            PACK_P, LAZY,
        )  # fmt: skip
        # a row's left edge: a sliding window's reach, each token's document start (DOCS)
        left = (win_left, doc_start)
        # one consumer warpgroup per 64-row slice of the Q tile (its id CID a constexpr)
        if NUM_CONSUMERS == 1:
            gl.warp_specialize(
                [
                    (_producer, (desc_q, desc_k, desc_v, ring, sched_ptr, N, H, G, num_pid_m, num_tiles, left, cfg)),
                    (_consumer, (desc_o, o_ptr, lse_ptr, ring, N, qk_scale, num_pid_m, num_tiles, left, 0, cfg)),
                ],
                [4],
                [CONSUMER_REGS],
            )  # fmt: skip
        elif NUM_CONSUMERS == 2:
            gl.warp_specialize(
                [
                    (_producer, (desc_q, desc_k, desc_v, ring, sched_ptr, N, H, G, num_pid_m, num_tiles, left, cfg)),
                    (_consumer, (desc_o, o_ptr, lse_ptr, ring, N, qk_scale, num_pid_m, num_tiles, left, 0, cfg)),
                    (_consumer, (desc_o, o_ptr, lse_ptr, ring, N, qk_scale, num_pid_m, num_tiles, left, 1, cfg)),
                ],
                [4, 4],
                [CONSUMER_REGS, CONSUMER_REGS],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [
                    (_producer, (desc_q, desc_k, desc_v, ring, sched_ptr, N, H, G, num_pid_m, num_tiles, left, cfg)),
                    (_consumer, (desc_o, o_ptr, lse_ptr, ring, N, qk_scale, num_pid_m, num_tiles, left, 0, cfg)),
                    (_consumer, (desc_o, o_ptr, lse_ptr, ring, N, qk_scale, num_pid_m, num_tiles, left, 1, cfg)),
                    (_consumer, (desc_o, o_ptr, lse_ptr, ring, N, qk_scale, num_pid_m, num_tiles, left, 2, cfg)),
                ],
                [4, 4, 4],
                [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS],
            )  # fmt: skip
