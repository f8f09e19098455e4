"""Renamed keyword arguments keep working for one release, with a ``DeprecationWarning``.

The package settled on one name per concept (the glossary in ``course_kernels.__doc__``):
``block_q``/``block_k`` for tile rows (not ``block_r``/``block_c``) and ``context_len`` for a
language model's context (not ``block_size``, which names the SRAM rule in ``blocks``).
"""

from __future__ import annotations

import functools
import warnings


def renamed_kwargs(**old_to_new: str):
    """Decorator: a call with an old keyword warns, naming the new one, and passes it on."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{fn.__qualname__}() got both {old!r} (deprecated) and {new!r}; "
                            f"pass only {new!r}"
                        )
                    warnings.warn(
                        f"{fn.__qualname__}(): keyword {old!r} is deprecated and will be "
                        f"removed in the next release; use {new!r}",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return inner

    return wrap
