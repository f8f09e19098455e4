"""Launching the Gluon forward: where it can run, its per-head-dim schedule, and the call.

:func:`gluon_available` is True only on a CUDA GPU of compute capability 9.x (Hopper) with the
Triton version the kernel is written for (:data:`GLUON_TRITON_VERSION`; Gluon's API changed
between Triton 3.5 and 3.6). Everywhere else :func:`gluon_attention_forward` raises a
RuntimeError saying why, and ``course_kernels.flash_attention`` keeps the ``tl`` kernel.
"""

from __future__ import annotations

import math

from ..numpy.reference import LOG2E
from ._lang import HAVE_GLUON, IMPORT_ERROR

if HAVE_GLUON:
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .forward import _attn_fwd_kernel

GLUON_TRITON_VERSION = "3.6"


def _triton_version_ok() -> bool:
    try:
        import triton as _t
    except Exception:
        return False
    v = _t.__version__
    return v == GLUON_TRITON_VERSION or v.startswith(GLUON_TRITON_VERSION + ".")


_AVAILABLE: dict = {}  # current CUDA device -> bool (asked once per device: 8.5 us per call)


def gluon_available() -> bool:
    """True only on a CUDA device of capability 9.x with Triton 3.6.x and Gluon importable."""
    if not HAVE_GLUON or not _triton_version_ok():
        return False
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        dev = torch.cuda.current_device()
        if dev not in _AVAILABLE:
            _AVAILABLE[dev] = torch.cuda.get_device_capability(dev)[0] == 9
        return _AVAILABLE[dev]
    except Exception:
        return False


def why_unavailable() -> str:
    if not HAVE_GLUON:
        return f"triton.experimental.gluon did not import ({IMPORT_ERROR!r})"
    if not _triton_version_ok():
        got = __import__("triton").__version__
        return f"Triton {got} installed; this kernel is written for Triton {GLUON_TRITON_VERSION}.x"
    return "needs a CUDA GPU of compute capability 9.x (Hopper: H100/H200)"


_SCHEDULE = dict(OVERLAP=True, persistent=False, LPT=False, DYNAMIC=True)
DEFAULT_CONFIG = {
    # head_dim: BN, NUM_CONSUMERS, STAGES, QSTAGES, OVERLAP
    # Chosen from the lever runs of 2026-12-01 (results/run1_levers.json, run2_full.json); these
    # exact configs passed 64/64 float64 checks in run2_full.json.  OVERLAP=False (the serial
    # consumer) is NOT verified: it failed the check at N=17 and an illegal memory access
    # followed on the H200 (open bug, notes/gluon.md), so it stays off in every default.
    # DYNAMIC (FA3's dynamic persistent scheduler) since session 7: 40/40 float64 checks and
    # faster than one CTA per tile in 15 of 16 rows of h200_session7_levers.json (notes/gluon.md).
    64: dict(_SCHEDULE, BN=128, NUM_CONSUMERS=3, STAGES=3, QSTAGES=2),
    128: dict(_SCHEDULE, BN=128, NUM_CONSUMERS=2, STAGES=2, QSTAGES=2),
    # d = 256 (session 19, CPU only; issue 23's "then 256"): FA3's two consumers of 64 rows, K/V
    # blocks of 64 keys, one Q stage, so Q (64 KiB) and the 2-stage K/V ring (128 KiB) fit: offline
    # sm_90a 196,932 B of shared memory, no spills (experiments/gluon/compile_sm90.py, 55-59).
    # Timed on an H100 in session 21 (data/gluon/h100_d256_session21.json, _tl.json: 1.67-1.83x
    # the tl forward, 0.89-1.07x cuDNN): `auto` takes it (triton/launch.GLUON_FORWARD_AUTO).
    256: dict(_SCHEDULE, BN=64, NUM_CONSUMERS=2, STAGES=2, QSTAGES=1),
}
# Added for causal calls (session 8, h200_session8_levers.json, 44/44 float64 checks): a consumer
# skips the K/V blocks wholly masked for its rows (SKIP_DEAD); at d = 64 the partial 192-row tile
# is its head's first (ALIGN_END): N = 4K causal d = 64 0.88 -> 0.98x cuDNN (fp16), 0.87 -> 0.96
# (bf16). Session 10 (h200_session9_forward.json, h200_session10_forward.json): at d = 128 FA3's
# longest-processing-time order within L2 sections of 8 MiB of K/V (LPT_SECTION_MB) and block 0
# masked by one compare a score (ROW_MASK), ahead in 6 of 8 pairs; slower at d = 64, where LPT
# also lost in session 24 (-15.8 to +2.8%, h100_fwd_lpt_session24_*). Session 29 (an H100, three
# processes a dtype, h100_fwd_defer_session29_*): at d = 64 each head's 6 lightest tiles last
# (DEFER), +1.8 to +4.2% at N = 4K in 6 of 6 pairs, mixed at 8K: so only where a head has at most
# DEFER_MAX_TILES tiles (N <= 4224 at d = 64). Session 37 (H100, pack_steady_*): PACK_P +3.1 to
# +8.3% at d = 64 causal in 18 of 18 pairs: the rule put it here (session 38: GPU suite 1565 passed
# with it, h100_suite_pack_p_session38.json). Neither is for windows or documents.
DEFER_MAX_TILES = 22
CAUSAL_CONFIG = {
    64: dict(SKIP_DEAD=True, ALIGN_END=True, DEFER=6, PACK_P=True),
    128: dict(SKIP_DEAD=True, LPT=True, LPT_SECTION_MB=8, ROW_MASK=True),
    256: dict(SKIP_DEAD=True, LPT=True, LPT_SECTION_MB=8, ROW_MASK=True),  # d = 128's (2 consumers)
}
# Added for causal sliding-window calls (session 11, experiments/data/gluon/h200_window_levers.json):
# at d = 64 K/V blocks of 64 keys, whose finer window edges cost less masked work: 0.36 / 0.76 /
# 1.56 ms at N = 4K / 8K / 16K against 0.51 / 1.03 / 2.05 with 128 (B = 4, H = 32, window 1024).
WINDOW_CONFIG = {64: dict(BN=64), 128: dict(), 256: dict()}
# Added for non-causal calls (session 12, course_kernels/data/gluon/h200_pingpong_full64.json):
# at d = 64 FA3's ping-pong turns (PINGPONG), faster than without in 18 of 18 rows (three
# processes x fp16/bf16 x N = 4K/8K/16K, +0.6 to +4.7%); slower at d = 128 and on causal rows
# (h200_pingpong_full.json, h200_pingpong_causal.json: one process, fp16).
NONCAUSAL_CONFIG = {64: dict(PINGPONG=True), 128: dict(), 256: dict()}
# Every schedule option gluon_attention_forward takes as a keyword (a typo is an error, not a no-op)
SCHEDULE_KEYS = frozenset(DEFAULT_CONFIG[64]) | {
    "CONSUMER_REGS", "SKIP_DEAD", "ALIGN_END", "LPT_SECTION_MB", "ROW_MASK", "O_STAGE", "PINGPONG",
    "DEFER", "PACK_P", "LAZY"}  # fmt: skip
_SWITCH_KEYS = ("SKIP_DEAD", "ALIGN_END", "ROW_MASK", "O_STAGE", "PINGPONG", "PACK_P", "LAZY")
# Registers per thread of each consumer warpgroup (``worker_num_regs`` of gl.warp_specialize,
# lowered to setmaxnreg), by the number of consumer warpgroups; the producer keeps the rest.
CONSUMER_REGS = {1: 240, 2: 240, 3: 160}
_NUM_SMS = {}
# (device, stream) -> int32[2]: the dynamic scheduler's tile counter and its count of retired
# CTAs. Zeroed once; the kernel's last CTA sets both back to 0 (course_kernels/gluon/
# scheduler.py), so launches in one stream, which run one after another, share it safely; two
# streams may run launches at once, so each stream has its own.
_SCHED: dict = {}
# (rows, d, gl dtype) -> NVMMASharedLayout: two fresh layout objects per call cost 17 us of host
# time on the H200 (experiments/gluon/host_cost.py, notes/gluon.md).
_LAYOUTS: dict = {}


def _sm_count(device) -> int:
    """SMs of a CUDA device, cached (the property query costs host time at every call)."""
    import torch

    dev = device.index if device.index is not None else torch.cuda.current_device()
    if dev not in _NUM_SMS:
        _NUM_SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return _NUM_SMS[dev]


def _smem_layout(rows: int, d: int, gdt):
    key = (rows, d, str(gdt))
    if key not in _LAYOUTS:
        _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for([rows, d], gdt)
    return _LAYOUTS[key]


def _check_inputs(q, k, v) -> None:
    """Shapes and dtypes the kernel supports; a ValueError that says what was given otherwise."""
    import torch

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(
                f"{name} must be a 4-D torch.Tensor (B, H, N, d), got {type(x).__name__}"
                + (f" of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else "")
            )
    B, H, N, d = q.shape
    Bk, H_kv, Nk, dk = k.shape
    if v.shape != k.shape or Bk != B or dk != d or Nk != N:
        raise ValueError(
            f"shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}: need same B, N, d"
        )
    if H % H_kv:
        raise ValueError(f"query heads {H} must be a multiple of K/V heads {H_kv}")
    if d not in DEFAULT_CONFIG:
        raise ValueError(f"head dim {d} not supported (64, 128 or 256)")
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"q, k, v must all be float16 or all bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}"
        )


def schedule_config(
    d: int, causal: bool, n: int = 2, window: bool = False, docs: bool = False, **overrides
) -> dict:
    """The schedule a call of sequence length n runs: DEFAULT_CONFIG[d], plus CAUSAL_CONFIG[d]
    for a causal call (NONCAUSAL_CONFIG[d] for a non-causal one) that keeps the default schedule
    (no overrides: the switches were measured and checked on top of it), else the caller's
    overrides. A causal sliding window (``window``) or packed documents (``docs``)
    leave ROW_MASK out: its one compare covers block 0 only, a window's first block is another;
    documents also leave ALIGN_END out (their tiles start at row 0). Not at n = 1: there Triton
    3.6 folds N = 1 and one query tile into constants and its LLVM lowering of the switches'
    arithmetic fails an assertion (reproduced offline, notes/gluon.md); a one-row call gains
    nothing from them anyway."""
    unknown = sorted(set(overrides) - SCHEDULE_KEYS)
    if unknown:
        raise ValueError(
            f"unknown schedule option(s) {unknown}; accepted: {', '.join(sorted(SCHEDULE_KEYS))}"
        )
    cfg = dict(DEFAULT_CONFIG[d])
    if overrides or n == 1:
        cfg.update(overrides)
    else:
        cfg.update(CAUSAL_CONFIG[d] if causal else NONCAUSAL_CONFIG[d])
        long = -(-n // (64 * cfg["NUM_CONSUMERS"])) > DEFER_MAX_TILES
        for key in ("DEFER", "PACK_P")[: 2 if window or docs else long]:  # (both, DEFER, none)
            cfg.pop(key, None)
    for switch, on in (("ROW_MASK", window or docs), ("ALIGN_END", docs)):
        if on and overrides.get(switch):
            what = "a sliding window (window_left) or " if switch == "ROW_MASK" else ""
            raise ValueError(f"{switch} cannot be combined with {what}documents (cu_seqlens)")
        if on:
            cfg.pop(switch, None)
    if window and not overrides:
        cfg.update(WINDOW_CONFIG[d])
    if cfg.get("PINGPONG") and not cfg["OVERLAP"]:
        raise ValueError("PINGPONG orders the overlapped steps' GEMMs: it needs OVERLAP=True")
    if n == 1 and (cfg.get("SKIP_DEAD") or cfg.get("ALIGN_END")):
        raise ValueError(
            "SKIP_DEAD / ALIGN_END at N = 1 do not compile with Triton 3.6 (an LLVM assertion); "
            "leave them off for a one-row sequence"
        )
    return cfg


def _check_window(window_left, causal: bool, n: int) -> int:
    """window_left (None: no window) -> the kernel's win_left, or -1 where every key before the
    diagonal is visible anyway (window_left >= n - 1: plain causal)."""
    if window_left is None:
        return -1
    if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < 0:
        raise ValueError(
            f"window_left must be None or an int >= 0 (keys before the diagonal each row sees), "
            f"got {window_left!r}"
        )
    if not causal:
        raise ValueError("window_left is the left side of a causal sliding window: causal=True")
    return -1 if window_left >= n - 1 else window_left


def lpt_section(n: int, d: int, g: int, bh: int, elem_bytes: int, mib: float) -> int:
    """Query heads per section of the sectioned LPT tile order (FA3's dynamic tile scheduler):
    the largest power of two of K/V heads whose K and V (2 x n x d elements each) fit in ``mib``
    MiB, at least one, times the g query heads that share each K/V head; at most bh (the number of
    batch x query heads: then one section holds them all)."""
    per_kv_head = 2 * n * d * elem_bytes
    kv = max(1, int(mib * 2**20) // per_kv_head)
    return min((1 << (kv.bit_length() - 1)) * g, bh)


def gluon_attention_forward(
    q, k, v, causal: bool = False, scale: float | None = None, window_left=None, cu_seqlens=None,
    **config,
):  # fmt: skip
    """Attention forward with the FA3 schedule.  q: (B, H, N, d); k, v: (B, H_kv, N, d) with H
    a multiple of H_kv (GQA); fp16 or bf16; d in {64, 128, 256}; causal is top-left aligned (as
    SDPA's is_causal); ``window_left`` (causal only): row i sees keys [i - window_left, i]
    (flash-attn's ``window_size=(window_left, 0)``; the producer loads only the blocks of a
    tile's window); ``cu_seqlens`` (causal only, B = 1): the offsets of causal documents packed
    into the one sequence, a row seeing the keys of its own document (DOCS). Returns (o, lse): o
    like q, lse the natural-log logsumexp of the scaled scores, float32 (B, H, N).
    Keyword overrides of the schedule (the lever experiments; each switch is explained in
    :mod:`.forward` and where its default is set above): BN, NUM_CONSUMERS (1-3), STAGES,
    QSTAGES, OVERLAP, persistent, LPT, CONSUMER_REGS, DYNAMIC, SKIP_DEAD, ALIGN_END, LPT_SECTION_MB
    (:func:`lpt_section`), ROW_MASK, O_STAGE, PINGPONG (needs OVERLAP), DEFER, PACK_P, LAZY."""
    _check_inputs(q, k, v)
    start = None
    if cu_seqlens is not None:  # checked on any machine, before the GPU is asked for
        start = _doc_bounds(cu_seqlens, causal, window_left, q, False, "start")
    _check_device(q, k, v, "gluon_attention_forward")
    qkv = (x.contiguous() for x in (q, k, v))
    return _forward(*qkv, causal, scale, window_left, start, config, packed=False)


def gluon_varlen_forward(q, k, v, cu_seqlens, scale=None, offsets_checked=False, **config):
    """The packed causal varlen forward: flash-attn's layout, q (total, H, d) and k, v (total,
    H_kv, d) with one cu_seqlens for queries and keys, read and written in place (PACKED); the
    causal documents of :func:`gluon_attention_forward` (``cu_seqlens``). Returns o (total, H, d)
    and lse (H, total), natural-log. ``offsets_checked``: the caller has read cu_seqlens's values
    already (flash_attention_varlen does): skip that device-to-host copy here."""
    import torch

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a packed (total, heads, d) tensor, got {got}")
    views = [x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)]  # (1, H, total, d)
    _check_inputs(*views)
    start = _doc_bounds(cu_seqlens, True, None, views[0], offsets_checked, "start")
    _check_device(q, k, v, "gluon_varlen_forward")
    qkv = (x.contiguous() for x in (q, k, v))
    return _forward(*qkv, True, scale, None, start, config, packed=True)


def _check_device(q, k, v, name: str) -> None:
    if not gluon_available():
        raise RuntimeError(f"{name} is unavailable here: " + why_unavailable())
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        raise ValueError(f"q, k, v must be CUDA tensors, got {q.device}, {k.device}, {v.device}")


def _doc_bounds(cu_seqlens, causal, window_left, q, values_checked=False, side="end"):
    """cu_seqlens of causal documents packed into one sequence (q: (1, H, N, d)) -> each token's
    document ``side``, int32 (N,): "start" (the forward's DOCS mask: query i sees key j iff
    start[i] <= j <= i) or "end", exclusive (the backward's: key j is seen by query i iff
    j <= i < end[j])."""
    import torch

    if not causal or window_left is not None:
        raise ValueError("cu_seqlens: packed causal documents (causal=True, no window_left)")
    n = q.shape[2]
    if q.shape[0] != 1:
        raise ValueError(
            f"cu_seqlens: the documents are packed into one sequence, B = 1; got B = {q.shape[0]}"
        )
    if not (
        isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2
        and cu_seqlens.dtype in (torch.int32, torch.int64) and cu_seqlens.device == q.device
    ):  # fmt: skip
        raise ValueError(
            "cu_seqlens must be a 1-D int32 or int64 tensor of at least 2 offsets on q's device "
            f"({q.device}), got {cu_seqlens!r:.80}"
        )
    cu = [0, n] if values_checked else cu_seqlens.tolist()  # (a device-to-host copy)
    if cu[0] != 0 or cu[-1] != n or any(cu[i + 1] < cu[i] for i in range(len(cu) - 1)):
        raise ValueError(
            f"cu_seqlens must rise from 0 to N = {n} (document offsets), got {cu[:4]}...{cu[-2:]}"
        )
    offsets = cu_seqlens.to(torch.int32)  # token t: document j, the first with offsets[j+1] > t
    tokens = torch.arange(n, device=q.device, dtype=torch.int32)
    doc = torch.searchsorted(offsets[1:], tokens, right=True)  # (empty documents skipped)
    return (offsets[:-1] if side == "start" else offsets[1:])[doc]


def _forward(q, k, v, causal, scale, window_left, start, config, packed):
    """Launch the kernel on checked contiguous CUDA inputs: (B, H, N, d), or (total, H, d) with
    ``packed`` (B = 1; lse then (H, total)); ``start``: each token's document start, or None."""
    import torch

    B, H, N, d = (1, q.shape[1], q.shape[0], q.shape[2]) if packed else q.shape
    H_kv = k.shape[-2] if packed else k.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    win_left = _check_window(window_left, causal, N)
    docs = start is not None
    cfg = schedule_config(d, causal, N, win_left >= 0, docs, **config)
    BM = 64
    BN, NC = cfg["BN"], cfg["NUM_CONSUMERS"]
    o = torch.empty_like(q)
    lse = torch.empty((H, N) if packed else (B, H, N), device=q.device, dtype=torch.float32)
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    BM_TILE = BM * NC
    q_layout, kv_layout = _smem_layout(BM, d, gdt), _smem_layout(BN, d, gdt)
    # packed: (total, H, d) as (total, H * d), one head a [rows, d] block of columns
    q2, k2, v2, o2 = (x.view(N, -1) if packed else x.view(-1, d) for x in (q, k, v, o))
    desc_q = TensorDescriptor.from_tensor(q2, [BM, d], q_layout)
    desc_k, desc_v = (TensorDescriptor.from_tensor(x, [BN, d], kv_layout) for x in (k2, v2))
    desc_o = TensorDescriptor.from_tensor(o2, [BM, d], q_layout)  # staged in Q's smem: same layout
    num_pid_m = triton.cdiv(N, BM_TILE)
    num_tiles = num_pid_m * B * H
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    dynamic = bool(cfg.get("DYNAMIC", False))
    sched_key = (dev, torch.cuda.current_stream(dev).cuda_stream)
    if sched_key not in _SCHED:
        _SCHED[sched_key] = torch.zeros(2, device=q.device, dtype=torch.int32)
    persistent = cfg["persistent"] or dynamic
    lpt = bool(cfg["LPT"] and causal)
    section = 0
    if lpt and cfg.get("LPT_SECTION_MB"):
        section = lpt_section(N, d, H // H_kv, B * H, q.element_size(), cfg["LPT_SECTION_MB"])
    defer = cfg.get("DEFER", 0) if causal and not lpt and 0 < cfg.get("DEFER", 0) < num_pid_m else 0
    grid = (min(num_tiles, _sm_count(q.device)) if persistent else num_tiles,)
    _attn_fwd_kernel[grid](
        desc_q,
        desc_k,
        desc_v,
        desc_o,
        o,
        lse,
        _SCHED[sched_key],
        N,
        H,
        H // H_kv,
        scale * LOG2E,
        num_pid_m,
        num_tiles,
        max(win_left, 0),
        start if docs else _SCHED[sched_key],  # doc_start (a stand-in without documents)
        BM=BM,
        BN=BN,
        HEAD_DIM=d,
        NUM_CONSUMERS=NC,
        STAGES=cfg["STAGES"],
        QSTAGES=cfg["QSTAGES"],
        CAUSAL=bool(causal),
        OVERLAP=bool(cfg["OVERLAP"]),
        CONSUMER_REGS=cfg.get("CONSUMER_REGS", CONSUMER_REGS[NC]),
        LPT=lpt,
        DYNAMIC=dynamic,
        SECTION=section,
        WINDOW=win_left >= 0,
        DOCS=docs,
        PACKED=packed,
        DEFER=defer,
        **{key: bool(cfg.get(key, False)) for key in _SWITCH_KEYS},
        num_warps=4,
    )
    return o, lse
