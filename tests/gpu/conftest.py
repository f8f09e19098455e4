"""GPU suite: every test here is marked ``gpu`` and skipped cleanly where CUDA is absent.

Run on a GPU machine: ``COURSE_KERNELS_AUTOTUNE=0 python -m pytest tests/gpu -q`` (one config
per kernel: the suite checks semantics; ``python -m course_kernels bench`` checks the tuned
configs at every benchmarked shape). ``scripts/gpu_session.sh`` records each run's outcome.
"""

import pytest


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _cuda()


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "gpu")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not HAS_CUDA:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
