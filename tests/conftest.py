"""Shared fixtures. Random inputs are drawn fresh from a seeded generator per test."""

import os
import zlib

import numpy as np
import pytest

# Kernels run in Triton's interpreter when there is no GPU; the package decides, but make the
# choice explicit for the whole test session before anything imports triton.
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` that works with pytest 9.2: xdist 3.8 groups tests by appending
    ``@group`` to ``item._nodeid``, which pytest 9.2 nodes no longer read (their id is
    structured), so every ``xdist_group`` mark was ignored and the machine-loading tests ran on
    both workers at once. Here a test module's group is read from its ``pytestmark`` line
    (``xdist_group("NAME")``), and all tests of a group go to one worker; other tests are
    scheduled one by one, as ``--dist load`` does."""
    if config.getvalue("dist") != "loadgroup":
        return None
    import re

    from xdist.scheduler import LoadGroupScheduling

    mark = re.compile(r'^pytestmark\b.*xdist_group\("([\w-]+)"\)', re.M)
    groups: dict = {}

    class ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            if path not in groups:
                try:
                    found = mark.search((config.rootpath / path).read_text())
                except OSError:
                    found = None
                groups[path] = found.group(1) if found else None
            return groups[path] or super()._split_scope(nodeid)

    return ModuleGroups(config, log)


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


# CI runs the same Hypothesis examples every time (derandomized); locally they vary.
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    _hyp_settings.load_profile("ci")


@pytest.fixture(scope="session")
def class_of_200(tmp_path_factory):
    """The synthetic class of 200 (tests/generate_class.py), made once per pytest worker: root
    grades it in test_grading_class.py, a non-root user in test_grading_nonroot.py (both in the
    xdist group heavy_grading, so one worker runs both). Returns (folder, answers); tests copy it
    rather than change it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import generate_class

    folder = tmp_path_factory.mktemp("class-of-200") / "class"
    answers = generate_class.generate(folder, 200)
    assert len(answers) == 200 and set(answers.values()) == {"solved", "untouched", "wrong", "loop"}
    return folder, answers
