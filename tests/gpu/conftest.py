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


def pytest_addoption(parser):
    parser.addoption(
        "--gluon-causal-default",
        action="append",
        default=[],
        metavar="D:KEY=V",
        help="run the suite as if the Gluon forward's causal default at head dim D had KEY=V "
        "(an integer; 0/1 for a switch), e.g. 64:PACK_P=1: a timed lever's candidate default "
        "checked under every test before the package takes it (session 37)",
    )


def candidate_defaults(specs, causal_config):
    """Apply ``D:KEY=V`` specs to ``causal_config`` (launch.CAUSAL_CONFIG) in place; returns the
    applied (d, key, value) triples. A malformed spec, an unknown head dim or a key the forward
    does not take is an error naming what is accepted."""
    from course_kernels.gluon import launch

    applied = []
    for spec in specs:
        try:
            d, kv = spec.split(":")
            key, value = kv.split("=")
            d, value = int(d), int(value)
        except ValueError:
            raise pytest.UsageError(f"--gluon-causal-default {spec!r}: expected D:KEY=V, "
                                    "e.g. 64:PACK_P=1") from None  # fmt: skip
        if d not in causal_config or key not in launch.SCHEDULE_KEYS:
            raise pytest.UsageError(
                f"--gluon-causal-default {spec!r}: head dims {sorted(causal_config)}, "
                f"keys {sorted(launch.SCHEDULE_KEYS)}"
            )
        causal_config[d][key] = value  # an int, as sweep_forward.py passes its variants
        applied.append((d, key, value))
    return applied


def pytest_configure(config):
    specs = config.getoption("--gluon-causal-default", default=[])
    if specs:  # every xdist worker runs this too: the whole suite sees the candidate
        from course_kernels.gluon import launch

        candidate_defaults(specs, launch.CAUSAL_CONFIG)


def pytest_report_header(config):
    specs = config.getoption("--gluon-causal-default", default=[])
    if not specs:
        return None
    from course_kernels.gluon import launch

    ds = sorted({int(s.split(":")[0]) for s in specs})
    return f"Gluon causal default candidates: {specs}; " + "; ".join(
        f"CAUSAL_CONFIG[{d}] = {launch.CAUSAL_CONFIG[d]}" for d in ds
    )


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "gpu")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not HAS_CUDA:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture
def gluon_documents(monkeypatch):
    """``run(side, d, q, k, v, cu, max_len, dout)``: ``flash_attention_varlen`` (one offsets tensor
    ``cu`` for queries and keys, causal) under ``auto`` with the Gluon documents kernel of
    ``side`` ("forward" or "backward") listed at head dim d whatever the work, and under
    ``triton``; checks that only ``auto`` called it; returns {choice: (o, dq, dk, dv)}."""
    from course_kernels.triton import launch
    from course_kernels.triton.varlen import flash_attention_varlen

    def run(side, d, q, k, v, cu, max_len, dout):
        import torch

        monkeypatch.setattr(launch, "GLUON_MIN_WORK", 0)
        monkeypatch.setitem(getattr(launch, f"GLUON_MASKED_{side.upper()}"), "documents", (d,))
        name, calls, res = f"gluon_varlen_{side}", [], {}
        real = getattr(launch, name)
        monkeypatch.setattr(launch, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
        for choice in ("auto", "triton"):
            monkeypatch.setenv(
                launch.FORWARD_ENV if side == "forward" else launch.BACKWARD_ENV, choice
            )
            xs = [x.detach().requires_grad_() for x in (q, k, v)]
            o = flash_attention_varlen(*xs, cu, cu, max_len, max_len, causal=True)
            res[choice] = (o, *torch.autograd.grad(o, xs, dout))
            assert len(calls) == 1  # only "auto" took it
        return res

    return run
