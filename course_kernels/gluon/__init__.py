"""Below Triton: FlashAttention-3's forward schedule in Gluon on Hopper (the course's last rung).

What this rung teaches: what Triton's ``tl`` level does for you (layouts, shared-memory
staging, pipelining, one program = one warpgroup-agnostic block) and what an FA3-class
kernel must say explicitly instead, in Gluon (``triton.experimental.gluon``, Triton 3.6):

* TMA loads of K/V into a multi-stage shared-memory ring guarded by mbarriers (producer role);
* warp specialisation with ``gl.warp_specialize``: one producer warpgroup, two or three
  consumer warpgroups each on its own 64-row Q slice, register budgets (``setmaxnreg``);
* asynchronous ``warpgroup_mma`` / ``warpgroup_mma_wait`` so one block's softmax runs while
  the previous block's PV is on the tensor cores;
* explicit distributed layouts (wgmma accumulator, register A operand) and explicit
  barriers, tails and causal masks.

Exports: ``gluon_attention_forward(q, k, v, causal, scale, window_left=None, cu_seqlens=None)
-> (o, lse)`` (natural-log lse; ``window_left``: a causal sliding window of that many keys before
the diagonal; ``cu_seqlens``: causal documents packed into one sequence), ``gluon_available()``
and ``GLUON_TRITON_VERSION``; flash-attn's packed layout: ``launch.gluon_varlen_forward`` and
``backward_launch.gluon_varlen_backward``.  Importing this package never needs a
GPU or a particular Triton; calling the kernel elsewhere raises a RuntimeError saying why.
"""

from .launch import GLUON_TRITON_VERSION, gluon_attention_forward, gluon_available

__all__ = ["GLUON_TRITON_VERSION", "gluon_attention_forward", "gluon_available"]
