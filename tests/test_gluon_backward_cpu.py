"""The Gluon backward's host side on a machine without Hopper (CI): it imports anywhere, refuses
unsupported inputs with a message that says what is accepted, and says why it cannot run."""

import json
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from course_kernels.gluon import backward as GB_kernel  # noqa: E402
from course_kernels.gluon import backward_steps as GB_steps  # noqa: E402
from course_kernels.gluon import scheduler as GB_sched  # noqa: E402
from course_kernels.gluon import backward_launch as GB  # noqa: E402
from course_kernels.gluon import launch as G  # noqa: E402


def _args(B=1, H=2, N=16, d=64, dtype=torch.float16, H_kv=None):
    q = torch.randn(B, H, N, d, dtype=dtype)
    k = torch.randn(B, H_kv or H, N, d, dtype=dtype)
    v = torch.randn_like(k)
    o, do = torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(B, H, N, dtype=torch.float32)
    return dict(do=do, q=q, k=k, v=v, o=o, lse=lse)


def test_imports_without_gluon_and_has_a_config_per_head_dim():
    assert set(GB.BACKWARD_CONFIG) == {64, 128}
    for cfg in GB.BACKWARD_CONFIG.values():
        assert cfg["NUM_CONSUMERS"] in GB.BACKWARD_CONSUMER_REGS


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(H=3, H_kv=2), "multiple of K/V heads"),
        (dict(d=96), "head dim 96"),
        (dict(d=256), r"head dim 256 not supported by the Gluon backward \(64 or 128\)"),
        (dict(dtype=torch.float32), "float16 or all bfloat16"),
    ],
)
def test_unsupported_shapes_and_dtypes_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        GB.gluon_attention_backward(**_args(**change))


@pytest.mark.parametrize("shape", [(2, 6, 5, 4), (7, 6, 4)], ids=["dense", "packed"])
@pytest.mark.parametrize("h_kv", [1, 2, 3, 6])
def test_gqa_gradients_sum_over_each_kv_heads_query_heads(shape, h_kv):
    """Session 19: the Gluon backward writes dK, dV per query head; a K/V head's gradient is the
    sum over the query heads that read it, heads h_kv * g .. h_kv * g + G - 1 for G = H // h_kv
    (query head h reads K/V head h // G, SDPA's enable_gqa), summed in fp32, one rounding."""
    per_q = torch.randn(*shape).to(torch.bfloat16)
    got = GB._sum_over_groups(per_q, h_kv)
    G = shape[1] // h_kv
    want = torch.stack(
        [sum(per_q[:, h].float() for h in range(j * G, (j + 1) * G)) for j in range(h_kv)], 1
    ).to(torch.bfloat16)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_gqa_is_accepted_by_the_checks():
    """A call with fewer K/V heads passes every input check (GQA, session 19); on this machine
    it then stops at the availability check, not at a ValueError."""
    if G.gluon_available():
        pytest.skip("Gluon is available here")
    for h_kv in (1, 2):
        with pytest.raises(RuntimeError, match="unavailable"):
            GB.gluon_attention_backward(**_args(H=4, H_kv=h_kv))


def test_o_do_and_lse_must_match_q():
    a = _args()
    with pytest.raises(ValueError, match=r"do must be a tensor of q's shape \(1, 2, 16, 64\)"):
        GB.gluon_attention_backward(**{**a, "do": a["do"][:, :, :8]})
    with pytest.raises(ValueError, match="o must be a tensor of q's shape .* torch.float16"):
        GB.gluon_attention_backward(**{**a, "o": a["o"].bfloat16()})
    with pytest.raises(ValueError, match="lse must be the forward's natural-log logsumexp"):
        GB.gluon_attention_backward(**{**a, "lse": a["lse"].double()})
    with pytest.raises(ValueError, match=r"float32 of shape \(1, 2, 16\)"):
        GB.gluon_attention_backward(**{**a, "lse": a["lse"][..., :3]})


def test_schedule_options_are_checked():
    with pytest.raises(ValueError, match="unknown backward option 'OVERLAP'; accepted"):
        GB.gluon_attention_backward(**_args(), OVERLAP=True)
    with pytest.raises(ValueError, match=r"NUM_CONSUMERS=3 not supported; accepted: \(1, 2\)"):
        GB.gluon_attention_backward(**_args(), NUM_CONSUMERS=3)


def test_clear_error_when_unavailable():
    if G.gluon_available():
        pytest.skip("Gluon is available here")
    with pytest.raises(RuntimeError, match="gluon_attention_backward is unavailable here"):
        GB.gluon_attention_backward(**_args())


# ------------------------------------------------ session 9: the dQ switches (DQ_VEC, DQ_SHARED)
def test_dq_switches_defaults_and_checks():
    for d in (64, 128):
        cfg = GB._check_config(d, {})
        assert (cfg["DQ_VEC"], cfg["DQ_SHARED"]) == (2, True)  # measured faster (session 9)
        assert GB._check_config(d, dict(DQ_SHARED=False))["DQ_SHARED"] is False  # first version
    with pytest.raises(ValueError, match=r"DQ_VEC=3 not supported; accepted: \(2, 4\)"):
        GB.gluon_attention_backward(**_args(), DQ_VEC=3)
    with pytest.raises(ValueError, match="DQ_SHARED .* needs NUM_CONSUMERS=2"):
        GB.gluon_attention_backward(**_args(), NUM_CONSUMERS=1)  # DQ_SHARED by default
    assert GB._check_config(64, dict(NUM_CONSUMERS=1, DQ_SHARED=False))["NUM_CONSUMERS"] == 1
    with pytest.raises(ValueError, match="dQ chunks of 8 columns .* need at least 16"):
        GB.gluon_attention_backward(**_args(), DQ_SHARED=True, DQ_SPLIT=4)


def test_bench_variants_are_valid_configs():
    bench = _experiment("bench_backward")
    assert set(bench.VARIANTS) == set(bench.VARIANT_DIMS) and list(bench.VARIANTS)[0] == "default"
    for name in ("dq_vec4", "dq_shared", "dq_shared_vec4"):
        assert name in bench.VARIANTS
    for name, cfg in bench.VARIANTS.items():
        for d in bench.VARIANT_DIMS[name]:
            GB._check_config(d, cfg)


def _points(bases, index):
    """The [row, col] a linear layout maps ``index`` (its bits pick bases, XOR-combined) to."""
    out = np.zeros(2, dtype=np.int64)
    for b, basis in enumerate(bases):
        if index >> b & 1:
            out ^= np.asarray(basis)
    return tuple(out)


@pytest.mark.parametrize("BM, cols", [(64, 8), (64, 16), (64, 32), (64, 64), (128, 32), (128, 64)])
def test_dq_vec_layout_owns_4_contiguous_columns_and_the_accumulators_warps(BM, cols):
    """DQ_VEC = 4's layout (NumPy): a bijection onto [BM, cols]; registers 4k..4k+3 of a thread
    are 4 contiguous, 16-byte aligned fp32 columns; a warp holds exactly the elements the wgmma
    accumulator layout gives it (the conversion needs warp shuffles only); one instruction (a
    register group) of a warp writes whole 32-byte sectors."""
    L = GB_kernel.DqVecBases(BM, cols)
    reg, lane, warp = L["reg_bases"], L["lane_bases"], L["warp_bases"]
    # the wgmma m64nNk16 accumulator: 4 warps x 16 rows, lane = 4 (row % 8) + (col % 8) // 2
    acc_reg = [[0, 1], [8, 0]] + [[0, 1 << b] for b in range(3, cols.bit_length() - 1)]
    acc_reg += [[64, 0]] if BM == 128 else []
    acc_lane = [[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]
    seen = set()
    for w in range(4):
        mine, acc = set(), set()
        for t in range(32):
            base = np.asarray(_points(lane, t)) ^ np.asarray(_points(warp, w))
            acc_base = np.asarray(_points(acc_lane, t)) ^ np.asarray(_points(warp, w))
            regs = [tuple(base ^ np.asarray(_points(reg, r))) for r in range(1 << len(reg))]
            mine |= set(regs)
            acc |= {tuple(acc_base ^ np.asarray(_points(acc_reg, r))) for r in range(len(regs))}
            for k in range(0, len(regs), 4):
                (r0, c0), *rest = regs[k : k + 4]
                assert c0 % 4 == 0 and rest == [(r0, c0 + 1), (r0, c0 + 2), (r0, c0 + 3)]
        assert mine == acc, f"warp {w} holds other elements than in the accumulator layout"
        seen |= mine
        for k in range(0, 1 << len(reg), 4):  # one red.v4 per register group: whole sectors
            hit = {}
            for t in range(32):
                r, c = np.asarray(_points(lane, t)) ^ np.asarray(_points(warp, w))
                r, c = np.array([r, c]) ^ np.asarray(_points(reg, k))
                hit.setdefault((r, c // 8), 0)
                hit[(r, c // 8)] += 4
            assert set(hit.values()) == {8}  # every touched 32-byte sector: all 8 floats
    assert seen == {(r, c) for r in range(BM) for c in range(cols)}


def _interleave(runs: dict, rng, budget: int = 100000) -> None:
    """Advance the roles (generators that yield where the real warps may be descheduled) one
    step at a time in a random order until all finish; a role left waiting is a deadlock."""
    for _ in range(budget):
        if not runs:
            return
        key = list(runs)[rng.integers(len(runs))]
        try:
            next(runs[key])
        except StopIteration:
            del runs[key]
    raise AssertionError(f"deadlock: roles {sorted(map(str, runs))} never finish")


def _simulate_dq_shared(seed, steps=6, free_wait=True):
    """The DQ_SHARED handshake of _bwd_step / _bwd_dq, transcribed: two consumers, mbarriers
    ds_ready / ds_free (count 2, parity waits as mbarrier.wait: parity p passes once the phase of
    parity p completed), random interleaving. Returns what every dQ read of a dS^T tile saw."""
    rng = np.random.default_rng(seed)
    done = {"ready": 0, "free": 0}  # completed phases
    pend = {"ready": 0, "free": 0}  # arrivals in the current phase

    def arrive(bar):
        pend[bar] += 1
        if pend[bar] == 2:
            pend[bar], done[bar] = 0, done[bar] + 1

    def passes(bar, parity):
        return done[bar] % 2 != parity

    tiles, reads = [None, None], []

    def consumer(cid):
        for jc in range(steps):
            if free_wait:
                while not passes("free", (jc & 1) ^ 1):
                    yield
            tiles[cid] = jc  # ds_smem.store(dsT)
            arrive("ready")
            while not passes("ready", jc & 1):
                yield
            yield  # the dQ wgmma reads both tiles (the other consumer may run meanwhile)
            reads.append((cid, jc, tuple(tiles)))
            arrive("free")

    _interleave({0: consumer(0), 1: consumer(1)}, rng)
    return reads


def test_dq_shared_handshake_reads_the_right_tiles_and_never_deadlocks():
    for seed in range(200):
        reads = _simulate_dq_shared(seed)
        assert len(reads) == 12
        assert all(seen == (jc, jc) for _, jc, seen in reads), reads
    # without the ds_free wait some interleaving overwrites a tile before the other reads it
    bad = [r for seed in range(200) for r in _simulate_dq_shared(seed, free_wait=False)]
    assert any(seen != (jc, jc) for _, jc, seen in bad)


# ------------------------------------------------ session 9, lever (b): OVERLAP_DQ
def test_overlap_dq_is_on_at_d64_only_and_needs_dq_shared():
    # measured in session 10: +2-3% at d = 64, -7 to -9% at d = 128
    assert GB._check_config(64, {})["OVERLAP_DQ"] is True
    assert GB._check_config(128, {})["OVERLAP_DQ"] is False
    assert GB._check_config(64, dict(DQ_SHARED=False))["OVERLAP_DQ"] is False  # needs it
    assert GB._check_config(64, dict(OVERLAP_DQ=False))["OVERLAP_DQ"] is False
    for d in (64, 128):
        assert GB._check_config(d, dict(OVERLAP_DQ=True))["OVERLAP_DQ"] is True
    with pytest.raises(ValueError, match="OVERLAP_DQ is implemented with DQ_SHARED only"):
        GB.gluon_attention_backward(**_args(), OVERLAP_DQ=True, DQ_SHARED=False)
    with pytest.raises(ValueError, match=r"OVERLAP_DQ='on' not supported; accepted: \(False"):
        GB.gluon_attention_backward(**_args(), OVERLAP_DQ="on")


# ------------------------------------------------ session 12: DQ_TMA
def test_dq_tma_is_the_default_where_it_applies_and_needs_dq_shared_and_one_swizzle_row():
    """DQ_TMA's staging tile is one fp32 TMA box of [BM, cols] with the 128-byte swizzle, whose
    rows are at most 32 fp32 columns: refused (a ValueError that says what is accepted) for
    chunks of 64 columns and without DQ_SHARED's split; on by default (measured in session 12)
    wherever it applies, off where it does not (no error for a schedule that never asked)."""
    for d in (64, 128):
        assert GB._check_config(d, {})["DQ_TMA"] is True
        assert GB._check_config(d, dict(DQ_TMA=False))["DQ_TMA"] is False
        assert GB._check_config(d, dict(DQ_SHARED=False))["DQ_TMA"] is False
        assert GB._check_config(d, dict(DQ_TMA=True))["DQ_TMA"] is True
    assert GB._check_config(128, dict(DQ_SPLIT=1))["DQ_TMA"] is False  # 64-column chunks
    assert GB._check_config(128, dict(BM=128))["DQ_TMA"] is False  # the tiles would not fit
    assert GB._check_config(64, dict(DQ_TMA=True, BM=128))["DQ_TMA"] is True
    assert GB._check_config(128, dict(DQ_TMA=True, DQ_SPLIT=4))["DQ_TMA"] is True  # 16 columns
    with pytest.raises(ValueError, match=r"DQ_TMA needs DQ_SHARED=True .* got DQ_SHARED=False"):
        GB.gluon_attention_backward(**_args(), DQ_TMA=True, DQ_SHARED=False, OVERLAP_DQ=False)
    with pytest.raises(ValueError, match=r"16 or 32 columns .* 64 columns \(d=128, DQ_SPLIT=1"):
        GB.gluon_attention_backward(**_args(d=128), DQ_TMA=True, DQ_SPLIT=1)
    with pytest.raises(ValueError, match=r"DQ_TMA='yes' not supported; accepted: \(False, True\)"):
        GB.gluon_attention_backward(**_args(), DQ_TMA="yes")


def test_shared_memory_estimate_matches_the_compile_and_refuses_what_does_not_fit():
    """shared_bytes against the sm_90a compile (compile_bwd_sm90.py, session 12: 83,248 /
    148,784 / 99,648 / 181,568 bytes with barriers), and a schedule over the limit refused
    before any launch (d = 128, BM = 128 with DQ_TMA's tiles: ~297 KB)."""
    full = dict(DQ_VEC=2, DQ_SHARED=True, OVERLAP_DQ=False)  # the compile's switches
    for d, tma, compiled in ((64, False, 83248), (128, False, 148784), (64, True, 99648),
                             (128, True, 181568)):  # fmt: skip
        est = GB.shared_bytes(d, {**GB.BACKWARD_CONFIG[d], **full, "DQ_TMA": tma})
        assert 0 <= compiled - est <= 512, (d, tma, est)
    with pytest.raises(ValueError, match=r"needs about 29\d{4} bytes of shared memory .* lower"):
        GB.gluon_attention_backward(**_args(d=128), DQ_TMA=True, BM=128)
    assert GB._check_config(128, dict(BM=128))["BM"] == 128  # fits without the tiles


class _Bar:
    """An mbarrier: ``count`` arrivals complete a phase; wait(parity) passes once the phase of
    that parity completed (a fresh barrier passes parity 1 at once), as mbarrier.wait."""

    def __init__(self, count):
        self.count, self.pending, self.done = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.done = 0, self.done + 1

    def passes(self, parity):
        return self.done % 2 != parity


class _RingModel:
    """The (Q, dO) ring of the backward's models: ``fill`` is the producer's load of ring step
    jc (wait for the slot's q_empty phase, then fill it; a slot still read is a hazard)."""

    def fill(self, jc):
        s = jc % self.stages
        while not self.q_empty[s].passes(((jc // self.stages) & 1) ^ 1):
            yield
        if any(r == ("slot", s) for r, _ in self.readers):
            self.bad.append(("slot overwritten while read", jc))
        self.slot[s] = jc
        self.q_ready[s].arrive()

    def hazards(self, seed):
        """Producer and two consumers in a random interleaving (seeded); the hazards seen."""
        runs = {"p": self.producer(), 0: self.consumer(0), 1: self.consumer(1)}
        _interleave(runs, np.random.default_rng(seed))
        return self.bad


class _OverlapModel(_RingModel):
    """_bwd_producer and the OVERLAP_DQ end of _bwd_step (_bwd_dkdv_dq, DQ_SPLIT = 1)
    transcribed: the producer's ring, two consumers, the wgmmas in flight between their issue
    and their wait (readers of a Q/dO slot, of dS^T tiles). ``early``: 'ds_free' or 'q_empty'
    arrived at the dQ's issue instead of after its wait (wrong). ``bad``: the hazards seen (a
    write under an in-flight reader, a stale read)."""

    def __init__(self, steps, stages, early):
        self.steps, self.stages, self.early = steps, stages, early
        self.q_ready = [_Bar(1) for _ in range(stages)]
        self.q_empty = [_Bar(2) for _ in range(stages)]
        self.ds_ready, self.ds_free = _Bar(2), _Bar(2)
        self.slot, self.tiles, self.readers, self.bad = [None] * stages, [None, None], [], []

    def producer(self):
        for jc in range(self.steps):
            yield from self.fill(jc)

    def consumer(self, cid):
        for jc in range(self.steps):
            s = jc % self.stages
            while not self.q_ready[s].passes((jc // self.stages) & 1):
                yield
            rq = (("slot", s), cid)
            self.readers.append(rq)  # S^T, dP^T, then dV, dK read Q_i, dO_i until wait(0)
            yield
            while not self.ds_free.passes((jc & 1) ^ 1):
                yield
            if any(r == ("tile", cid) for r, _ in self.readers):
                self.bad.append(("dS^T overwritten while read", cid, jc))
            self.tiles[cid] = jc
            self.ds_ready.arrive()
            while not self.ds_ready.passes(jc & 1):
                yield
            yield from self.dq_and_dkdv(cid, jc, s, rq)

    def dq_and_dkdv(self, cid, jc, s, rq):
        if tuple(self.tiles) != (jc, jc) or self.slot[s] != jc:
            self.bad.append(("stale read", cid, jc, tuple(self.tiles), self.slot[s]))
        rt = [(("tile", 0), cid), (("tile", 1), cid)]
        self.readers.extend(rt)  # dQ chunk 0, then dV, dK issued
        early = {"ds_free": self.ds_free, "q_empty": self.q_empty[s]}.get(self.early)
        if early is not None:
            early.arrive()
        yield
        for r in rt:  # wait(2): the dQ chunk retired
            self.readers.remove(r)
        if self.early != "ds_free":
            self.ds_free.arrive()
        yield  # the atomics, while dV and dK run
        self.readers.remove(rq)  # wait(0)
        if self.early != "q_empty":
            self.q_empty[s].arrive()


def _simulate_overlap_dq(seed, steps=7, stages=2, early=None):
    """Runs :class:`_OverlapModel` in a random interleaving; returns its hazards."""
    return _OverlapModel(steps, stages, early).hazards(seed)


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_overlap_dq_schedule_releases_nothing_early_and_never_deadlocks(stages):
    for seed in range(150):
        assert _simulate_overlap_dq(seed, stages=stages) == []
    # a deliberately wrong ordering is caught (an early ds_free only with STAGES > 1: with one
    # slot, the next dS^T waits for the next Q_i, which waits for both consumers' wait(0))
    for early in ("ds_free", "q_empty") if stages > 1 else ("q_empty",):
        bad = [
            b for seed in range(150) for b in _simulate_overlap_dq(seed, stages=stages, early=early)
        ]
        assert bad, early


class _PersistModel(_RingModel):
    """PERSIST's K/V hand-over transcribed (producer.py ``_bwd_producer``, backward.py
    ``_bwd_consume``): per tile the producer waits kv_bars[1] (phase parity (it & 1) ^ 1), loads
    K/V (arrives kv_bars[0]), then fills the ring at steps step0, step0 + 1, ...; each consumer
    waits kv_bars[0] (parity it & 1), runs the tile's steps (reading K/V and its ring slot; the
    other consumer's dQ wgmma reads its K too), and after its last step's wait arrives kv_bars[1],
    then writes its epilogue. ``early``: kv_bars[1] arrived before the last step (wrong).
    ``bad``: K/V or a slot overwritten while read, or a stale read."""

    def __init__(self, steps_per_tile, stages, early=False):
        self.tiles, self.stages, self.early = steps_per_tile, stages, early
        self.kv_ready, self.kv_free = _Bar(1), _Bar(2)
        self.q_ready = [_Bar(1) for _ in range(stages)]
        self.q_empty = [_Bar(2) for _ in range(stages)]
        self.kv, self.slot, self.readers, self.bad = None, [None] * stages, [], []

    def producer(self):
        jc = 0
        for it, steps in enumerate(self.tiles):
            while not self.kv_free.passes((it & 1) ^ 1):
                yield
            if any(r[0] == "kv" for r, _ in self.readers):
                self.bad.append(("K/V overwritten while read", it))
            self.kv = it
            self.kv_ready.arrive()
            for _ in range(steps):
                yield from self.fill(jc)
                jc += 1

    def consumer(self, cid):
        jc = 0
        for it, steps in enumerate(self.tiles):
            while not self.kv_ready.passes(it & 1):
                yield
            for k in range(steps):
                s = jc % self.stages
                while not self.q_ready[s].passes((jc // self.stages) & 1):
                    yield
                if self.kv != it or self.slot[s] != jc:
                    self.bad.append(("stale read", cid, it, jc))
                if self.early and k == steps - 1:
                    self.kv_free.arrive()
                held = [(("kv", cid), cid), (("slot", s), cid)]
                self.readers.extend(held)
                yield  # the step's wgmmas in flight
                for r in held:  # wait(0)
                    self.readers.remove(r)
                self.q_empty[s].arrive()
                jc += 1
            if not self.early or steps == 0:
                self.kv_free.arrive()
            yield  # the epilogue (registers to global memory: no shared buffer)


def _simulate_persist(seed, tiles, stages, early=False):
    return _PersistModel(tiles, stages, early).hazards(seed)


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_persist_hands_k_v_over_between_tiles_without_a_hazard(stages):
    """Tiles of 1-5 ring steps (a causal key block sees fewer query blocks), the ring's step
    count running on across tiles: no K/V or slot overwritten under a reader, no stale read, no
    deadlock (``_interleave`` fails on one); releasing K/V before the last step is caught."""
    tiles = [3, 1, 5, 2, 4, 1]
    for seed in range(150):
        assert _simulate_persist(seed, tiles, stages) == []
    bad = [b for seed in range(150) for b in _simulate_persist(seed, tiles, stages, early=True)]
    assert any(b[0] in ("K/V overwritten while read", "stale read") for b in bad)


# ------------------------------------------------ session 13: MASKED_LAST (the unmasked run first)
@pytest.mark.parametrize("order", ["masked_first", "masked_last", "rotate"])
@pytest.mark.parametrize("causal", [False, True])
def test_query_block_runs_cover_every_block_once_in_ring_order(order, causal):
    """_bwd_runs and _bwd_block (the kernel's own code, run on Python ints): the two runs visit
    every query block the key block needs exactly once, ring slots jc = t - base count 0, 1, 2,
    ... in visiting order (the producer fills slots in that order), the masked run is exactly
    [lo, mid) (causal diagonal, key tail), MASKED_LAST puts it second, and ROTATE starts the
    unmasked run at the key block's own query block (n0 // BM, mod the run's length) and wraps.
    Checked against a brute-force mask."""
    if not GB_kernel.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")
    runs, block = GB_sched._bwd_runs.fn, GB_sched._bwd_block.fn
    masked_last, rotate = order != "masked_first", order == "rotate"
    BM, BN = 64, 128
    for N in (1, 17, 64, 127, 128, 129, 200, 1000, 1024, 2053):
        n_blocks = -(-N // BM)
        for n0 in range(0, N, BN):
            keys, rows = np.arange(n0, n0 + BN), np.arange(n_blocks * BM)
            see = (keys[:, None] <= rows[None, :]) if causal else np.ones((BN, rows.size), bool)
            need = [i for i in range(n_blocks) if see[:, i * BM : (i + 1) * BM].any()]
            full = [  # every key of the block < N, and every (key, row) pair visible
                i for i in need if n0 + BN <= N and see[:, i * BM : (i + 1) * BM].all()
            ]  # fmt: skip
            lo = need[0]
            mid = max([i + 1 for i in need if i not in full], default=lo)
            assert all(i in full for i in range(mid, n_blocks)), (N, n0)
            visited, masked = [], []
            all_runs = runs(lo, mid, n_blocks, n_blocks, n0 // BM, masked_last, rotate)
            assert all_runs[2][0] == all_runs[2][1]  # no window: the far-edge run is empty
            for k, (start, stop, base, shift) in enumerate(all_runs[:2]):
                is_masked = k == (1 if masked_last else 0)
                for t in range(start, stop):
                    assert t - base == len(visited), (N, n0, k, t, base)
                    visited.append(block(t, start, stop, shift, rotate and not is_masked))
                    (masked if is_masked else []).append(visited[-1])
            assert sorted(visited) == need and masked == list(range(lo, mid)), (N, n0)
            if masked and len(masked) < len(visited):
                assert (visited[-1] in masked) == masked_last, (N, n0)
            unmasked = [i for i in visited if i not in masked]
            if order == "masked_first":  # the producer's single loop: range(lo, n_blocks)
                assert visited == list(range(lo, n_blocks))
            elif unmasked:
                first = mid + (n0 // BM) % len(unmasked) if rotate else mid
                assert unmasked[0] == first and unmasked == sorted(
                    unmasked, key=lambda i: i < first
                )
                assert not rotate or causal or n0 + BN > N or unmasked[0] == n0 // BM


def _random_documents(rng, N):
    """cu_seqlens of random documents packed into N tokens, and each token's document end."""
    cuts = sorted(set(rng.integers(1, N, size=int(rng.integers(0, 6))).tolist())) if N > 1 else []
    cu = [0, *cuts, N]
    return cu, np.repeat(cu[1:], np.diff(cu))


@pytest.mark.parametrize("mask", ["window", "documents"])
@pytest.mark.parametrize("masked_last", [False, True])
def test_masked_ranges_and_runs_visit_exactly_the_blocks_a_key_block_needs(mask, masked_last):
    """Sessions 12 and 14: a causal sliding window (query q sees keys [q - left, q]) or causal
    documents packed into one sequence (q sees the keys of its own document, k <= q < end(k)).
    _edge_range and _bwd_runs (the kernel's own code, run on Python ints, with the arguments
    _q_range gives them) visit every query block holding a (key, query) pair the mask shows, and
    no other, each once, in consecutive ring slots; a block runs unmasked if and only if every
    pair in it is shown and every key is < N; with MASKED_LAST the unmasked run comes first.
    Against brute force over 1500 random cases."""
    if not GB_kernel.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")
    edge_range, runs = GB_sched._edge_range.fn, GB_sched._bwd_runs.fn
    block = GB_sched._bwd_block.fn
    rng = np.random.default_rng(14)
    for _ in range(1500):
        BM, BN = int(rng.choice([64, 128])), int(rng.choice([64, 128, 192]))
        N = int(rng.integers(1, 900))
        n0 = BN * int(rng.integers(0, -(-N // BN)))
        n_blocks = -(-N // BM)
        lo = n0 // BM  # as _q_range: the causal diagonal, then the key tail
        mid = n_blocks if n0 + BN > N else min(n_blocks, -(-(n0 + BN) // BM))
        keys, rows = np.arange(n0, n0 + BN), np.arange(n_blocks * BM)  # rows past N: P = 0
        shown = (keys[:, None] <= rows[None, :]) & (keys[:, None] < N)
        if mask == "window":
            edges = [1, 2, 62, 63, 64, 65, 126, 127, 128, 129, 190, 191, 1000]  # near block sizes
            left = int(rng.choice(edges)) if rng.random() < 0.5 else int(rng.integers(1, 1100))
            mid, far, hi = edge_range(mid, n_blocks, n0 + left + 1, n0 + BN + left, BM)
            shown &= rows[None, :] - keys[:, None] <= left
            case = (BM, BN, N, n0, left, (lo, mid, far, hi))
        else:
            cu, end = _random_documents(rng, N)
            last = min(n0 + BN, N) - 1
            mid, far, hi = edge_range(mid, n_blocks, int(end[n0]), int(end[last]), BM)
            shown &= rows[None, :] < np.concatenate([end, np.zeros(BN, int)])[keys][:, None]
            case = (BM, BN, N, n0, cu, (lo, mid, far, hi))
        need = [i for i in range(n_blocks) if shown[:, i * BM : min(N, (i + 1) * BM)].any()]
        visited, unmasked, seen_masked = [], [], False
        for k, (start, stop, base, shift) in enumerate(
            runs(lo, mid, far, hi, 0, masked_last, False)
        ):
            is_masked = k != (0 if masked_last else 1)
            for t in range(start, stop):
                assert t - base == len(visited), case
                i = block(t, start, stop, shift, False)
                visited.append(i)
                if is_masked:
                    seen_masked = True
                else:
                    assert not (masked_last and seen_masked), case  # unmasked first
                    unmasked.append(i)
        assert sorted(visited) == need, case
        for i in visited:  # unmasked exactly where no pair of the block, padding rows included,
            # needs the mask (rows past N have L = +inf, so P = 0 there either way)
            whole = n0 + BN <= N and shown[:, i * BM : (i + 1) * BM].all()
            assert (i in unmasked) == whole, (case, i)


class _Ptr:
    """An int32 pointer as ``_visits`` uses it: ``ptr + offsets`` (an array), then ``gl.load``."""

    def __init__(self, values, at=0):
        self.values, self.at = np.asarray(values), at

    def __add__(self, offsets):
        return _Ptr(self.values, self.at + offsets)

    def __sub__(self, offsets):
        return _Ptr(self.values, self.at - offsets)


def _numpy_gl():
    def load(p, mask, other):
        return np.where(mask, p.values[np.clip(p.at, 0, len(p.values) - 1)], other)

    return types.SimpleNamespace(
        cdiv=lambda a, b: -(-a // b), zeros=lambda shape, dtype, layout: np.zeros(shape, int),
        arange=lambda a, b, layout: np.arange(a, b), minimum=np.minimum, load=load,
        where=np.where, sum=lambda x, axis: int(x.sum()), int32=int,
    )  # fmt: skip


@pytest.mark.parametrize("mask", ["full", "causal", "window", "documents"])
def test_visits_counts_the_key_blocks_that_add_to_each_query_block(monkeypatch, mask):
    """DQ_CONVERT = 2 (session 31): the preprocessing sets each query block's counter to minus
    ``_visits``; each key block's CTA counts itself in on the query blocks it visited, and the
    one that brings a counter to 0 converts that block. One visit too many and dq is never
    converted; one too few and it is converted before the last reduce-adds. ``_visits`` (the
    kernel's code, on NumPy) against brute force over the mask: the key blocks of BN keys holding
    a pair (key, query of the block, query < N) the mask shows, ragged N, N past 64 key blocks
    (a second pass), BM 64/128, BN 64/128."""
    if not GB_kernel.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")
    monkeypatch.setattr(GB_sched, "gl", _numpy_gl())
    visits = GB_sched._visits.fn
    rng = np.random.default_rng(31)
    for case in range(300):
        BM, BN = int(rng.choice([64, 128])), int(rng.choice([64, 128]))
        N = int(rng.integers(1, 900)) if case % 10 else int(rng.integers(64 * BN, 70 * BN))
        keys, rows = np.arange(N), np.arange(N)
        shown = np.ones((N, N), bool) if mask == "full" else keys[:, None] <= rows[None, :]
        left, end = -1, np.zeros(N, int)
        if mask == "window":
            left = int(rng.choice([1, 63, 64, 65, 127, 128, 1000]))
            shown &= rows[None, :] - keys[:, None] <= left
        if mask == "documents":
            _cu, end = _random_documents(rng, N)
            shown &= rows[None, :] < end[keys][:, None]
        n_kb, n_qb = -(-N // BN), -(-N // BM)
        want = [sum(shown[kb * BN:(kb + 1) * BN, i * BM:(i + 1) * BM].any()
                    for kb in range(n_kb)) for i in range(n_qb)]  # fmt: skip
        flags = (mask != "full", mask == "window", mask == "documents")
        got = [visits(i, N, left, _Ptr(end), BM, BN, *flags, None) for i in range(n_qb)]
        assert got == want, (mask, BM, BN, N, left)
        assert min(got) >= 1 and max(got) <= n_kb


@pytest.mark.parametrize("mask", ["causal", "window", "documents"])
def test_wg_cuts_split_a_masked_run_exactly_into_dead_masked_and_unmasked_blocks(mask):
    """Session 25 (WG_MASK = 2): _wg_cuts (the kernel's code, on Python ints) cuts a run of
    query blocks for one warpgroup's 64 keys into dead, masked, unmasked, masked, dead
    segments. Against brute force over the pairs (rows of the nominal block, keys below N, the
    rule of _keep_seen): a block is put in a dead segment if and only if none of its pairs is
    seen and in the unmasked one if and only if all are; over 3000 random cases, any run."""
    if not GB_kernel.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")
    cuts = GB_sched._wg_cuts.fn
    rng = np.random.default_rng(25)
    for _ in range(3000):
        BM, N = int(rng.choice([64, 128])), int(rng.integers(1, 700))
        k0 = 64 * int(rng.integers(0, -(-N // 64) + 1))  # a key tail past N now and then
        n_blocks = -(-N // BM)
        keys, rows = np.arange(k0, k0 + 64), np.arange(n_blocks * BM)
        seen = (keys[:, None] <= rows[None, :]) & (keys[:, None] < N)
        w = end_first = end_last = 0
        if mask == "window":
            edges = [1, 62, 63, 64, 65, 126, 127, 128, 129, 190, 191, 1000, 2**31 - 1]
            left = int(rng.choice(edges)) if rng.random() < 0.7 else int(rng.integers(1, 800))
            w = min(left, N)
            seen &= rows[None, :] - keys[:, None] <= w
        elif mask == "documents":
            _cu, end = _random_documents(rng, N)
            if rng.random() < 0.5:  # documents ending on or next to block edges
                at = {
                    64 * int(m) + int(e)
                    for m, e in zip(rng.integers(1, 12, 4), rng.integers(-1, 2, 4), strict=True)
                }
                cu = [0, *sorted(c for c in at if 0 < c < N), N]
                end = np.repeat(cu[1:], np.diff(cu))
            end_first, end_last = int(end[min(k0, N - 1)]), int(end[min(k0 + 63, N - 1)])
            seen &= rows[None, :] < np.concatenate([end, np.zeros(64 + BM, int)])[keys][:, None]
        start = int(rng.integers(0, n_blocks + 1))
        stop = int(rng.integers(start, n_blocks + 1))
        case = (mask, BM, N, k0, w, end_first, end_last, start, stop)
        c1, c2, c3, c4 = cuts(
            start, stop, k0, N, w, end_first, end_last, BM, mask == "window", mask == "documents"
        )
        assert start <= c1 <= c2 <= c3 <= c4 <= stop, case
        for i in range(start, stop):
            block = seen[:, i * BM : (i + 1) * BM]
            assert (i < c1 or i >= c4) == (not block.any()), (case, i)
            assert (c2 <= i < c3) == bool(block.all()), (case, i)


def test_masked_last_is_the_measured_default_and_dv_early_is_off_and_checked():
    """MASKED_LAST measured faster in 16 of 16 rows (session 13): on by default, at both d.
    DV_EARLY measured slower or split: off; it cannot go with OVERLAP_DQ."""
    for d in (64, 128):
        assert GB._check_config(d, {})["MASKED_LAST"] is True
        assert GB._check_config(d, dict(MASKED_LAST=False))["MASKED_LAST"] is False
        assert GB._check_config(d, {})["DV_EARLY"] is False
        assert (
            GB._check_config(d, dict(DV_EARLY=True))["OVERLAP_DQ"] is False
        )  # d = 64's default off
    assert GB._check_config(64, {})["OVERLAP_DQ"] is True
    assert GB._check_config(128, {})["ROTATE"] is False  # off until measured
    with pytest.raises(ValueError, match="ROTATE turns the unmasked run of MASKED_LAST"):
        GB.gluon_attention_backward(**_args(), ROTATE=True, MASKED_LAST=False)
    with pytest.raises(ValueError, match="DV_EARLY is written for the step without OVERLAP_DQ"):
        GB.gluon_attention_backward(**_args(), DV_EARLY=True, OVERLAP_DQ=True)
    with pytest.raises(
        ValueError, match=r"MASKED_LAST='yes' not supported; accepted: \(False, True\)"
    ):
        GB.gluon_attention_backward(**_args(), MASKED_LAST="yes")


# ------------------------------------------------ session 14: the masks' host side
def test_window_left_and_cu_seqlens_are_checked_before_anything_runs():
    """window_left and cu_seqlens (packed causal documents) get clear errors for what is not
    accepted, before the kernel's availability is asked (CI has no Hopper)."""
    with pytest.raises(ValueError, match="window_left must be None or an int >= 0"):
        GB.gluon_attention_backward(**_args(), causal=True, window_left=-2)
    with pytest.raises(ValueError, match="causal sliding window: causal=True"):
        GB.gluon_attention_backward(**_args(), window_left=4)
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    bad = [
        (dict(causal=False, cu_seqlens=cu), "packed causal documents"),
        (dict(causal=True, window_left=3, cu_seqlens=cu), "packed causal documents"),
        (dict(causal=True, cu_seqlens=[0, 5, 16]), "1-D int32 or int64 tensor"),
        (dict(causal=True, cu_seqlens=cu.float()), "1-D int32 or int64 tensor"),
        (dict(causal=True, cu_seqlens=cu[:1]), "at least 2 offsets"),
        (dict(causal=True, cu_seqlens=torch.tensor([1, 5, 16])), "rise from 0 to N = 16"),
        (dict(causal=True, cu_seqlens=torch.tensor([0, 5, 15])), "rise from 0 to N = 16"),
        (dict(causal=True, cu_seqlens=torch.tensor([0, 9, 5, 16])), "rise from 0 to N = 16"),
    ]
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            GB.gluon_attention_backward(**_args(), **kwargs)
    with pytest.raises(ValueError, match="one sequence, B = 1; got B = 2"):
        GB.gluon_attention_backward(**_args(B=2), causal=True, cu_seqlens=cu)
    with pytest.raises(RuntimeError, match="unavailable"):  # valid: only the GPU is missing
        GB.gluon_attention_backward(**_args(), causal=True, cu_seqlens=cu)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_doc_bounds_give_each_token_the_start_and_end_of_its_document(dtype):
    """The DOCS masks' per-token bounds (the backward's end of each key's document, the forward's
    start of each query's), against a loop, empty documents included."""
    from course_kernels.gluon.launch import _doc_bounds

    q = torch.empty(1, 1, 11, 64)
    for cu in ([0, 11], [0, 3, 3, 7, 11], [0, 1, 2, 10, 11], [0, 0, 11]):
        ends = [next(e for e in cu[1:] if e > t) for t in range(11)]
        starts = [max(s for s in cu[:-1] if s <= t) for t in range(11)]
        for checked in (False, True):  # the values read here, or by the caller already
            offsets = torch.tensor(cu, dtype=dtype)
            got = _doc_bounds(offsets, True, None, q, checked, "end")
            assert got.dtype == torch.int32 and got.tolist() == ends, cu
            got = _doc_bounds(offsets, True, None, q, checked, "start")
            assert got.dtype == torch.int32 and got.tolist() == starts, cu


def test_doc_bounds_are_three_small_ops_and_agree_with_a_loop_on_random_offsets():
    """Session 27: the bounds are an arange, a searchsorted and a gather (three small kernels on a
    GPU, for host time: the documents calls were found host-bound), no more, on int32 offsets; and
    on 200 random packings (empty documents and one-token ones among them) each token gets its
    own document's start and end."""
    import random

    from torch.utils._python_dispatch import TorchDispatchMode

    from course_kernels.gluon.launch import _doc_bounds

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    q = torch.empty(1, 1, 11, 64)
    cu = torch.tensor([0, 3, 3, 7, 11], dtype=torch.int32)
    with Ops() as seen:
        _doc_bounds(cu, True, None, q, True, "end")
    assert [op for op in seen.ops if op != "slice"] == ["arange", "searchsorted", "index"]
    rng = random.Random(27)
    for _ in range(200):
        n = rng.randint(1, 40)
        offsets = [0, *sorted(rng.randint(0, n) for _ in range(rng.randint(0, 6))), n]
        q = torch.empty(1, 1, n, 64)
        for dtype in (torch.int32, torch.int64):
            t = torch.tensor(offsets, dtype=dtype)
            starts = _doc_bounds(t, True, None, q, True, "start").tolist()
            ends = _doc_bounds(t, True, None, q, True, "end").tolist()
            for tok in range(n):
                j = next(j for j in range(len(offsets) - 1) if offsets[j] <= tok < offsets[j + 1])
                assert (starts[tok], ends[tok]) == (offsets[j], offsets[j + 1]), (offsets, tok)


def test_packed_documents_ask_for_the_gluon_backward_only_when_it_applies(monkeypatch):
    """``_backward_c`` on packed varlen inputs asks the choice for the "documents" backward only
    for a causal mask with one cu_seqlens for queries and keys (the same tensor), and hands the
    Gluon varlen backward the natural-log lse and those offsets; otherwise the tl kernels run."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import CAUSAL, PLAIN, Variant

    asked, calls = [], []

    def use(q, k, backward=False, mask=""):
        asked.append((mask, tuple(q.shape), tuple(k.shape)))
        return True

    def fake(do, q, k, v, o, lse, cu_seqlens, scale, packed, offsets_checked):
        calls.append((lse, cu_seqlens, scale, packed, offsets_checked))
        return "dq", "dk", "dv"

    monkeypatch.setattr(launch, "_use_gluon", use)
    monkeypatch.setattr(launch, "gluon_varlen_backward", fake)
    T, H, d = 12, 2, 64
    q, k, v, o, do = (torch.randn(T, H, d) for _ in range(5))
    lse_c = torch.randn(H, T)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    got = launch._backward_c(do, q, k, v, o, lse_c, CAUSAL, 0.3, None, (cu, cu, 7, 7))
    assert got == ("dq", "dk", "dv") and asked == [("documents", (1, H, T, d), (1, H, T, d))]
    lse, offsets, scale, packed, checked = calls[0]
    assert torch.equal(lse, lse_c * CAUSAL.units(0.3)[1]) and offsets is cu and scale == 0.3
    assert packed and checked  # in place; the forward has read the offsets already
    bottom_right = Variant(causal=True, bottom_right=True)  # flash_attention_varlen's default
    launch._backward_c(do, q, k, v, o, lse_c, bottom_right, 0.3, None, (cu, cu, 7, 7))
    assert len(calls) == 2  # one offsets tensor: every document square, the corners agree
    calls.pop(), asked.pop()
    for variant, cu_k in (
        (CAUSAL, cu.clone()),  # another tensor for the keys: not checked equal, not taken
        (PLAIN, cu),
        (Variant(causal=True, window=(3, 0)), cu),
        (Variant(causal=True, softcap=20.0), cu),
    ):
        dq, dk, dv = launch._backward_c(do, q, k, v, o, lse_c, variant, 0.3, None, (cu, cu_k, 7, 7))
        assert dq.shape == q.shape and len(calls) == 1 and len(asked) == 1, variant


def test_gluon_varlen_backward_checks_its_packed_inputs_like_the_dense_call():
    """gluon_varlen_backward (flash-attn's (total, H, d) layout, lse (H, total)) refuses what the
    dense call refuses, with the same messages, before asking for the GPU; both layouts."""
    T, H, d = 16, 2, 64
    q, k, v, o, do = (torch.randn(T, H, d, dtype=torch.float16) for _ in range(5))
    lse = torch.randn(H, T)
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    for packed in (True, False):
        with pytest.raises(ValueError, match="lse must be the forward's natural-log logsumexp"):
            GB.gluon_varlen_backward(do, q, k, v, o, lse[:, :-1], cu, 0.125, packed=packed)
        with pytest.raises(ValueError, match="rise from 0 to N = 16"):
            GB.gluon_varlen_backward(do, q, k, v, o, lse, cu + 1, 0.125, packed=packed)
        k3 = torch.randn(T, 3, d, dtype=torch.float16)  # 3 K/V heads for 2 query heads
        with pytest.raises(ValueError, match="multiple of K/V heads 3"):
            GB.gluon_varlen_backward(do, q, k3, k3, o, lse, cu, 0.125, packed=packed)
        with pytest.raises(RuntimeError, match="unavailable"):  # GQA passes the checks
            GB.gluon_varlen_backward(do, q, k[:, :1], v[:, :1], o, lse, cu, 0.125, packed=packed)
        with pytest.raises(ValueError, match="unknown"):
            GB.gluon_varlen_backward(do, q, k, v, o, lse, cu, 0.125, packed=packed, BLOCK=3)
        with pytest.raises(RuntimeError, match="unavailable"):  # valid: only the GPU is missing
            GB.gluon_varlen_backward(do, q, k, v, o, lse, cu, 0.125, packed=packed)


@pytest.mark.parametrize("mask", ["causal", "window", "documents"])
def test_reach_gives_the_mask_as_one_unsigned_compare(mask, monkeypatch):
    """Session 16: the masked step keeps P^T where (q - k) as uint32 < reach(k) (``_keep_seen``,
    inline PTX); ``_reach`` (the kernel's own code, run with NumPy standing in for ``gl``) gives
    each key's reach. The compare must equal the mask itself for every key and every query row
    < N (rows past N have P = 0 from their L = +inf): causal k <= q, keys past N never seen, a
    window's q - k <= left, a document's q < end(k). Against brute force over 600 cases."""
    if not GB_kernel.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")

    class Ptr:  # kend_ptr + key -> (array, index), read by the shim's load
        def __init__(self, a):
            self.a = a

        def __add__(self, idx):
            return self.a, idx

    def load(p, mask, other):
        a, idx = p
        return np.where(mask, a[np.clip(idx, 0, len(a) - 1)], other)

    shim = types.SimpleNamespace(where=np.where, minimum=np.minimum, load=load)
    monkeypatch.setattr(GB_steps, "gl", shim)
    reach_of = GB_steps._reach.fn
    rng = np.random.default_rng(16)
    for _ in range(600):
        N = int(rng.integers(1, 700))
        n0 = 64 * int(rng.integers(0, -(-N // 64)))
        key, rows = n0 + np.arange(64), np.arange(N)
        shown = (key[:, None] <= rows[None, :]) & (key[:, None] < N)
        left, end = int(rng.integers(0, 800)), np.full(N, N)
        if mask == "window":
            shown &= rows[None, :] - key[:, None] <= left
        elif mask == "documents":
            _, end = _random_documents(rng, N)
            shown &= rows[None, :] < np.concatenate([end, np.zeros(64, int)])[key][:, None]
        reach = reach_of(key, N, left, Ptr(end), mask == "window", mask == "documents")
        diff = (rows[None, :] - key[:, None]).astype(np.int64) % 2**32  # the uint32 view
        np.testing.assert_array_equal(diff < reach[:, None], shown, err_msg=str((N, n0, left)))


@pytest.mark.parametrize(
    "section, tail", [(0, 0), (2, 0), (4, 0), (8, 0), (16, 0), (0, 2), (0, 4), (0, 8), (0, 16)]
)
def test_backward_cta_order_covers_every_tile_once_heaviest_first(section, tail, monkeypatch):
    """Session 17: ``scheduler._bwd_tile`` (the kernel's own code, run on Python ints with a
    stand-in for ``gl``) maps the grid the launch makes (1-D of n_kb x heads CTAs with SECTION
    or TAIL, else (n_kb, heads)) onto every (key block, batch x head) exactly once, in the order
    it promises: SECTION, heads innermost in consecutive sections of SECTION (the last may hold
    fewer), key block 0 (the heaviest under causal masking) first within a section; TAIL, head
    after head except the last TAIL heads, taken together, heads innermost. A wrong decode, a
    lost partial section or the forward's heaviest-LAST order fails."""
    if not GB_kernel.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")
    from course_kernels.gluon import scheduler

    BN = 128
    monkeypatch.setattr(scheduler, "_tile_coords", scheduler._tile_coords.fn)
    flat = bool(section or tail)
    for heads in (1, 3, 5, 6, 16, 64):
        for N in (1, 128, 129, 1000, 4096):
            n_kb = -(-N // BN)
            ids = (
                [(p, 0) for p in range(n_kb * heads)]
                if flat
                else [(kb, h) for h in range(heads) for kb in range(n_kb)]
            )  # launch order: x fastest
            shape = (n_kb * heads, 1) if flat else (n_kb, heads)
            order = []
            for pid in ids:
                shim = types.SimpleNamespace(
                    program_id=lambda a, pid=pid: pid[a],
                    num_programs=lambda a, shape=shape: shape[a],
                    cdiv=lambda x, y: -(-x // y), maximum=max,
                )  # fmt: skip
                monkeypatch.setattr(scheduler, "gl", shim)
                n0, hz, n_heads = scheduler._bwd_tile.fn(N, BN, section, tail)
                assert n_heads == heads and n0 % BN == 0
                order.append((n0 // BN, hz))
            assert sorted(order) == [(kb, h) for kb in range(n_kb) for h in range(heads)]
            if tail:
                lead = max(heads - tail, 0)
                groups = [range(h, h + 1) for h in range(lead)] + [range(lead, heads)]
            else:
                step = section or 1
                groups = [range(f, min(f + step, heads)) for f in range(0, heads, step)]
            expect = [(kb, h) for hs in groups for kb in range(n_kb) for h in hs]
            assert order == expect, (heads, N, section, tail)


def test_cta_order_defaults_are_what_the_h100_measurements_chose():
    """Session 17: BACKWARD_SECTION puts the packed documents' CTAs in sections of 8 heads
    because SECTION = 8 ran faster than the plain grid at both head dims in both shipped runs of
    experiments/gluon/bench_section.py (medians of 5 and 7 interleaved rounds) and in the
    features runs at d = 128 (two processes with it, one without, FlexAttention in each);
    dense causal keeps the plain grid because no order gained in every causal row."""
    from course_kernels.bench import features
    from course_kernels.datafiles import data_path

    runs = [json.loads(data_path(f"gluon/h100_bwd_{kind}_session17_{mask}.json").read_text())
            for kind in ("section", "order") for mask in ("docs", "causal")]  # fmt: skip
    rows = [r for run in runs for r in run["rows"]]
    assert all(c["ok"] for r in rows for c in r["checks"].values())  # same dk, dv bits
    docs = [r for r in rows if r["mask"] == "documents"]
    assert {r["d"] for r in docs} == {64, 128} and len(docs) == 4
    assert all(r["speedup"]["8"] > 1.0 for r in docs)
    assert GB.BACKWARD_SECTION["documents"][64] == 8  # d = 128: 4 since session 24 (below)
    causal = [r for r in rows if r["mask"] == "causal" and r["d"] == 128]
    orders = set.intersection(*(set(r["speedup"]) for r in causal)) - {"0"}
    assert orders and not any(all(r["speedup"][o] >= 1.03 for r in causal) for o in orders)
    assert GB.BACKWARD_SECTION["dense"] == {64: 0, 128: 0}
    assert GB.BACKWARD_TAIL == {"dense": 0, "documents": 0}
    ms = {}
    for run in ("section8_run1", "section0_run2", "section8_run3"):
        rec = json.loads(
            data_path(f"bench/h100_features_bench_session17_docs_bwd_d128_{run}.json").read_text()
        )
        assert rec["args"]["gluon_section"] == int(run[7])
        (r,) = [r for r in features.comparisons(rec, "flex") if r["pass"] == "bwd"]
        ms[run] = r["ratio"]
    assert min(ms["section8_run1"], ms["section8_run3"]) > ms["section0_run2"]


def test_session18_levers_that_lost_stay_off():
    """Session 18 (an H100): three levers timed against the default on the same inputs in one
    process (experiments/gluon/bench_section.py, median of 5 interleaved rounds) and none kept.
    The window backward in any other CTA order (TAIL 4 / 8, SECTION 4 / 8; the block-scheduler
    model had predicted the plain grid's tail at 3.5% at d = 128, N = 4K) ran slower in every
    row at both head dims; a third (Q, dO) stage (STAGES = 3) slower at d = 128 in every causal
    and window row; and without a mask, sections of 2 or 4 heads and ROTATE (the CTAs of a head
    out of step on the dQ rows) gained no more than 1.2% in any row. So the dense backward keeps
    the plain grid, d = 128 two stages, ROTATE off. A default changed without new data fails."""
    from course_kernels.datafiles import data_path

    def rows(name):
        rec = json.loads(data_path(f"gluon/{name}.json").read_text())
        assert rec["gpu"].startswith("NVIDIA H100") and rec["rows"]
        return rec["rows"]

    window = rows("h100_bwd_order_session18_window")
    assert {(r["d"], r["n"]) for r in window} == {
        (d, n) for d in (64, 128) for n in (4096, 8192, 16384)
    }
    assert all(c["ok"] for r in window for c in r["checks"].values())  # the same dk, dv bits
    assert all(s < 1.0 for r in window for o, s in r["speedup"].items() if o != "0")
    assert GB.BACKWARD_SECTION["dense"] == {64: 0, 128: 0} and GB.BACKWARD_TAIL["dense"] == 0
    stages = rows("h100_bwd_stages_session18")
    assert {r["mask"] for r in stages} == {"causal", "window"} and {r["d"] for r in stages} == {128}
    assert all(r["speedup"]["STAGES=3"] < 1.0 for r in stages)
    assert GB.BACKWARD_CONFIG[128]["STAGES"] == 2
    full = rows("h100_bwd_full_order_session18")
    assert {r["mask"] for r in full} == {"full"} and len(full) == 6
    gains = [s for r in full for o, s in r["speedup"].items() if o != "0"]
    assert max(gains) < 1.02 and all(r["speedup"]["ROTATE=1"] < 1.0 for r in full)
    assert GB.BACKWARD_DQ_DEFAULTS["ROTATE"] is False


def test_dq_convert_is_off_and_needs_dq_tma():
    """Session 18's DQ_CONVERT (dq converted inside the main kernel by each head's last
    CTA) is off in the base schedule (``_check_config``; session 22 turns it on by kind of call,
    ``_schedule``) and refused without DQ_TMA's padded dQ_acc, with a message that says so."""
    for d in (64, 128):
        assert GB._check_config(d, {})["DQ_CONVERT"] is False
        assert GB._check_config(d, dict(DQ_CONVERT=True))["DQ_CONVERT"] is True  # DQ_TMA default
    with pytest.raises(ValueError, match="DQ_CONVERT converts DQ_TMA's padded dQ_acc"):
        GB.gluon_attention_backward(**_args(), DQ_CONVERT=True, DQ_TMA=False)
    with pytest.raises(ValueError, match=r"DQ_CONVERT='yes' not supported; accepted: \(False"):
        GB._check_config(64, dict(DQ_CONVERT="yes"))


def test_keep_acc_is_off_and_needs_dq_convert_without_zero_acc():
    """KEEP_ACC (session 31: dQ_acc kept zero from call to call, cleared by DQ_CONVERT's last
    CTAs, so no fill): off by default but in window calls at d = 128, taken where DQ_CONVERT runs
    (non-causal d = 128 turns it on by default; causal calls pass it), refused without DQ_CONVERT or with ZERO_ACC
    (whose zeros would be a second clearing), each message naming what it got."""
    assert GB.BACKWARD_DQ_DEFAULTS["KEEP_ACC"] is False
    for args in ((64, False, False, False), (128, False, False, False), (128, True, True, True)):
        assert GB._schedule(*args, {})["KEEP_ACC"] is False
    # window calls at d = 128 take it with DQ_CONVERT = 2 (BACKWARD_WINDOW_KEEP, session 33)
    assert GB.BACKWARD_WINDOW_KEEP == {64: False, 128: True}
    assert GB._schedule(128, True, True, False, {})["KEEP_ACC"] is True
    assert GB._schedule(128, False, False, False, dict(KEEP_ACC=True))["KEEP_ACC"] is True
    on = GB._schedule(128, True, True, False, dict(KEEP_ACC=True, DQ_CONVERT=True))
    assert on["KEEP_ACC"] is True and on["DQ_CONVERT"] is True
    need = "KEEP_ACC's dQ_acc is cleared by DQ_CONVERT's converting CTAs: it needs DQ_CONVERT"
    with pytest.raises(ValueError, match=need + ".*got DQ_CONVERT=False, ZERO_ACC=False"):
        GB.gluon_attention_backward(**_args(), causal=True, KEEP_ACC=True)  # causal: no DQ_CONVERT
    with pytest.raises(ValueError, match="got DQ_CONVERT=True, ZERO_ACC=True"):
        GB.gluon_attention_backward(**_args(d=128), KEEP_ACC=True, ZERO_ACC=True)
    with pytest.raises(ValueError, match=r"KEEP_ACC=1.5 not supported; accepted: \(False, True\)"):
        GB.gluon_attention_backward(**_args(), KEEP_ACC=1.5)
    # DQ_CONVERT = 2 (each query block converted by the CTA that completes it): taken with
    # KEEP_ACC, refused with ZERO_ACC (the preprocessing sets its counters), 3 refused
    two = GB._schedule(128, True, True, False, dict(DQ_CONVERT=2, KEEP_ACC=True))
    assert two["DQ_CONVERT"] == 2 and two["KEEP_ACC"] is True
    assert GB._schedule(64, False, False, False, dict(DQ_CONVERT=2))["DQ_CONVERT"] == 2
    with pytest.raises(ValueError, match="DQ_CONVERT=2's counters are set by the preprocessing"):
        GB.gluon_attention_backward(**_args(), DQ_CONVERT=2, ZERO_ACC=True)
    with pytest.raises(
        ValueError, match=r"DQ_CONVERT=3 not supported; accepted: \(False, True, 2\)"
    ):
        GB.gluon_attention_backward(**_args(), DQ_CONVERT=3)
    with pytest.raises(ValueError, match="DQ_CONVERT needs a CTA per tile: not with PERSIST"):
        GB.gluon_attention_backward(**_args(), DQ_CONVERT=2, PERSIST=True)


def test_window_keep_default_takes_window_calls_only_and_yields_to_the_call(monkeypatch):
    """BACKWARD_WINDOW_KEEP[d] (session 32: the measured decision for window calls): where on, a
    causal sliding-window call without documents runs DQ_CONVERT = 2 with KEEP_ACC; plain causal,
    non-causal and documents calls, other head dims, and calls that pass DQ_CONVERT, KEEP_ACC,
    ZERO_ACC or PERSIST themselves keep what they had."""
    monkeypatch.setitem(GB.BACKWARD_WINDOW_KEEP, 128, True)
    on = GB._schedule(128, True, True, False, {})
    assert on["DQ_CONVERT"] == 2 and on["KEEP_ACC"] is True
    for args in ((128, True, False, False), (128, False, False, False), (128, True, True, True),
                 (64, True, True, False)):  # fmt: skip
        assert GB._schedule(*args, {})["KEEP_ACC"] is False, args
    own = (dict(DQ_CONVERT=True), dict(KEEP_ACC=False), dict(ZERO_ACC=True), dict(PERSIST=True))
    for config in own:
        cfg = GB._schedule(128, True, True, False, config)
        assert cfg["KEEP_ACC"] is False and cfg["DQ_CONVERT"] != 2, config
    monkeypatch.setitem(GB.BACKWARD_WINDOW_KEEP, 128, False)
    assert GB._schedule(128, True, True, False, {})["DQ_CONVERT"] is False


def test_release_kept_buffers_frees_them_and_counts_their_bytes(monkeypatch):
    """release_kept_buffers drops every kept dQ_acc buffer and returns their bytes (0 when none)."""
    monkeypatch.setattr(GB, "_KEPT", {})
    assert GB.release_kept_buffers() == 0
    GB._KEPT[("cuda:0", 7, torch.float32)] = torch.zeros(1000)
    GB._KEPT[("cuda:1", 7, torch.float32)] = torch.zeros(24)
    assert GB.release_kept_buffers() == 4096 and GB._KEPT == {}
    assert GB.release_kept_buffers() == 0


def test_empty_sequences_and_dq_chunks_without_dq_shared():
    """N = 0 is refused with its own message; without DQ_SHARED each consumer's dQ chunk spans
    d // DQ_SPLIT columns (not split across the consumers), and DQ_TMA stays off."""
    with pytest.raises(ValueError, match="sequence length 0"):
        GB.gluon_attention_backward(**_args(N=0))
    cfg = GB._check_config(64, dict(DQ_SHARED=False, DQ_SPLIT=4))  # 16 columns
    assert cfg["DQ_SPLIT"] == 4 and cfg["DQ_TMA"] is False


def test_the_shared_memory_limit_is_inclusive(monkeypatch):
    tma = dict(DQ_TMA=GB._check_config(64, {})["DQ_TMA"])
    need = GB.shared_bytes(64, GB._check_config(64, tma))
    monkeypatch.setattr(GB, "SMEM_LIMIT", need)
    GB._check_config(64, tma)
    monkeypatch.setattr(GB, "SMEM_LIMIT", need - 1)
    with pytest.raises(ValueError, match=f"about {need} bytes of shared memory"):
        GB._check_config(64, tma)


def test_a_callers_tail_keeps_the_documents_default_section_off(monkeypatch):
    """Packed documents default to SECTION = 8, unless the call passes SECTION or TAIL: a TAIL of
    its own then runs with SECTION = 0 (the two orders exclude each other)."""
    seen = []
    real = GB._check_config
    monkeypatch.setattr(
        GB, "_check_config", lambda d, config: seen.append(real(d, config)) or seen[-1]
    )
    a = _args(N=16)
    cu = torch.tensor([0, 6, 16], dtype=torch.int32)
    for config, want in ((dict(), (8, 0)), (dict(TAIL=4), (0, 4)), (dict(SECTION=2), (2, 0))):
        with pytest.raises(RuntimeError, match="unavailable"):
            GB.gluon_attention_backward(**a, causal=True, cu_seqlens=cu, **config)
        assert (seen[-1]["SECTION"], seen[-1]["TAIL"]) == want, config
    with pytest.raises(ValueError, match="SECTION, TAIL and PERSIST are three CTA orders"):
        GB.gluon_attention_backward(**a, causal=True, cu_seqlens=cu, SECTION=2, TAIL=4)


def test_persist_is_a_cta_order_of_its_own(monkeypatch):
    """PERSIST (session 21; off by default): one CTA an SM looping over the tiles in the plain
    grid's order. It replaces the documents' default SECTION rather than clashing with it,
    refuses an explicit SECTION or TAIL and DQ_CONVERT (whose count is one a tile and CTA), and
    takes only booleans."""
    seen = []
    real = GB._check_config
    monkeypatch.setattr(
        GB, "_check_config", lambda d, config: seen.append(real(d, config)) or seen[-1]
    )
    assert GB._check_config(64, {})["PERSIST"] is False
    a = _args(N=16)
    cu = torch.tensor([0, 6, 16], dtype=torch.int32)
    for docs in (None, cu):
        with pytest.raises(RuntimeError, match="unavailable"):
            GB.gluon_attention_backward(**a, causal=True, cu_seqlens=docs, PERSIST=True)
        assert (seen[-1]["PERSIST"], seen[-1]["SECTION"], seen[-1]["TAIL"]) == (True, 0, 0)
    for other in (dict(SECTION=8), dict(TAIL=4)):
        with pytest.raises(ValueError, match="SECTION, TAIL and PERSIST are three CTA orders"):
            GB.gluon_attention_backward(**a, causal=True, PERSIST=True, **other)
    with pytest.raises(ValueError, match="DQ_CONVERT needs a CTA per tile: not with PERSIST"):
        GB.gluon_attention_backward(**a, PERSIST=True, DQ_CONVERT=True)
    with pytest.raises(ValueError, match=r"PERSIST=2 not supported; accepted: \(False, True\)"):
        GB.gluon_attention_backward(**a, PERSIST=2)


def test_the_backward_asks_for_document_ends_and_the_window_over_n(monkeypatch):
    """The backward's DOCS mask reads each key's document end (side "end"), its window is
    checked against the sequence length N, and a varlen call whose offsets were read already
    does not read them again."""
    seen = []
    for name in ("_doc_bounds", "_check_window"):
        real = getattr(GB, name)
        monkeypatch.setattr(GB, name, lambda *a, _r=real, _n=name: seen.append((_n, a)) or _r(*a))
    a = _args(H=2, N=16)
    cu = torch.tensor([0, 6, 16], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="unavailable"):
        GB.gluon_attention_backward(**a, causal=True, cu_seqlens=cu)
    assert [s[1][-1] for s in seen if s[0] == "_doc_bounds"] == ["end"]
    with pytest.raises(RuntimeError, match="unavailable"):
        GB.gluon_attention_backward(**a, causal=True, window_left=4)
    assert seen[-1] == ("_check_window", (4, True, 16))
    spy = cu.as_subclass(_NoValues)
    packed = {k: x[0].transpose(0, 1).contiguous() for k, x in a.items() if k != "lse"}
    with pytest.raises(RuntimeError, match="unavailable"):
        GB.gluon_varlen_backward(**packed, lse=a["lse"][0], cu_seqlens=spy, scale=None,
                                 offsets_checked=True)  # fmt: skip


class _NoValues(torch.Tensor):
    """Offsets whose values must not be read (the caller has read them)."""

    def tolist(self):
        raise AssertionError("cu_seqlens read again")


def test_schedule_by_kind_of_call(monkeypatch):
    """Sessions 22-24's measured defaults: every call at d = 64 takes BM = 128 (dense since 22,
    window and documents since 24), and causal dense calls there a third ring stage (STAGES = 3;
    not under a window or on documents: not measured there); non-causal calls at d = 128 convert
    dq inside the kernel (DQ_CONVERT), causal calls and d = 64 do not. A call's own BM, STAGES or
    DQ_CONVERT wins, PERSIST turns DQ_CONVERT's default off rather than clashing with it, and the
    features script's --gluon-dq-convert (BACKWARD_DQ_DEFAULTS) still turns it on everywhere."""
    sched = GB._schedule  # (d, causal, windowed, docs, config)
    assert [sched(64, c, False, False, {})["BM"] for c in (False, True)] == [128, 128]
    assert sched(64, True, True, False, {})["BM"] == GB.BACKWARD_BM[64] == 128  # window
    assert sched(64, True, False, True, {})["BM"] == 128  # documents
    assert sched(64, True, True, False, dict(BM=64))["BM"] == 64
    assert sched(128, True, True, False, {})["BM"] == 64
    two = GB.BACKWARD_CONFIG[64]["STAGES"]
    assert two == 2 and GB.BACKWARD_CAUSAL_STAGES[64] == 3
    assert sched(64, True, False, False, {})["STAGES"] == 3  # causal, dense
    assert sched(64, False, False, False, {})["STAGES"] == two  # no mask: lost 2-6% (23)
    assert sched(64, True, True, False, {})["STAGES"] == two  # window
    assert sched(64, True, False, True, {})["STAGES"] == two  # documents
    assert sched(64, True, False, False, dict(BM=64))["STAGES"] == two  # measured on BM = 128 only
    assert sched(64, True, False, False, dict(STAGES=1))["STAGES"] == 1
    assert sched(128, True, False, False, {})["STAGES"] == GB.BACKWARD_CONFIG[128]["STAGES"]
    assert [sched(d, True, False, True, {})["SECTION"] for d in (64, 128)] == [8, 4]  # documents
    assert [sched(d, True, False, False, {})["SECTION"] for d in (64, 128)] == [0, 0]  # dense
    assert sched(128, True, False, True, dict(SECTION=16))["SECTION"] == 16
    assert sched(64, False, False, False, dict(BM=64))["BM"] == 64
    assert sched(128, False, False, False, {})["BM"] == GB.BACKWARD_CONFIG[128]["BM"] == 64
    assert sched(128, False, False, False, {})["DQ_CONVERT"] is True
    assert sched(128, True, False, False, {})["DQ_CONVERT"] is False
    assert sched(64, False, False, False, {})["DQ_CONVERT"] is False
    assert sched(128, False, False, False, dict(DQ_CONVERT=False))["DQ_CONVERT"] is False
    assert sched(128, False, False, False, dict(DQ_TMA=False))["DQ_CONVERT"] is False
    cfg = sched(128, False, False, False, dict(PERSIST=True))
    assert cfg["PERSIST"] is True and cfg["DQ_CONVERT"] is False
    monkeypatch.setitem(GB.BACKWARD_DQ_DEFAULTS, "DQ_CONVERT", True)
    assert sched(64, False, False, False, {})["DQ_CONVERT"] is True
    assert sched(64, True, False, False, {})["DQ_CONVERT"] is True
    monkeypatch.setitem(GB.BACKWARD_DQ_DEFAULTS, "DQ_CONVERT", False)
    seen = []  # the public call runs the same schedule
    real = GB._check_config
    monkeypatch.setattr(
        GB, "_check_config", lambda d, config: seen.append(real(d, config)) or seen[-1]
    )
    for d, causal, want in ((64, True, (128, False)), (128, False, (64, True))):
        with pytest.raises(RuntimeError, match="unavailable"):
            GB.gluon_attention_backward(**_args(d=d), causal=causal)
        assert (seen[-1]["BM"], seen[-1]["DQ_CONVERT"]) == want
    with pytest.raises(RuntimeError, match="unavailable"):
        GB.gluon_attention_backward(**_args(d=64), causal=True, window_left=4)
    assert (seen[-1]["BM"], seen[-1]["STAGES"]) == (128, 2)
    with pytest.raises(RuntimeError, match="unavailable"):  # a window wider than N: plain causal
        GB.gluon_attention_backward(**_args(d=64), causal=True, window_left=10**6)
    assert (seen[-1]["BM"], seen[-1]["STAGES"]) == (128, 3)


def test_session22_measurements_back_the_schedule():
    """The data behind ``_schedule`` (an H100, experiments/gluon/bench_section.py, median of 5
    interleaved rounds a process, every variant checked against the default on the same inputs).
    PERSIST and DQ_CONVERT beside the default in three processes: DQ_CONVERT gains in every
    no-mask row at d = 128 (on there) and loses more than 1% in some no-mask row at d = 64 (off);
    PERSIST loses in every causal row (off). BM = 128 at d = 64 beside the default and cuDNN in
    three processes a dtype: faster than BM = 64 in every row, the best of the one-process sweep
    of eleven switches at N = 4K. A default changed without new data fails."""
    from course_kernels.datafiles import data_path

    SKIP = ("cudnn", "ROTATE=1")  # other sums: not bit-equal to the default's dK, dV

    def rows(name):
        rec = json.loads(data_path(f"gluon/{name}.json").read_text())
        assert rec["gpu"].startswith("NVIDIA H100") and not rec["compile_failures"]
        assert rec["rows"] and all(r["status"] == "ok" for r in rec["rows"])
        assert all(c["ok"] for r in rec["rows"] for o, c in r["checks"].items() if o not in SKIP)
        return rec["rows"]

    persist = [r for i in (1, 2, 3) for r in rows(f"h100_persist_session22_run{i}")]
    full = {d: [r["speedup"]["DQ_CONVERT=1"] for r in persist if r["mask"] == "full" and r["d"] == d]
            for d in (64, 128)}  # fmt: skip
    assert len(full[128]) == 9 and min(full[128]) > 1.0 and min(full[64]) < 0.99
    assert GB.BACKWARD_DQ_CONVERT == {64: False, 128: True}
    assert max(r["speedup"]["PERSIST=1"] for r in persist if r["mask"] == "causal") < 1.0
    assert GB.BACKWARD_DQ_DEFAULTS["PERSIST"] is False
    bm = [r for dt in ("float16", "bfloat16") for i in (1, 2, 3)
          for r in rows(f"h100_bwd_bm128_session22_{dt}_run{i}")]  # fmt: skip
    assert len(bm) == 36 and {r["d"] for r in bm} == {64}
    assert min(r["speedup"]["BM=128"] for r in bm) > 1.0
    for dt in ("float16", "bfloat16"):
        for r in rows(f"h100_bwd_sweep_session22_{dt}"):
            if r["n"] == 4096:
                levers = {o: s for o, s in r["speedup"].items() if o not in ("0", "cudnn")}
                assert max(levers, key=levers.get) == "BM=128", (dt, levers)
    assert GB.BACKWARD_BM == {64: 128}


def test_session24_measurements_back_the_masked_and_causal_defaults():
    """Session 24 (an H100): with BM = 128 for window and documents calls at d = 64, every GPU
    test whose name has window, documents or varlen in it passed, none skipped; STAGES = 3 on
    top of BM = 128 gained in every causal d = 64 row of three processes a dtype, dK and dV bit
    for bit the default's, and lost in every window and documents row; SECTION = 4 beat the
    documents' 8 at d = 128 in every process. A default changed without its data fails."""
    from course_kernels.datafiles import data_path

    tests = json.loads(data_path("gluon/h100_tests_session24_masked.json").read_text())
    assert (
        tests["gpu"].startswith("NVIDIA H100")
        and "window or documents or varlen" in tests["command"]
    )
    assert tests["tests"] == tests["passed"] > 600 and tests["failed"] == tests["errors"] == 0
    stages = []
    for dt in ("float16", "bfloat16"):
        for i in (1, 2, 3):
            rec = json.loads(
                data_path(f"gluon/h100_bwd_stages_session24_{dt}_run{i}.json").read_text()
            )
            assert rec["gpu"].startswith("NVIDIA H100") and "STAGES=3" in rec["command"]
            for r in rec["rows"]:
                assert r["status"] == "ok" and r["mask"] == "causal" and r["d"] == 64
                assert r["checks"]["STAGES=3"]["ok"] and r["checks"]["STAGES=3"]["dk_dv_bitwise"]
                stages.append(r["speedup"]["STAGES=3"])
    assert len(stages) == 18 and min(stages) > 1.0
    assert GB.BACKWARD_CAUSAL_STAGES == {64: 3} and GB.BACKWARD_BM == {64: 128}
    # the same third stage under a window or on documents lost in every pair: not applied there
    exp = Path(__file__).resolve().parents[1] / "experiments" / "data" / "gluon"
    masked = [
        r["speedup"]["STAGES=3"]
        for dt in ("float16", "bfloat16")
        for i in (1, 2, 3)
        for r in json.loads((exp / f"h100_masked_stages_session24_{dt}_run{i}.json").read_text())[
            "rows"
        ]
    ]
    assert len(masked) == 24 and max(masked) < 1.0
    assert GB._schedule(64, True, True, False, {})["STAGES"] == GB.BACKWARD_CONFIG[64]["STAGES"]
    # documents at d = 128: sections of 4 heads beat the 8 of session 17 in every pair
    section = []
    for dt in ("float16", "bfloat16"):
        for i in (1, 2, 3):
            name = f"gluon/h100_docs128_section_session24_{dt}_run{i}.json"
            (r,) = json.loads(data_path(name).read_text())["rows"]
            assert r["status"] == "ok" and (r["mask"], r["d"]) == ("documents", 128)
            assert r["checks"]["SECTION=4"]["ok"] and r["checks"]["SECTION=4"]["dk_dv_bitwise"]
            section.append(r["speedup"]["SECTION=4"])
    assert len(section) == 6 and min(section) > 1.0
    assert GB.BACKWARD_SECTION["documents"] == {64: 8, 128: 4}


@pytest.mark.parametrize("switch", ["ZERO_ACC", "PDL"])
def test_boolean_switch_is_off_by_default(switch):
    """ZERO_ACC (session 22; timed in session 23: -5.3 to +3.0% on window and documents rows:
    dQ_acc and the DQ_CONVERT counters zeroed by the preprocessing kernel instead of a fill before
    it) and PDL (session 26: each kernel launched while the one before it runs; timed in session
    27 on an H100, three processes a dtype: it lost in some (row, process) pairs, so its rule,
    a gain in every pair, was not met): off by default in every kind of call, on only when a
    call asks (causal or not), and they take only booleans."""
    assert GB.BACKWARD_DQ_DEFAULTS[switch] is False
    if switch == "PDL":  # the record behind "off": 3 rows x 2 dtypes x 3 processes, checked
        exp = Path(__file__).resolve().parents[1] / "experiments" / "data" / "gluon"
        got = []
        for dt in ("float16", "bfloat16"):
            for i in (1, 2, 3):
                rec = json.loads((exp / f"h100_pdl_session27_{dt}_run{i}.json").read_text())
                for r in rec["rows"]:
                    assert r["status"] == "ok" and r["checks"]["PDL=1"]["dk_dv_bitwise"]
                    got.append(r["speedup"]["PDL=1"])
        assert len(got) == 18 and min(got) < 1.0 < max(got)
    for args in ((64, False, False, False), (128, True, True, False), (64, True, False, True)):
        assert GB._schedule(*args, {})[switch] is False
    for causal in (False, True):
        assert GB._schedule(128, causal, False, False, {switch: True})[switch] is True
    with pytest.raises(ValueError, match=rf"{switch}=2 not supported; accepted: \(False, True\)"):
        GB.gluon_attention_backward(**_args(), **{switch: 2})


def test_wg_mask_is_an_option_off_by_default():
    """WG_MASK (session 24, compiled offline, not yet run on a GPU): off by default in every kind
    of call; written for the step without OVERLAP_DQ, so it turns OVERLAP_DQ's default off at
    d = 64, and OVERLAP_DQ=True passed with it is refused with a message naming both."""
    assert GB.BACKWARD_DQ_DEFAULTS["WG_MASK"] is False
    for args in ((64, False, False, False), (128, True, True, False), (64, True, False, True)):
        assert GB._schedule(*args, {})["WG_MASK"] is False
    assert GB._check_config(64, {})["OVERLAP_DQ"] is True  # d = 64's measured default
    with_wg = GB._check_config(64, dict(WG_MASK=True))
    assert with_wg["WG_MASK"] is True and with_wg["OVERLAP_DQ"] is False
    assert GB._schedule(128, True, True, False, dict(WG_MASK=True))["WG_MASK"] is True
    with pytest.raises(ValueError, match="WG_MASK is written for the step without OVERLAP_DQ"):
        GB._check_config(64, dict(WG_MASK=True, OVERLAP_DQ=True))
    with pytest.raises(ValueError, match="DV_EARLY is written for the step without OVERLAP_DQ"):
        GB._check_config(64, dict(DV_EARLY=True, OVERLAP_DQ=True))
    with pytest.raises(
        ValueError, match=r"WG_MASK='yes' not supported; accepted: \(False, True, 2\)"
    ):
        GB.gluon_attention_backward(**_args(), WG_MASK="yes")
    # session 25: WG_MASK = 2 (per-warpgroup runs) cuts MASKED_LAST's masked runs
    assert GB._check_config(128, dict(WG_MASK=2))["WG_MASK"] == 2
    with pytest.raises(ValueError, match="WG_MASK=2 cuts the masked runs of MASKED_LAST"):
        GB._check_config(128, dict(WG_MASK=2, MASKED_LAST=False))
    with pytest.raises(ValueError, match="WG_MASK is written for the step without OVERLAP_DQ"):
        GB._check_config(64, dict(WG_MASK=2, OVERLAP_DQ=True))


def test_bench_section_leaves_a_section_out_only_where_it_did_not_compile(tmp_path, monkeypatch):
    """experiments/gluon/bench_section.py with the GPU parts stood in for (session 22): a section
    that failed to compile at one head dim (BM = 128 at d = 128: too much shared memory) is left
    out of that head dim's rows only, a row whose baseline failed is recorded as such, and the
    checks compare dK, dV bit for bit and dQ within 4 ulps of the baseline's."""
    bs = _experiment("bench_section")
    g = torch.ones(3, 4)
    grads = {"0": (g, g, g), "BM=128": (g + 2**-12, g, g), "ZERO_ACC=1": (g, g + 1e-3, g)}
    failures = [dict(job="window,128,BM=128,float16", error="out of resources"),
                dict(job="window,64,0,float16", error="failed")]  # fmt: skip
    monkeypatch.setattr(bs, "prewarm", lambda args: failures)
    monkeypatch.setattr(bs, "make_call", lambda row, s: lambda: grads[s])
    monkeypatch.setattr(
        bs, "interleaved", lambda calls, names, rounds: dict(speedup={s: 1.0 for s in names})
    )
    monkeypatch.setattr(bs, "new_record", lambda script, argv: dict(command="x", rows=[]))
    bs.main(["--out", str(tmp_path), "--tag", "t", "--masks", "window", "--dims", "64", "128",
             "--ns", "4096", "--sections", "0", "BM=128", "ZERO_ACC=1", "--rounds", "1"])  # fmt: skip
    rows = {r["d"]: r for r in json.loads((tmp_path / "t.json").read_text())["rows"]}
    assert rows[64]["status"] == "the baseline did not compile"
    assert rows[128]["left_out"] == ["BM=128"] and set(rows[128]["checks"]) == {"ZERO_ACC=1"}
    assert rows[128]["checks"]["ZERO_ACC=1"]["dk_dv_bitwise"] is False  # dK moved: not ok
    assert rows[128]["checks"]["ZERO_ACC=1"]["ok"] is False


def _experiment(name):
    """experiments/gluon/<name>.py as a module (the experiments are not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "experiments" / "gluon" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_main", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cta_cost_fits_the_committed_rows_as_it_says():
    """experiments/gluon/cta_cost.py (session 27): its least-squares line is exact on points of a
    line and not fooled by their order, and the committed record's fits are that line through
    its own rows (one variant's time a wave against steps a CTA); the default's per-CTA part
    came out between 3 and 5 us there, as notes/gluon_backward.md and the Below Triton chapter
    say (the chapter fits the same rows with statistics.linear_regression)."""
    cc = _experiment("cta_cost")
    assert cc.fit([(16, 7.0 + 2.5 * 16), (64, 7.0 + 2.5 * 64), (32, 7.0 + 2.5 * 32)]) == (
        pytest.approx(7.0),
        pytest.approx(2.5),
    )
    assert cc._config("0") == {} and cc._config("PERSIST=1+STAGES=3") == dict(PERSIST=1, STAGES=3)
    from course_kernels.datafiles import data_path

    rec = json.loads(data_path("gluon/h100_cta_cost_session27.json").read_text())
    assert rec["gpu"].startswith("NVIDIA H100") and len(rec["fits"]) == 2
    for f in rec["fits"]:
        rows = [r for r in rec["rows"] if (r["d"], r["variant"]) == (f["d"], f["variant"])]
        assert len(rows) == 4 and all(r["waves"] == r["n"] // 128 for r in rows)
        F, step = cc.fit([(r["steps_a_cta"], r["us_a_wave"]) for r in rows])
        assert (f["F_us"], f["step_us"]) == (round(F, 3), round(step, 4))
    (default,) = [f for f in rec["fits"] if f["variant"] == "0"]
    assert 3 < default["F_us"] < 5


def test_host_docs_needs_a_gpu_and_says_so(monkeypatch, capsys):
    """experiments/gluon/host_docs.py (session 27) times CUDA calls: without a GPU it stops with
    its reason, not a traceback."""
    hd = _experiment("host_docs")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as err:
        hd.main(["--out", "unused"])
    assert err.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err


def test_profile_backward_profiles_each_row_once_a_variant(monkeypatch, tmp_path):
    """experiments/gluon/profile_backward.py (session 30): --rows and --variants give one record
    row per (row, variant), in that order, each naming its variant; a malformed row is refused
    with the accepted form (the profiling itself, torch.profiler on a GPU, is stood in for)."""
    pb = _experiment("profile_backward")
    calls = []

    def fake(row, n_calls, variant="0"):
        calls.append((row["mask"], row["d"], row["n"], variant, n_calls))
        return dict(row, wall_us=1.0, kernels_us={}, kernels_total_us=0.0, share={})

    monkeypatch.setattr(pb, "profile_row", fake)
    pb.main(["--out", str(tmp_path), "--tag", "t", "--calls", "3", "--rows", "window:128:4096",
             "documents:64:16384", "--variants", "0", "DQ_CONVERT=1"])  # fmt: skip
    assert calls == [
        ("window", 128, 4096, "0", 3), ("window", 128, 4096, "DQ_CONVERT=1", 3),
        ("documents", 64, 16384, "0", 3), ("documents", 64, 16384, "DQ_CONVERT=1", 3),
    ]  # fmt: skip
    rec = json.loads((tmp_path / "t.json").read_text())
    assert [r["variant"] for r in rec["rows"]] == ["0", "DQ_CONVERT=1"] * 2
    assert rec["rows"][0]["bytes_beside_main_MB"] == round(4 * 16 * 4096 * 128 * 14 / 1e6, 1)
    assert "--variants 0 DQ_CONVERT=1" in rec["command"]
    for bad in ("window:128", "win:128:4096"):
        with pytest.raises(SystemExit, match="MASK:D:N"):
            pb._row(bad)


def test_a_timing_record_names_the_warm_up_it_ran_under(monkeypatch):
    """bench_section.new_record (session 37): the command that regenerates a record carries
    $BENCH_WARMUP / $BENCH_REP in front when they were set (250/250 ms rounds and 10/60 ms ones
    differ by several per cent on the same kernels), and nothing when they were not."""
    bs = _experiment("bench_section")
    monkeypatch.delenv("BENCH_WARMUP", raising=False)
    monkeypatch.delenv("BENCH_REP", raising=False)
    cmd = bs.new_record("experiments/gluon/sweep_forward.py", ["--ns", "4096"])["command"]
    assert cmd == "python experiments/gluon/sweep_forward.py --ns 4096"
    monkeypatch.setenv("BENCH_WARMUP", "250")
    monkeypatch.setenv("BENCH_REP", "200")
    rec = bs.new_record("sweep_forward.py", ["--ns", "4096"])
    assert (
        rec["command"]
        == "BENCH_WARMUP=250 BENCH_REP=200 python experiments/gluon/sweep_forward.py --ns 4096"
    )
    assert rec["rows"] == [] and "torch" in rec
