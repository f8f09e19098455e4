"""Exercise 07, a Flash Attention forward kernel in Triton: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

# The solutions use the typing names the notebook's setup cell imports (Optional, Tuple).
# ruff: noqa: UP006, UP035, UP045

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ...numpy.reference import attention_naive, attention_reference
from ..builders import bhnd_inputs, tf32_or, triton_variants
from . import nested_source
from ..feedback import Case, Fail, as_array, compare, unpack

NAME = "07_triton_forward"
TITLE = "A Flash Attention forward kernel in Triton"
TIMEOUT = 30.0
TRITON = True

INTRO = (
    "Now the tiled forward as a Triton kernel: one program per (query block, batch x head), the "
    "running `m_i`, `l_i`, `acc` in registers, a loop over key blocks. Without a GPU the kernel "
    "runs in Triton's interpreter (set up above), which is exact in fp32. On a GPU, `tl.dot` "
    'rounds fp32 inputs to TF32 unless you pass `input_precision="ieee"`: compare a TF32 kernel '
    "with an exact reference and it fails at ~1e-3. Masks: N need not be a multiple of the "
    "block; loads past N must be masked and their scores set to -inf. Use `tl.dot` for the "
    "products: torch's matmul/softmax/attention outside the kernel is not accepted."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
def define_solution() -> dict:
    """Define the solution (it needs torch and Triton, which grading never imports): {exercise:
    function}. The notebook's solution cell is this code from the kernel to the end of the
    wrapper (``solution_source``); the solution notebook runs it."""
    import torch
    import triton
    import triton.language as tl

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

    # fmt: off
    @triton.jit
    def _attn_fwd(Q, K, V, O, L, N, scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        pid_m = tl.program_id(0)  # which block of queries
        pid_bh = tl.program_id(1)  # which (batch, head)
        base = pid_bh * N * HEAD_DIM  # contiguous (B, H, N, d): one head is N * d elements
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=offs_m[:, None] < N, other=0.0)  # (BLOCK_M, d)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for start_n in range(0, N, BLOCK_N):
            cols = start_n + offs_n
            kv_mask = cols[:, None] < N
            k = tl.load(K + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N)
            s = tl.where(cols[None, :] < N, s, float("-inf"))  # keys past N do not exist
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=offs_m[:, None] < N)
        tl.store(L + pid_bh * N + offs_m, m_i + tl.log(l_i), mask=offs_m < N)


    def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Non-causal attention forward with your Triton kernel.

        Args:
            q, k, v: (batch, heads, N, d) float32 tensors (any device), d a power of two >= 16.
            scale: None means 1/sqrt(d).
        Returns:
            out: (batch, heads, N, d) float32;  lse: (batch, heads, N) natural-log logsumexp.
        """
        b, h, n, d = q.shape
        scale = d ** -0.5 if scale is None else scale
        q, k, v = (x.to(DEVICE, torch.float32).contiguous() for x in (q, k, v))
        out = torch.empty_like(q)
        lse = torch.empty((b, h, n), device=q.device, dtype=torch.float32)
        BLOCK = 16
        grid = (triton.cdiv(n, BLOCK), b * h)
        _attn_fwd[grid](q, k, v, out, lse, n, scale, HEAD_DIM=d, BLOCK_M=BLOCK, BLOCK_N=BLOCK)
        return out, lse
    # fmt: on

    return {"attention_triton": attention_triton}


def solution_source(name: str) -> str:
    return nested_source(define_solution, name)


# The stub keeps the kernel's signature: the student completes a skeleton.
STUB = '''@triton.jit
def _attn_fwd(Q, K, V, O, L, N, scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # YOUR CODE: one program per (query block, batch*head); online softmax over key blocks
    pass


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention forward with your Triton kernel.

    Args:
        q, k, v: (batch, heads, N, d) float32 tensors (any device), d a power of two >= 16.
        scale: None means 1/sqrt(d).
    Returns:
        out: (batch, heads, N, d) float32;  lse: (batch, heads, N) natural-log logsumexp.
    """
    # YOUR CODE: allocate out and lse, launch _attn_fwd[grid](...), return (out, lse)
    raise NotImplementedError'''

EXERCISES = [
    {"name": "attention_triton", "text": "Write `_attn_fwd` and its wrapper.", "stub": STUB}
]

VISIBLE = {
    "attention_triton": [
        {"name": "N a multiple of the block", "n": 32, "d": 16, "seed": 60, "points": 2},
        {"name": "uneven N (masked loads)", "n": 50, "d": 16, "seed": 61, "points": 2},
        {"name": "logsumexp", "check": "lse", "n": 40, "d": 32, "seed": 62, "points": 2},
    ]
}

HIDDEN = {
    "attention_triton": [
        {
            "name": "hidden: two batches, N=77",
            "batch": 2,
            "heads": 1,
            "n": 77,
            "d": 16,
            "seed": 151,
            "points": 2,
        }
    ]
}


# -- tests: builders and the mistakes they name ------------------------------------------------
def build_attention_triton(params) -> Case:
    q, k, v = bhnd_inputs(params)
    what = params.get("check", "out")

    def judge(out, outcome):
        if outcome is not None and getattr(outcome, "launches", 1) == 0:
            raise Fail("no Triton kernel was launched: the exercise is to write one (@triton.jit)")
        o, lse = unpack(out, 2, "(out, lse)")
        o = as_array(o, "out", q.shape)
        lse = as_array(lse, "lse", q.shape[:-1])
        ref, ref_lse = attention_reference(q, k, v)
        naive = attention_naive(q, k, v)
        try:
            msg = compare(
                o,
                ref,
                naive,
                "out",
                triton_variants(q, k, v, False),
                hint="check the masks on loads past N and the online-softmax update",
            )
        except Fail as e:
            raise tf32_or(e, o, ref) from None
        if what == "lse":
            compare(
                lse,
                ref_lse,
                None,
                "lse",
                budget=4e-6 * (1 + np.abs(ref_lse).max()),
                hint="save L = m_i + log(l_i) (natural log; if you work with exp2, convert)",
            )
            msg += "; lse right"
        return msg

    return Case(
        "attention_triton",
        params.get("name", what),
        float(params.get("points", 1)),
        "attention_triton",
        (q, k, v),
        {},
        judge,
        torch=True,
        timeout=params.get("timeout"),
    )


BUILDERS = {
    "attention_triton": build_attention_triton,
}
