"""Rung 5: FlashAttention-2 in Triton, forward and backward, behind a drop-in for PyTorch's SDPA.

Chapters: "From NumPy to Triton", "The backward pass", "Engineering", "Tuning", "Hopper".

- :mod:`._env`              where the kernels run (a CUDA GPU, or Triton's CPU interpreter), decided
                            once, before any kernel is defined
- :mod:`._torch_validate`   the input checks every public torch function shares
- :mod:`.forward`           ``_attn_fwd``: FA2's Algorithm 1, one program per query block
- :mod:`.backward`          ``_attn_bwd_dkdv``: FA2's Algorithm 2, one program per key block
- :mod:`.backward_dq`       ``_attn_bwd_dq`` and the D = rowsum(dO * O) preprocess
- :mod:`.configs`           the kernels' autotuning spaces (forward and backward)
- :mod:`.masks`             the score/mask hooks (causal either alignment, sliding window, soft
                            cap, ALiBi), the block ranges they imply, the variant's checks
- :mod:`.varlen`            ``flash_attention_varlen``: packed sequences (cu_seqlens), its
                            ``torch.library`` op
- :mod:`.launch`            the launches (grids, tuned-config cache)
- :mod:`.flash`             ``flash_attention``: validation, autograd, the ``torch.library`` op

Nothing is imported here, so that ``import course_kernels.triton._env`` stays cheap; the public
function is ``course_kernels.flash_attention``.
"""
