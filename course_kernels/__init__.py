"""course_kernels: Flash Attention from first principles, as a package.

One tensor layout everywhere: (batch, heads, seq, head_dim), like PyTorch's
``scaled_dot_product_attention``. The NumPy layers accept any leading dims (..., N, d).

The ladder (one module per concept, one book chapter each):

- ``reference``       float64 standard attention (the truth)
- ``online_softmax``  the running (m, l) state and the merge of partial results
- ``tiled``           Flash Attention forward in NumPy, FA1 and FA2 loop orders
- ``tiled_backward``  the tiled backward pass from the saved logsumexp
- ``blocks``          block sizes from the SRAM budget
- ``iosim``           a two-level memory that counts HBM traffic (the memory: ``iosim.memory``)
- ``flash``           the Triton kernels behind ``flash_attention`` (torch and triton imported lazily)
- ``split_kv``        split-KV decoding in NumPy (Flash-Decoding's algorithm); ``decode`` runs it in Triton
- ``apps``            the Applications chapter's GPU runs (training, context length, decode steps)
- ``distributed``     ring attention: one sequence over several GPUs (``torch.distributed``; import it)

Glossary: one name per concept (the book's appendix has the same table).

=====================  ============  =================  ===================  =========================
concept                paper         NumPy / Python     Triton kernels       notes
=====================  ============  =================  ===================  =========================
query tile rows        B_r           ``block_q``        ``BLOCK_M``          Triton's M x N tile names
key/value tile rows    B_c           ``block_k``        ``BLOCK_N``          backward: ``BLOCK_M1/N1``
SRAM rule B            B = M/4d      ``block_size``     --                   floor(M / 4d), nothing else
keys per decode split  --            ``chunk``          ``KEYS_PER_SPLIT``   a multiple of ``BLOCK_N``
query heads            H             ``heads``, ``Hq``  ``H_Q``              shape comments say Hq
key/value heads        H_kv          ``kv_heads``       ``KV_HEADS``         GQA: Hq = G * kv_heads
GQA group size         G             ``G``              ``GROUP_SIZE``       query heads per KV head
softmax scale          tau           ``scale``          ``scale``            None means 1/sqrt(d)
scale in base 2        --            --                 ``qk_scale``         scale * ``LOG2E``, exp2 (Gluon)
score in units of c    --            --                 ``qk_mul``, ``c2``   s = c * r; c2 = c * ``LOG2E``
log2(e)                --            ``LOG2E``          ``LOG2E`` constexpr  defined once, ``reference``
model context length   T             ``context_len``    --                   ``gpt`` only
query / key length     N_q, N_k      ``n_q``, ``n_k``   ``N_CTX_Q/N_CTX_K``
head dim               d             ``d``, head_dim    ``HEAD_DIM``
SRAM capacity          M             ``M``, sram_elems  --                   in elements
logsumexp              L             ``lse``            ``lse2`` (base 2)    lse = lse2 * ln 2
=====================  ============  =================  ===================  =========================

Inside Triton kernels the tile sizes keep Triton's own names (``BLOCK_M`` rows of queries,
``BLOCK_N`` rows of keys), as in Triton's tutorials; the tuning data files record them
lowercased (``block_m``, ``block_n``). The old keywords ``block_r``/``block_c`` (tile rows),
``block`` (``online_softmax``), ``block_n`` (``decode.default_num_splits``), ``block_size``
(``gpt``), ``Hkv`` (``ring_bench``) and ``block_m``/``block_n``
(``bench.forced_forward_config``) still work for one release with a ``DeprecationWarning``.
"""

from . import iosim
from .numpy.blocks import PaperBlockSizes, article_block_size, block_size, paper_block_sizes
from .numpy.online_softmax import (
    PartialAttention,
    SoftmaxState,
    finalize,
    merge,
    online_softmax,
    update,
)
from .numpy.reference import attention_mask, attention_naive, attention_reference, causal_mask
from .numpy.tiled import flash_attention_numpy
from .numpy.tiled_backward import attention_reference_backward, flash_attention_numpy_backward


def flash_attention(q, k, v, causal=False, scale=None, return_lse=False, **variants):
    """Flash Attention in Triton, a drop-in for ``scaled_dot_product_attention``.

    See :func:`course_kernels.triton.flash.flash_attention` (imported on first call so that the NumPy
    layers work without torch or Triton installed); ``variants`` are its keyword-only arguments
    (``attn_mask``, ``causal_alignment``, ``window_size``, ``softcap``, ``alibi_slopes``, and
    SDPA's ``is_causal``, ``dropout_p`` (0) and ``enable_gqa``, so an SDPA call runs as written).
    """
    from .triton.flash import flash_attention as _impl

    return _impl(q, k, v, causal=causal, scale=scale, return_lse=return_lse, **variants)


def flash_attention_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args, **kw
):
    """Variable-length (packed) Flash Attention in Triton, flash-attn's ``flash_attn_varlen_func``
    layout. See :func:`course_kernels.triton.varlen.flash_attention_varlen`."""
    from .triton.varlen import flash_attention_varlen as _impl

    return _impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args, **kw)


__all__ = [
    "PaperBlockSizes",
    "PartialAttention",
    "SoftmaxState",
    "article_block_size",
    "attention_mask",
    "attention_naive",
    "attention_reference",
    "attention_reference_backward",
    "block_size",
    "causal_mask",
    "finalize",
    "flash_attention",
    "flash_attention_numpy",
    "flash_attention_numpy_backward",
    "flash_attention_varlen",
    "iosim",
    "merge",
    "online_softmax",
    "paper_block_sizes",
    "update",
]
