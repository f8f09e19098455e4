"""Launching the Gluon backward (:mod:`.backward`): checks, its schedule per head dim, the call.

The backward ``flash_attention``'s ``auto`` runs on Hopper at d = 64 and 128 (``triton/launch.py``;
measured: notes/gluon_backward.md). Compiled offline by ``experiments/gluon/compile_bwd_sm90.py``.

Three launches: ``_bwd_preprocess`` (D = rowsum(dO * O), L log2 e; ZERO_ACC: zeroes dQ_acc),
``_attn_bwd_kernel`` (dK, dV; dQ added in fp32 by TMA reduce-adds or atomics), a dq epilogue.
Importing this module needs neither a GPU nor Gluon; a call raises a RuntimeError saying why where
the kernel cannot run, and a ValueError saying what is accepted (checked first, on any machine).
"""

from __future__ import annotations

import math

from ..numpy.reference import LOG2E
from ._lang import HAVE_GLUON
from .launch import _check_inputs, _check_window, _doc_bounds, _sm_count, _smem_layout
from .launch import gluon_available, why_unavailable

if HAVE_GLUON:
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .backward import _attn_bwd_kernel, _bwd_dq_epilogue, _bwd_dq_epilogue_rows
    from .backward import _bwd_preprocess

# head_dim -> schedule. BM: query rows a block; NUM_CONSUMERS: warpgroups of 64 keys (BN = 64 x
# NUM_CONSUMERS keys a CTA); STAGES: the (Q, dO, L, D) ring's depth; DQ_SPLIT: dQ added in column
# chunks. From the offline compile (notes/gluon_backward.md); d = 64 takes BM = 128 (BACKWARD_BM).
# 9: DQ_VEC = 4 (+0 to +5%, off), DQ_SHARED (dQ split by columns across the consumers: 1.19-1.26x
# on the H200, the default: course_kernels/data/gluon/h200_gluon_backward_session9_dq.json).
BACKWARD_CONFIG = {
    64: dict(BM=64, NUM_CONSUMERS=2, STAGES=2, DQ_SPLIT=1),
    128: dict(BM=64, NUM_CONSUMERS=2, STAGES=2, DQ_SPLIT=2),
}
BACKWARD_CONSUMER_REGS = {1: 240, 2: 240}  # setmaxnreg per consumer thread, by consumers
_ACCEPTED = {
    "BM": (64, 128),
    "NUM_CONSUMERS": (1, 2),
    "STAGES": (1, 2, 3, 4),
    "DQ_SPLIT": (1, 2, 4),
    "CONSUMER_REGS": (168, 184, 200, 216, 232, 240),
    "DQ_VEC": (2, 4),
    "DQ_SHARED": (False, True),
    "OVERLAP_DQ": (False, True),
    "DQ_TMA": (False, True),
    "MASKED_LAST": (False, True),
    "DV_EARLY": (False, True),
    "ROTATE": (False, True),
    "SECTION": (0, 2, 4, 8, 16, 32),
    "TAIL": (0, 2, 4, 8, 16, 32),
    "DQ_CONVERT": (False, True, 2),
    "PERSIST": (False, True),
    "ZERO_ACC": (False, True),
    "WG_MASK": (False, True, 2),
    "PDL": (False, True),
    "KEEP_ACC": (False, True),
}
# OVERLAP_DQ (session 9): block i's last dQ chunk left in flight while block i+1's S^T / dP^T
# wgmmas run (needs DQ_SHARED). Session 10 (data/gluon/h200_gluon_backward_session10.json, 8K,
# fp16): d = 64 0.833 -> 0.853x cuDNN (full), 0.869 -> 0.893 (causal); d = 128 0.730 -> 0.680,
# 0.742 -> 0.675: on at d = 64 only (BACKWARD_OVERLAP_DQ). ZERO_ACC (22: dQ_acc zeroed by the
# preprocessing kernel, one launch fewer): -5.3 to +3.0% under masks (23), off.
# WG_MASK (masked steps per consumer: 1 a step at a time, 24; 2 in runs, _wg_cuts, 25): off,
# slower on every window row (26). PDL (26: each kernel launched while the one before runs): lost
# in some (row, process) pairs (27), off. KEEP_ACC (31: dQ_acc kept zero between calls) with
# DQ_CONVERT = 2 (a query block converted by the CTA completing it): window d = 128 +1.8 to +4.4%,
# documents -1.6 to -2.2% (H100). 33 (h100_keep_*_session33_*): window d = 128 +1.3 to +3.7% in
# 18/18 rows of 3 processes, beside Flex 1.086-1.123x -> 1.110-1.167x: BACKWARD_WINDOW_KEEP.
# DQ_TMA (12): each dQ chunk leaves through an fp32 shared-memory tile and one TMA bulk reduce-add
# (FA3's dQ path) instead of fp32 atomics; needs DQ_SHARED and chunks of 16 or 32 columns (one
# 128-byte swizzle row). data/gluon/h200_gluon_backward_session12_dqtma.json (8K, fp16): d = 64
# +4.8 / +5.2% (full / causal), d = 128 +11.2 / +16.8%: on wherever it applies (_check_config);
# with OVERLAP_DQ at d = 128 it lost 11-16%, so d = 128 keeps OVERLAP_DQ off.
BACKWARD_DQ_DEFAULTS = dict(
    DQ_VEC=2, DQ_SHARED=True, OVERLAP_DQ=False, MASKED_LAST=True, DV_EARLY=False, ROTATE=False,
    DQ_CONVERT=False, PERSIST=False, ZERO_ACC=False, WG_MASK=False, PDL=False, KEEP_ACC=False,
)  # fmt: skip
# DQ_CONVERT (18): dq converted in the main kernel by each head's last CTA (scheduler.
# _dq_convert_last), not by a kernel of its own; no gain on masked rows (21); without a mask
# (22, data/gluon/h100_persist_session22_run{1,2,3}.json) d = 128 +1.9 to +7.1% in 9/9, d = 64
# -1.9 to +2.3%: on for non-causal d = 128. PERSIST (21, producer._bwd_producer): one CTA an SM
# looping over tiles; 22: -2.4 to +2.6% without a mask, -3 to -33% causal (static order): off.
BACKWARD_DQ_CONVERT = {64: False, 128: True}  # non-causal calls, unless the call passes its own
# BM = 128 at d = 64: dense +7 to +15% in 36/36 rows (22, h100_bwd_bm128_session22_*), window and
# documents +0.8 to +5.9% in 24/24 (23, h100_bwd_bm128_masked_session23_*; their GPU tests passed
# in 24). Causal on top: STAGES = 3 +1.9 to +5.6% in 18/18 (24, h100_bwd_stages_session24_*).
BACKWARD_BM, BACKWARD_CAUSAL_STAGES = {64: 128}, {64: 3}
# MASKED_LAST (13): unmasked query blocks first, masked ones (causal diagonal, key tail) after, so
# ptxas spills in the short masked loop (h200_gluon_backward_session13*, N = 4K-16K): d = 128 +9.3
# to +16.2%, d = 64 +0.9 to +3.1%; the default. DV_EARLY (13, FA3's order: dV += P^T dO before the
# wait for dP^T): -5.5 to +3.0%, off. ROTATE (13: each CTA's unmasked run starts at its own keys'
# query block; data/gluon/h200_gluon_backward_session14_rotate.json): -3.6 to +3.0%, off.
# SECTION (17): CTAs in the forward's sectioned order (scheduler._bwd_tile): heads innermost in
# sections of SECTION heads, each head's key block 0 (causal's heaviest) first. H100 (data/gluon/
# h100_bwd_order_session17_docs.json): packed documents +2-4% (d = 128), +1-1.5% (d = 64) with
# SECTION = 8; plain causal -1 to +2.5% (-11.5% with 16 heads at 16K): dense calls keep the plain
# grid; TAIL no better, off. 24: documents d = 128 SECTION = 4, +1.2 to +2.3% in 6/6.
BACKWARD_SECTION = {"dense": {64: 0, 128: 0}, "documents": {64: 8, 128: 4}}  # kind -> d -> heads
BACKWARD_TAIL = {"dense": 0, "documents": 0}
BACKWARD_OVERLAP_DQ = {64: True, 128: False}
BACKWARD_WINDOW_KEEP = {64: False, 128: True}  # window calls: DQ_CONVERT = 2 with KEEP_ACC (33)
_ROW_LAYOUTS, _KEPT = {}, {}  # BM -> L's and D's 1-D NVMMA layout; KEEP_ACC's (_kept_zeros)
SMEM_LIMIT = 227 * 1024 - 1024  # sm_90's opt-in maximum a CTA, less the barriers' margin


def _check_backward_inputs(do, q, k, v, o, lse) -> None:
    """A ValueError saying what is accepted, for anything the first version does not support."""
    import torch

    _check_inputs(q, k, v)  # 4-D, same B/N/d, the forward's head dims, fp16 or bf16
    if q.shape[-1] not in BACKWARD_CONFIG:  # (the forward also takes d = 256)
        raise ValueError(f"head dim {q.shape[-1]} not supported by the Gluon backward (64 or 128)")
    for name, x in (("do", do), ("o", o)):
        if not isinstance(x, torch.Tensor) or x.shape != q.shape or x.dtype != q.dtype:
            got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x)
            want = f"a tensor of q's shape {tuple(q.shape)} and dtype {q.dtype}"
            raise ValueError(f"{name} must be {want}, got {got}")
    B, H, N, _ = q.shape
    if not isinstance(lse, torch.Tensor) or lse.shape != (B, H, N) or lse.dtype != torch.float32:
        got = f"{tuple(lse.shape)} {lse.dtype}" if isinstance(lse, torch.Tensor) else type(lse)
        raise ValueError(
            f"lse must be the forward's natural-log logsumexp, float32 of shape {(B, H, N)} "
            f"(what gluon_attention_forward returns), got {got}"
        )
    if N == 0:
        raise ValueError("sequence length 0: nothing to differentiate (need N >= 1)")


def _check_config(d: int, config: dict) -> dict:
    cfg = dict(BACKWARD_CONFIG[d])
    for key, val in config.items():
        if key not in _ACCEPTED:
            raise ValueError(f"unknown backward option {key!r}; accepted: {sorted(_ACCEPTED)}")
        if val not in _ACCEPTED[key]:
            raise ValueError(f"{key}={val!r} not supported; accepted: {_ACCEPTED[key]}")
        cfg[key] = val
    cfg.setdefault("CONSUMER_REGS", BACKWARD_CONSUMER_REGS[cfg["NUM_CONSUMERS"]])
    for key, val in BACKWARD_DQ_DEFAULTS.items():
        cfg.setdefault(key, val)
    early = cfg["DV_EARLY"] or cfg["WG_MASK"]  # steps written without OVERLAP_DQ
    if "OVERLAP_DQ" not in config:  # the measured default, where its DQ_SHARED holds
        cfg["OVERLAP_DQ"] = BACKWARD_OVERLAP_DQ[d] and bool(cfg["DQ_SHARED"]) and not early
    if cfg["DQ_SHARED"] and cfg["NUM_CONSUMERS"] < 2:
        raise ValueError("DQ_SHARED splits dQ across consumers: it needs NUM_CONSUMERS=2")
    if (cfg["ROTATE"] or cfg["WG_MASK"] == 2) and not cfg["MASKED_LAST"]:
        what = ("WG_MASK=2 cuts the masked runs", "ROTATE turns the unmasked run")[cfg["ROTATE"]]
        raise ValueError(what + " of MASKED_LAST: it needs MASKED_LAST=True")
    if early and cfg["OVERLAP_DQ"]:
        lever = "DV_EARLY" if cfg["DV_EARLY"] else "WG_MASK"
        raise ValueError(lever + " is written for the step without OVERLAP_DQ: OVERLAP_DQ=False")
    if cfg["OVERLAP_DQ"] and not cfg["DQ_SHARED"]:
        raise ValueError("OVERLAP_DQ is implemented with DQ_SHARED only: it needs DQ_SHARED=True")
    cols = d // cfg["DQ_SPLIT"] // (cfg["NUM_CONSUMERS"] if cfg["DQ_SHARED"] else 1)
    if "DQ_TMA" not in config:  # the measured default, where it applies
        fits = shared_bytes(d, dict(cfg, DQ_TMA=True)) <= SMEM_LIMIT
        cfg["DQ_TMA"] = bool(cfg["DQ_SHARED"]) and cols in (16, 32) and fits
    if cols < 16:
        raise ValueError(
            f"dQ chunks of {cols} columns (d={d}, DQ_SPLIT={cfg['DQ_SPLIT']}, DQ_SHARED="
            f"{cfg['DQ_SHARED']}): need at least 16; lower DQ_SPLIT"
        )
    need = shared_bytes(d, cfg)
    if need > SMEM_LIMIT:
        raise ValueError(
            f"this schedule needs about {need} bytes of shared memory a CTA, over Hopper's "
            f"{SMEM_LIMIT}: lower BM or STAGES (d={d}, {cfg})"
        )
    if cfg["DQ_CONVERT"] and not cfg["DQ_TMA"]:
        raise ValueError("DQ_CONVERT converts DQ_TMA's padded dQ_acc: it needs DQ_TMA=True")
    if cfg["DQ_TMA"] and not (cfg["DQ_SHARED"] and cols in (16, 32)):
        got = f"DQ_SHARED={cfg['DQ_SHARED']}, {cols} columns (d={d}, DQ_SPLIT={cfg['DQ_SPLIT']})"
        raise ValueError(
            "DQ_TMA needs DQ_SHARED=True and dQ chunks of 16 or 32 columns (one 128-byte TMA "
            "swizzle row), got " + got
        )
    return cfg


def shared_bytes(d: int, cfg: dict) -> int:
    """Shared memory of one backward CTA in bytes (``_attn_bwd_kernel``'s (Q, dO, L, D) ring, each
    consumer's K and V, dS^T tiles, DQ_TMA's fp32 tiles; sm_90a adds ~100s of bytes of barriers)."""
    BM, NC, split = cfg["BM"], cfg["NUM_CONSUMERS"], cfg["DQ_SPLIT"]
    ring = cfg["STAGES"] * (2 * BM * d * 2 + 2 * BM * 4)
    tiles = NC * BM * (d // NC // split) * split * 4 if cfg.get("DQ_TMA") else 0
    return ring + NC * 2 * 64 * d * 2 + NC * 64 * BM * 2 + tiles


def _sum_over_groups(x, h_kv: int):
    """GQA: per-query-head dK or dV, (B, H, N, d) or packed (total, H, d), -> per K/V head, the
    sum over each head's H // h_kv consecutive query heads (SDPA's ``enable_gqa`` grouping, the
    kernel's hz // GROUP), in fp32 and rounded once, as flash-attn 2 does (torch's fp16/bf16 sums
    accumulate in fp32, one pass; no fp32 copy written and read)."""
    return x.unflatten(1, (h_kv, -1)).sum(2)


def _row_layout(BM: int):
    return _ROW_LAYOUTS.setdefault(BM, gl.NVMMASharedLayout.get_default_for([BM], gl.float32))


def gluon_attention_backward(
    do, q, k, v, o, lse, causal: bool = False, scale=None, window_left=None, cu_seqlens=None,
    **config,
):  # fmt: skip
    """Gradients (dq, dk, dv) of attention with the FA3-style Gluon backward (first version).

    q, o, do: (B, H, N, d), k, v: (B, H_kv, N, d) with H_kv dividing H (GQA, session 19: dK, dV
    per query head, summed on the host), fp16 or bf16, d in {64, 128}; lse: the forward's
    natural-log logsumexp, float32 (B, H, N), as :func:`.launch.gluon_attention_forward`
    returns it; causal is top-left aligned (SDPA's ``is_causal``); scale defaults to 1/sqrt(d);
    window_left (with causal): row i sees keys [i - window_left, i], as in
    :func:`.launch.gluon_attention_forward`; cu_seqlens (with causal, B = 1): documents packed
    into one sequence, [0, n_1, n_1 + n_2, ..., N] as flash-attn's varlen calls take it, each
    query seeing only the keys of its own document (both session 14).
    Keyword overrides of the schedule (for experiments): the keys of ``_ACCEPTED`` (see
    BACKWARD_CONFIG and _schedule; KEEP_ACC's buffer: :func:`release_kept_buffers`). dq is summed
    in fp32 (TMA reduce-adds or atomics) in whatever order the CTAs finish: not bit-reproducible."""
    tensors = (do, q, k, v, o, lse)
    win, kend, cfg = _check_all(tensors, causal, window_left, cu_seqlens, config)
    contiguous = (x.contiguous() for x in tensors)
    return _backward(*contiguous, causal, scale, win, kend, cu_seqlens is not None, cfg, False)


def _check_all(tensors, causal, window_left, cu_seqlens, config, offsets_checked=False):
    """Every check of :func:`gluon_attention_backward` on (do, q, k, v, o, lse) in its
    (B, H, N, d) shapes: (win_left, the documents' kend or a stand-in, the schedule)."""
    do, q, k, v, o, lse = tensors
    _check_backward_inputs(do, q, k, v, o, lse)
    win = _check_window(window_left, causal, q.shape[2])
    docs = cu_seqlens is not None
    kend = _doc_bounds(cu_seqlens, causal, window_left, q, offsets_checked, "end") if docs else lse
    cfg = _schedule(q.shape[-1], causal, win >= 0, docs, config)  # a window past N: plain causal
    if not gluon_available():
        raise RuntimeError("gluon_attention_backward is unavailable here: " + why_unavailable())
    if not all(x.is_cuda and x.device == q.device for x in tensors):
        got = ", ".join(str(x.device) for x in tensors)
        raise ValueError("do, q, k, v, o, lse must all be CUDA tensors on one device, got " + got)
    return win, kend, cfg


def _schedule(d, causal, windowed, docs, config):
    """The schedule a call runs: BACKWARD_CONFIG[d], the call's overrides (``config``), and the
    measured defaults by kind of call (BM, SECTION / TAIL, DQ_CONVERT); ValueError for a clash."""
    if "BM" not in config:  # sessions 22-24
        config = dict(config, BM=BACKWARD_BM.get(d, BACKWARD_CONFIG[d]["BM"]))
    if causal and not (docs or windowed or "STAGES" in config) and config.get("BM") == 128:
        config = dict(config, STAGES=BACKWARD_CAUSAL_STAGES.get(d, BACKWARD_CONFIG[d]["STAGES"]))
    cfg = _check_config(d, config)
    kind = "documents" if docs else "dense"
    if "SECTION" not in config and "TAIL" not in config and not cfg["PERSIST"]:
        cfg.update(SECTION=BACKWARD_SECTION[kind][d], TAIL=BACKWARD_TAIL[kind])
    cfg.setdefault("SECTION", 0)
    cfg.setdefault("TAIL", 0)
    if "DQ_CONVERT" not in config and not cfg["PERSIST"] and not causal:  # session 22
        cfg["DQ_CONVERT"] = cfg["DQ_CONVERT"] or (BACKWARD_DQ_CONVERT[d] and cfg["DQ_TMA"])
    own = {"DQ_CONVERT", "KEEP_ACC"} & set(config) or cfg["PERSIST"] or cfg["ZERO_ACC"]
    if windowed and not docs and BACKWARD_WINDOW_KEEP.get(d) and not own:
        cfg.update(DQ_CONVERT=2, KEEP_ACC=True)  # the buffer: release_kept_buffers
    if (cfg["SECTION"] and cfg["TAIL"]) or (cfg["PERSIST"] and (cfg["SECTION"] or cfg["TAIL"])):
        raise ValueError("SECTION, TAIL and PERSIST are three CTA orders: pass one of them at most")
    if cfg["PERSIST"] and cfg["DQ_CONVERT"]:  # DQ_CONVERT's count is one a tile and CTA
        raise ValueError("DQ_CONVERT needs a CTA per tile: not with PERSIST (tiles share CTAs)")
    if cfg["DQ_CONVERT"] == 2 and cfg["ZERO_ACC"]:  # (DQ_CONVERT=True is 1, not 2)
        raise ValueError("DQ_CONVERT=2's counters are set by the preprocessing: not with ZERO_ACC")
    if cfg["KEEP_ACC"] and (cfg["ZERO_ACC"] or not cfg["DQ_CONVERT"]):
        why = "KEEP_ACC's dQ_acc is cleared by DQ_CONVERT's converting CTAs: it needs DQ_CONVERT, "
        got = f"got DQ_CONVERT={cfg['DQ_CONVERT']}, ZERO_ACC={cfg['ZERO_ACC']}"
        raise ValueError(why + "ZERO_ACC=False; " + got)
    return cfg


def release_kept_buffers() -> int:
    """Free KEEP_ACC's dQ_acc buffers (one a device, stream and dtype: the largest such call's
    B x H x N x d float32) and return their bytes; the next KEEP_ACC call makes a new one."""
    freed = sum(b.numel() * b.element_size() for b in _KEPT.values())
    _KEPT.clear()
    return freed


def _kept_zeros(n: int, device, dtype):
    """KEEP_ACC's dQ_acc (DQ_CONVERT = 1: and counters): ``n`` zeros kept from call to call (each
    leaves them zero), one a (device, stream, dtype), fresh in graph capture. Only what main
    kernels alone write is kept: they run in stream order however host threads interleave."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, device=device, dtype=dtype)
    key = (str(device), torch.cuda.current_stream(device).cuda_stream, dtype)
    buf = _KEPT.get(key)
    if buf is None or buf.numel() < n:
        buf = _KEPT[key] = torch.zeros(n, device=device, dtype=dtype)
    return buf[:n]


def _backward(do, q, k, v, o, lse, causal, scale, win, kend, docs, cfg, packed):
    """The launches, on contiguous checked tensors: (B, H, N, d), or with ``packed`` flash-attn's
    (total, H, d) in place, lse (H, total) (B = 1; TMA boxes [rows, d] at column h x d)."""
    import torch

    if packed:
        (N, H, d), B = q.shape, 1
    else:
        B, H, N, d = q.shape
    H_kv = k.shape[1]  # (B, H_kv, N, d) or packed (total, H_kv, d); GQA: H_kv divides H
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    BM, NC = cfg["BM"], cfg["NUM_CONSUMERS"]
    BN = 64 * NC
    n_pad = triton.cdiv(N, BM) * BM  # L and D padded per head to whole query blocks
    delta, lse2 = (torch.empty(B * H * n_pad, device=q.device, dtype=torch.float32) for _ in "DL")
    dq_tma = bool(cfg["DQ_TMA"])  # dQ_acc then padded to n_pad rows a head, like L and D
    rows = n_pad if dq_tma else N
    # dQ_acc, then DQ_CONVERT's int32 counters (one a head; 2: a query block, set by _visits)
    n_acc, new = B * H * rows * d, torch.empty if cfg["ZERO_ACC"] else torch.zeros
    count_bm = BM if cfg["DQ_CONVERT"] == 2 else 0
    blocks = n_pad // BM if count_bm else 1
    new = _kept_zeros if cfg["KEEP_ACC"] else new  # KEEP_ACC: zero since the last call
    flat, pdl = new(n_acc + B * H * blocks, device=q.device, dtype=torch.float32), bool(cfg["PDL"])
    counters = flat[n_acc:].view(torch.int32)
    if count_bm and cfg["KEEP_ACC"]:  # set by this call's preprocessing: never a kept buffer's
        counters = torch.empty(B * H * blocks, device=q.device, dtype=torch.int32)
    _bwd_preprocess[(triton.cdiv(n_pad, 64), B * H)](
        o, do, lse, delta, lse2, N, n_pad, flat, counters, rows, win, kend, HEAD_DIM=d,
        PACKED=packed, ZERO_ACC=bool(cfg["ZERO_ACC"]), PDL=pdl, COUNT_BM=count_bm,
        BN=BN, CAUSAL=bool(causal), WINDOW=win >= 0, DOCS=docs, num_warps=8,
    )  # fmt: skip
    dq_acc = flat[:n_acc].view(B, H, rows, d)
    dq = torch.empty_like(q)
    # GQA: dK, dV per query head (each reads its K/V head, GROUP = H // H_kv), summed below
    dk, dv = (torch.empty_like(q if H_kv < H else x) for x in (k, v))
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    q_layout, kv_layout = _smem_layout(BM, d, gdt), _smem_layout(64, d, gdt)
    cols = H * d if packed else d  # the rows of the 2-D views TMA reads
    desc_q = TensorDescriptor.from_tensor(q.view(-1, cols), [BM, d], q_layout)
    desc_do = TensorDescriptor.from_tensor(do.view(-1, cols), [BM, d], q_layout)
    kv_cols = H_kv * d if packed else d
    desc_k = TensorDescriptor.from_tensor(k.view(-1, kv_cols), [64, d], kv_layout)
    desc_v = TensorDescriptor.from_tensor(v.view(-1, kv_cols), [64, d], kv_layout)
    desc_lse = TensorDescriptor.from_tensor(lse2, [BM], _row_layout(BM))
    desc_d = TensorDescriptor.from_tensor(delta, [BM], _row_layout(BM))
    dq_out = dq_acc
    if dq_tma:
        chunk = d // NC // cfg["DQ_SPLIT"]
        lay = gl.NVMMASharedLayout.get_default_for([BM, chunk], gl.float32)
        dq_out = TensorDescriptor.from_tensor(dq_acc.view(-1, d), [BM, chunk], lay)
    n_kb, section, tail, heads = triton.cdiv(N, BN), cfg["SECTION"], cfg["TAIL"], B * H
    grid = (n_kb * heads,) if section or tail else (n_kb, heads)
    if cfg["PERSIST"]:  # one CTA an SM at most, each taking tiles pid, pid + grid, ...
        grid = (min(n_kb * heads, _sm_count(q.device)),)
    _attn_bwd_kernel[grid](
        desc_q, desc_k, desc_v, desc_do, desc_lse, desc_d, dq_out, dk, dv, N, n_pad,
        scale * LOG2E, scale, win, kend,  # c = scale log2(e): P = exp2(S c - L log2 e)
        dq_acc, dq, counters, heads,
        BM=BM, HEAD_DIM=d, NUM_CONSUMERS=NC, STAGES=cfg["STAGES"], CAUSAL=bool(causal),
        CONSUMER_REGS=cfg["CONSUMER_REGS"], DQ_SPLIT=cfg["DQ_SPLIT"], DQ_VEC=cfg["DQ_VEC"],
        DQ_SHARED=bool(cfg["DQ_SHARED"]), OVERLAP_DQ=bool(cfg["OVERLAP_DQ"]), DQ_TMA=dq_tma,
        MASKED_LAST=bool(cfg["MASKED_LAST"]), DV_EARLY=bool(cfg["DV_EARLY"]),
        ROTATE=bool(cfg["ROTATE"]), WINDOW=win >= 0, DOCS=docs, PACKED=packed,
        WG_MASK=cfg["WG_MASK"],
        SECTION=section, TAIL=tail, DQ_CONVERT=int(cfg["DQ_CONVERT"]), GROUP=H // H_kv,
        PERSIST=bool(cfg["PERSIST"]), PDL=pdl, KEEP_ACC=bool(cfg["KEEP_ACC"]), launch_pdl=pdl,
        num_warps=4,
    )  # fmt: skip
    if H_kv < H:
        dk, dv = _sum_over_groups(dk, H_kv), _sum_over_groups(dv, H_kv)
    if cfg["DQ_CONVERT"]:  # dq converted by the main kernel
        return dq, dk, dv
    if dq_tma or packed:  # dQ_acc's rows a head: n_pad (DQ_TMA) or N
        grid = (triton.cdiv(N, 64), B * H)
        _bwd_dq_epilogue_rows[grid](
            dq_acc, dq, N, rows, scale, HEAD_DIM=d, PACKED=packed, PDL=pdl, launch_pdl=pdl,
            num_warps=8,
        )  # fmt: skip
    else:
        n = dq.numel()
        _bwd_dq_epilogue[(triton.cdiv(n, 512),)](
            dq_acc, dq, n, scale, PDL=pdl, launch_pdl=pdl, num_warps=4
        )  # fmt: skip
    return dq, dk, dv


def gluon_varlen_backward(
    do, q, k, v, o, lse, cu_seqlens, scale, packed=True, offsets_checked=False, **config
):
    """The packed causal varlen backward: flash-attn's layout, q, k, v, o, do (total, H, d), one
    cu_seqlens for queries and keys, lse (H, total) natural-log: :func:`gluon_attention_backward`'s
    causal documents. ``packed``: the tensors read and written in place (PACKED), else copied to
    (1, H, total, d) and back. The same checks and messages; ``offsets_checked``: the caller has
    read cu_seqlens's values (flash_attention_varlen's forward does): no device-to-host copy."""
    views = [x.transpose(0, 1).unsqueeze(0) for x in (do, q, k, v, o)]
    if not packed:
        grads = gluon_attention_backward(
            *views, lse.unsqueeze(0), True, scale, cu_seqlens=cu_seqlens, **config
        )  # fmt: skip
        return tuple(g[0].transpose(0, 1).contiguous() for g in grads)
    tensors = (*views, lse.unsqueeze(0))
    win, kend, cfg = _check_all(tensors, True, None, cu_seqlens, config, offsets_checked)
    flat = (x.contiguous() for x in (do, q, k, v, o, lse))
    return _backward(*flat, True, scale, win, kend, True, cfg, True)
