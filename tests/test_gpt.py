"""The tiny GPT: exact attention gives the same losses whichever kernel computes it.

The flash runs go through Triton's CPU interpreter when there is no GPU: a few steps only.
"""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from course_kernels.apps import gpt  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_gpt_attention_functions_agree():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 19, 16, device=DEV) for _ in range(3))  # (B, H, T, hd), odd T
    ref = gpt.standard_attention(q.double(), k.double(), v.double())
    for name in ("standard", "sdpa", "flash"):
        out = gpt.ATTENTION[name](q, k, v)
        assert (out.double() - ref).abs().max().item() < 1e-4, name


def test_gpt_attention_without_mask_is_caught():
    """A 'causal' attention that forgets the mask differs from the standard one."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    leaky = torch.softmax(q @ k.transpose(-2, -1) / 4, -1) @ v
    assert (leaky - gpt.standard_attention(q, k, v)).abs().max() > 1e-2


def test_gpt_training_is_deterministic_and_learns():
    # On the CPU: a GPU's embedding backward adds with atomics, so its last bits can vary.
    a = gpt.train("standard", steps=60, progress=False, device="cpu")
    b = gpt.train("standard", steps=60, progress=False, device="cpu")
    assert a.losses == b.losses
    vocab = a.config["vocab_size"]
    assert abs(a.losses[0] - math.log(vocab)) < 0.5  # starts near uniform guessing
    assert a.losses[-1] < a.losses[0] - 0.8  # and learns
    assert a.tokens_per_s > 0


def test_gpt_flash_and_standard_losses_match():
    kw = dict(steps=3, batch_size=2, context_len=32, progress=False, device=DEV)
    std = gpt.train("standard", **kw)
    fl = gpt.train("flash", **kw)
    diffs = [abs(x - y) for x, y in zip(std.losses, fl.losses, strict=True)]
    assert max(diffs) < 1e-4, diffs
    other_seed = gpt.train("standard", seed=1, **kw)  # the comparison can fail
    assert max(abs(x - y) for x, y in zip(std.losses, other_seed.losses, strict=True)) > 1e-3


def test_gpt_saved_activations_grow_quadratically_only_for_standard():
    kw = dict(batch_size=1, n_layer=1)
    small = {a: gpt.saved_activation_bytes(a, context_len=64, **kw) for a in ("standard", "flash")}
    big = {a: gpt.saved_activation_bytes(a, context_len=128, **kw) for a in ("standard", "flash")}
    # The flash model saves O(T): doubling T doubles it (within a few percent).
    assert big["flash"] / small["flash"] == pytest.approx(2.0, rel=0.05)
    # Standard attention also saves the (B, H, T, T) fp32 probabilities: an extra that grows ~4x.
    extra_small = small["standard"] - small["flash"]
    extra_big = big["standard"] - big["flash"]
    assert extra_big / extra_small > 3.5
    assert big["standard"] > big["flash"] + 0.8 * 2 * 128 * 128 * 4


def test_gpt_tokenizer_and_generate():
    text = gpt.load_text()
    assert 5_000 < len(text) < 500_000
    tok = gpt.CharTokenizer(text)
    assert tok.decode(tok.encode("the table")) == "the table"
    with pytest.raises(ValueError, match="vocabulary"):
        tok.encode("\x00")
    cfg = gpt.GPTConfig(tok.vocab_size, context_len=16)
    model = gpt.GPT(cfg)
    out = model.generate(tok.encode("The").view(1, -1), 5, torch.Generator().manual_seed(0))
    assert out.shape == (1, 8)


def test_gpt_bad_config():
    with pytest.raises(ValueError, match="attention"):
        gpt.GPTConfig(10, attention="linear")
    with pytest.raises(ValueError, match="multiple of n_head"):
        gpt.GPTConfig(10, n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="multiple of 8"):
        gpt.GPTConfig(10, n_embd=24, n_head=2, attention="flash")
    with pytest.raises(ValueError, match="context_len"):
        gpt.GPTConfig(10, context_len=0)
    with pytest.raises(ValueError, match="steps"):
        gpt.train(steps=0)
    model = gpt.GPT(gpt.GPTConfig(10, context_len=4))
    with pytest.raises(ValueError, match="exceeds context_len"):
        model(torch.zeros(1, 5, dtype=torch.long))


# -- from a mutation audit ------------------------------------------------------------------------
def test_gpt_load_text_accepts_the_older_data_prefix():
    assert gpt.load_text("data/text/tiny_corpus.txt") == gpt.load_text()


def test_gpt_tokenizer_refuses_empty_text():
    with pytest.raises(ValueError, match="non-empty"):
        gpt.CharTokenizer("")


def test_gpt_get_batch_targets_are_the_next_characters():
    data = torch.arange(12)  # the shortest text for context 10: one window, start 0 only
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        x, y = gpt.get_batch(data, 4, 10, gen)
        assert x.shape == y.shape == (4, 10)
        assert torch.equal(y, x + 1) and int(x[:, 0].max()) <= 0


def test_gpt_config_refuses_bools_and_accepts_flash_head_dim_8():
    with pytest.raises(ValueError, match="n_layer must be a positive integer"):
        gpt.GPTConfig(10, n_layer=True)
    assert gpt.GPTConfig(10, n_embd=16, n_head=2, attention="flash").n_embd == 16


def test_gpt_generate_past_the_context_keeps_the_last_window():
    model = gpt.GPT(gpt.GPTConfig(10, context_len=4))
    out = model.generate(torch.zeros(1, 3, dtype=torch.long), 6, torch.Generator().manual_seed(0))
    assert out.shape == (1, 9)


def test_gpt_train_sets_cpu_threads_only_on_the_cpu_and_restores_them(monkeypatch):
    monkeypatch.setattr(gpt, "_train", lambda *a: torch.get_num_threads())
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert gpt.train(device="cpu", cpu_threads=1) == 1
        assert torch.get_num_threads() == 3
        assert gpt.train(device="cuda", cpu_threads=1) == 3  # a GPU run leaves them alone
    finally:
        torch.set_num_threads(before)


def test_gpt_train_repeats_a_short_text_for_a_long_context():
    kw = dict(steps=1, batch_size=1, n_layer=1, n_head=1, n_embd=8, progress=False, device="cpu")
    gpt.train(text="abcde", context_len=9, **kw)  # 5 characters, 11 needed: 3 copies
    gpt.train(text="abcdefghij", context_len=9, **kw)  # 10 characters, 11 needed: 2 copies


def test_gpt_train_records_and_uses_its_arguments(monkeypatch):
    import types

    batches, lrs = [], []
    get_batch = gpt.get_batch

    def spy(*a):
        x, y = get_batch(*a)
        batches.append(x)
        return x, y

    class AdamW(torch.optim.AdamW):
        def __init__(self, params, lr, **kw):
            lrs.append(lr)
            super().__init__(params, lr=lr, **kw)

    clock = iter([100.0, 104.0])
    monkeypatch.setattr(gpt, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(gpt, "get_batch", spy)
    monkeypatch.setattr(torch.optim, "AdamW", AdamW)
    kw = dict(steps=2, batch_size=3, context_len=8, n_layer=1, n_head=1, n_embd=8)
    r = gpt.train(lr=0.25, seed=7, progress=False, device="cpu", **kw)
    assert lrs == [0.25] and r.config["lr"] == 0.25 and r.config["seed"] == 7
    assert r.amp_dtype is None and r.seconds == 4.0
    assert r.tokens_per_s == (2 - 1) * 3 * 8 / 4.0  # after the first step
    clock = iter([0.0, 1.0])
    seven = [b.clone() for b in batches]
    batches.clear()
    gpt.train(seed=8, progress=False, device="cpu", **kw)
    assert not torch.equal(seven[0], batches[0])  # the batches follow the seed too


def test_gpt_default_device_is_where_the_kernel_runs(monkeypatch):
    monkeypatch.setattr(gpt._triton_env, "device_kind", lambda: "the kernel's device")
    assert gpt._default_device(None) == "the kernel's device"
    assert gpt._default_device("cpu") == "cpu"
