"""What every part of the sandbox shares: the limits, the "no sandbox" error, the run tag."""

from __future__ import annotations

import os
from dataclasses import dataclass


class SandboxUnavailable(RuntimeError):
    """No working bubblewrap: student code is not run unless the caller passes ``unsafe``."""


@dataclass
class Limits:
    call_seconds: float = 20.0  # wall time of one call
    total_seconds: float = 240.0  # wall time of the whole notebook (every child together)
    memory_bytes: int = 4 << 30  # whole tree (cgroup) and per process (RLIMIT_AS)
    nproc: int = 256  # pids.max (cgroup); RLIMIT_NPROC (per uid: shared) where no cgroup
    tmpfs_bytes: int = 64 << 20  # size of /tmp and of /box inside the sandbox


def _tag() -> str:
    """COURSE_GRADING_TAG: a label put in this grader's cgroup names and children's environment,
    so that a test can find anything of its own that outlived the grading."""
    tag = "".join(c for c in os.environ.get("COURSE_GRADING_TAG", "") if c.isalnum())[:32]
    return tag + "-" if tag else ""
