"""The Gluon backward's host side on a machine without Hopper (CI): it imports anywhere, refuses
unsupported inputs with a message that says what is accepted, and says why it cannot run."""

import pytest

torch = pytest.importorskip("torch")

from course_kernels.gluon import backward_launch as GB  # noqa: E402
from course_kernels.gluon import launch as G  # noqa: E402


def _args(B=1, H=2, N=16, d=64, dtype=torch.float16, H_kv=None):
    q = torch.randn(B, H, N, d, dtype=dtype)
    k = torch.randn(B, H_kv or H, N, d, dtype=dtype)
    v = torch.randn_like(k)
    o, do = torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(B, H, N, dtype=torch.float32)
    return dict(do=do, q=q, k=k, v=v, o=o, lse=lse)


def test_imports_without_gluon_and_has_a_config_per_head_dim():
    assert set(GB.BACKWARD_CONFIG) == {64, 128}
    for cfg in GB.BACKWARD_CONFIG.values():
        assert cfg["NUM_CONSUMERS"] in GB.BACKWARD_CONSUMER_REGS


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(H_kv=1), "GQA/MQA .* not supported .* as many heads as q"),
        (dict(d=96), "head dim 96"),
        (dict(dtype=torch.float32), "float16 or all bfloat16"),
    ],
)
def test_unsupported_shapes_and_dtypes_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        GB.gluon_attention_backward(**_args(**change))


def test_o_do_and_lse_must_match_q():
    a = _args()
    with pytest.raises(ValueError, match=r"do must be a tensor of q's shape \(1, 2, 16, 64\)"):
        GB.gluon_attention_backward(**{**a, "do": a["do"][:, :, :8]})
    with pytest.raises(ValueError, match="o must be a tensor of q's shape .* torch.float16"):
        GB.gluon_attention_backward(**{**a, "o": a["o"].bfloat16()})
    with pytest.raises(ValueError, match="lse must be the forward's natural-log logsumexp"):
        GB.gluon_attention_backward(**{**a, "lse": a["lse"].double()})
    with pytest.raises(ValueError, match=r"float32 of shape \(1, 2, 16\)"):
        GB.gluon_attention_backward(**{**a, "lse": a["lse"][..., :3]})


def test_schedule_options_are_checked():
    with pytest.raises(ValueError, match="unknown backward option 'OVERLAP'; accepted"):
        GB.gluon_attention_backward(**_args(), OVERLAP=True)
    with pytest.raises(ValueError, match=r"NUM_CONSUMERS=3 not supported; accepted: \(1, 2\)"):
        GB.gluon_attention_backward(**_args(), NUM_CONSUMERS=3)


def test_clear_error_when_unavailable():
    if G.gluon_available():
        pytest.skip("Gluon is available here")
    with pytest.raises(RuntimeError, match="gluon_attention_backward is unavailable here"):
        GB.gluon_attention_backward(**_args())
