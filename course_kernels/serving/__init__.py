"""Rung 6: serving. One new token against a long KV cache, and what the cache costs.

Chapter: "Applications" (decoding) and the serving sections.

- :mod:`.split_kv`  Flash-Decoding's split-KV algorithm in NumPy (no torch)
- :mod:`.decode`    the same in Triton: ``flash_decode``
- :mod:`.kvcache`   bytes of a KV cache per token and per context (NumPy only)
- :mod:`.pages`     paged KV caches: block tables, the page allocator, paged split-KV (NumPy)

Nothing is imported here: :mod:`.decode` needs torch and Triton, the other two do not.
"""
