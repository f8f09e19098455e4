"""The applications on top of the ladder: a tiny GPT whose attention is pluggable, and the
Applications chapter's GPU runs.

- :mod:`.gpt`   a character-level GPT (the course kernel or standard attention)
- :mod:`.runs`  training, context-length and decode-step runs (``python -m course_kernels apps``)
- :mod:`.paged_runs`  the paged-KV decode benchmark (``apps paged``)
- :mod:`.measure`  what those runs share (CUDA check, a decode step's bytes, host time, graphs)
"""
