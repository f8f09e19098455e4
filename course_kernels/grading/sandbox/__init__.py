"""The sandbox the grader runs student code in: bubblewrap, a cgroup, and a framed pipe back.

- :mod:`.sandbox`       one run of a submission: start, limit, collect (``run_submission``)
- :mod:`.bwrap`         the bubblewrap command line: what the sandbox can see
- :mod:`.seccomp`       the seccomp filter (classic BPF, assembled here) bwrap installs
- :mod:`.probe`         what this machine allows (probed once), and the refusals
- :mod:`.cgroups`       per-run memory, process and CPU limits (cgroup v2 or v1, root or delegated)
- :mod:`.process_tree`  the trusted launcher: joins the cgroup, sets rlimits, reaps the tree
- :mod:`.frames`        the length-prefixed result frames, parsed without executing anything
- :mod:`._child`        what runs inside: the student's cells and the grader's calls
- :mod:`._common`       the limits record and the error raised when no sandbox can start
"""

from ._common import Limits, SandboxUnavailable
from .sandbox import isolation, require_sandbox, run_submission

__all__ = ["Limits", "SandboxUnavailable", "isolation", "require_sandbox", "run_submission"]
