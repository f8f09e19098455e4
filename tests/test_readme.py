"""The README's Python examples run as written: on a CPU the NumPy one; on a GPU all three."""

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_readme_has_the_three_examples():
    assert len(BLOCKS) == 3
    assert "flash_attention_numpy" in BLOCKS[0]
    assert "ck.flash_attention(" in BLOCKS[1]
    assert "flash_decode(" in BLOCKS[2]


def test_readme_numpy_example_runs(capsys):
    exec(compile(BLOCKS[0], "README.md", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert float(printed[0]) < 1e-12  # the tiled forward vs the float64 reference
    assert int(printed[1]) == 4 * 4096**2 + 4 * 4096 * 64  # the formula in the comment


@pytest.mark.skipif(not _cuda(), reason="the kernel examples use device='cuda'")
@pytest.mark.parametrize("index", [1, 2])
def test_readme_gpu_examples_run(index):
    exec(compile(BLOCKS[index], "README.md", "exec"), {})
