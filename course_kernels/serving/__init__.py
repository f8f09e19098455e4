"""Rung 6: serving. One new token against a long KV cache, and what the cache costs.

Chapters: "Applications" (decoding) and "Serving: KV cache, paged attention, chunked prefill".

- :mod:`.split_kv`  Flash-Decoding's split-KV algorithm in NumPy (no torch)
- :mod:`.decode`    the same in Triton: ``flash_decode``
- :mod:`.kvcache`   bytes of a KV cache per token and per context (NumPy only)
- :mod:`.pages`     paged KV caches: block tables, the page allocator, paged split-KV (NumPy)
- :mod:`.paged_decode`  the paged split-KV kernel in Triton: ``flash_decode_paged``
- :mod:`.varlen`    causal alignment, chunked prefill, cu_seqlens and program maps (NumPy)

Nothing is imported here: :mod:`.decode` and :mod:`.paged_decode` need torch and Triton, the
others do not.
"""
