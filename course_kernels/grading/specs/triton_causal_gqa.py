"""Exercise 08, kernel features: causal masking and GQA: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

from __future__ import annotations


from ...numpy.reference import attention_naive, attention_reference
from ..builders import bhnd_inputs, gqa_expand, tf32_or, triton_variants
from . import nested_source
from ..feedback import Case, Fail, as_array, compare

NAME = "08_triton_causal_gqa"
TITLE = "Kernel features: causal masking and GQA"
TIMEOUT = 30.0
TRITON = True

INTRO = (
    "Two features of real kernels. **Causal**: query i sees keys j <= i; key blocks entirely "
    "above the diagonal are skipped, the diagonal block is masked with `offs_m[:, None] >= "
    "offs_n[None, :]`. **GQA** (grouped-query attention): H query heads share H_kv < H key/value "
    "heads (`kv_heads` in Python, `KV_HEADS` in the kernel); query head h reads kv head "
    "h // (H / H_kv). The kernel never copies K and V per query head."
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
    def _attn_fwd_gqa(Q, K, V, O, N, scale, H_Q, KV_HEADS,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H_Q
        h = pid_bh % H_Q
        kvh = h // (H_Q // KV_HEADS)  # consecutive query heads share one kv head
        q_base = pid_bh * N * HEAD_DIM
        kv_base = (b * KV_HEADS + kvh) * N * HEAD_DIM
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=offs_m[:, None] < N, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        end = N
        if CAUSAL:
            end = tl.minimum(N, (pid_m + 1) * BLOCK_M)  # later key blocks are fully masked
        for start_n in range(0, end, BLOCK_N):
            cols = start_n + offs_n
            kv_mask = cols[:, None] < N
            k = tl.load(K + kv_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask,
                        other=0.0)
            v = tl.load(V + kv_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask,
                        other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            visible = cols[None, :] < N
            if CAUSAL:
                visible = visible & (offs_m[:, None] >= cols[None, :])  # key j <= query i
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(O + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=offs_m[:, None] < N)


    def attention_triton_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             causal: bool = False) -> torch.Tensor:
        """Attention forward with grouped-query heads and an optional causal mask.

        Args:
            q: (batch, Hq, N, d); k, v: (batch, kv_heads, N, d), Hq % kv_heads == 0; float32.
            causal: query i sees keys j <= i.
        Returns:
            out: (batch, Hq, N, d) float32.
        """
        b, h, n, d = q.shape
        kv_heads = k.shape[1]
        q, k, v = (x.to(DEVICE, torch.float32).contiguous() for x in (q, k, v))
        out = torch.empty_like(q)
        BLOCK = 16
        grid = (triton.cdiv(n, BLOCK), b * h)
        _attn_fwd_gqa[grid](q, k, v, out, n, d ** -0.5, h, kv_heads, HEAD_DIM=d, BLOCK_M=BLOCK,
                            BLOCK_N=BLOCK, CAUSAL=causal)
        return out
    # fmt: on

    return {"attention_triton_gqa": attention_triton_gqa}


def solution_source(name: str) -> str:
    return nested_source(define_solution, name)


# The stub keeps the kernel's signature: the student completes a skeleton.
STUB = '''@triton.jit
def _attn_fwd_gqa(Q, K, V, O, N, scale, H_Q, KV_HEADS,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr):
    # YOUR CODE: like _attn_fwd, plus the kv head of query head h, plus the causal mask
    pass


def attention_triton_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         causal: bool = False) -> torch.Tensor:
    """Attention forward with grouped-query heads and an optional causal mask.

    Args:
        q: (batch, Hq, N, d); k, v: (batch, kv_heads, N, d), Hq % kv_heads == 0; float32.
        causal: query i sees keys j <= i.
    Returns:
        out: (batch, Hq, N, d) float32.
    """
    # YOUR CODE
    raise NotImplementedError'''

EXERCISES = [
    {"name": "attention_triton_gqa", "text": "Write the kernel and its wrapper.", "stub": STUB}
]

VISIBLE = {
    "attention_triton_gqa": [
        {
            "name": "causal, one kv head per head",
            "heads": 2,
            "kv_heads": 2,
            "n": 40,
            "causal": True,
            "seed": 70,
            "points": 2,
        },
        {
            "name": "GQA: 4 query heads, 2 kv heads",
            "heads": 4,
            "kv_heads": 2,
            "n": 32,
            "seed": 71,
            "points": 2,
        },
        {
            "name": "GQA and causal, uneven N",
            "heads": 6,
            "kv_heads": 2,
            "n": 37,
            "causal": True,
            "seed": 72,
            "points": 2,
        },
    ]
}

HIDDEN = {
    "attention_triton_gqa": [
        {
            "name": "hidden: 8 heads on 1 kv head, causal",
            "heads": 8,
            "kv_heads": 1,
            "n": 21,
            "causal": True,
            "seed": 161,
            "points": 2,
        }
    ]
}


# -- tests: builders and the mistakes they name ------------------------------------------------
def build_attention_triton_gqa(params) -> Case:
    q, k, v = bhnd_inputs(params)
    causal = bool(params.get("causal", False))

    def judge(out, outcome):
        if outcome is not None and getattr(outcome, "launches", 1) == 0:
            raise Fail("no Triton kernel was launched: the exercise is to write one (@triton.jit)")
        o = as_array(out, "out", q.shape)
        kk, vv = gqa_expand(k, q.shape[1]), gqa_expand(v, q.shape[1])
        ref, _ = attention_reference(q, kk, vv, causal)
        naive = attention_naive(q, kk, vv, causal)
        try:
            return compare(o, ref, naive, "out", triton_variants(q, k, v, causal, gqa=True))
        except Fail as e:
            raise tf32_or(e, o, ref) from None

    return Case(
        "attention_triton_gqa",
        params.get("name", "out"),
        float(params.get("points", 1)),
        "attention_triton_gqa",
        (q, k, v),
        {"causal": causal},
        judge,
        torch=True,
        timeout=params.get("timeout"),
    )


BUILDERS = {
    "attention_triton_gqa": build_attention_triton_gqa,
}
