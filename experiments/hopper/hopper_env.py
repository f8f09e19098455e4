"""The record every Hopper measurement script writes next to its rows: the environment (GPU,
versions, date) and the command that ran (experiments/hopper/hopper_levers.py and the modules it uses).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _env():
    from course_kernels.bench import environment

    env = environment()
    env["command"] = "python3 " + " ".join(sys.argv)
    return env
