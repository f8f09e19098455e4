"""scripts/gpu_wheel_check.py on a CPU: its accuracy rule, its refusal of a bad --wheel, and the
install it makes (the wheel in a fresh folder, imported from an empty directory); the GPU calls
themselves run on the device machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import colab_env  # noqa: E402
import gpu_wheel_check  # noqa: E402


def test_budget_is_twice_sdpas_error_plus_one_rounding():
    ref = torch.tensor([1.0, -2.0, 0.5])
    sdpa = torch.tensor([1.001, -2.0, 0.5], dtype=torch.float16)
    err = (sdpa.float() - ref).abs().max().item()  # fp16 rounds 1.001 to 1.0009765625
    r = ref.to(torch.float16)
    atol = 2 * (r + 0.3 - 0.3 - r).abs().max().item()  # one rounding at |ref| = 2 in fp16
    assert atol > 1e-5
    assert gpu_wheel_check._budget(sdpa, ref, torch.float16) == pytest.approx(2 * err + atol)
    exact = ref.to(torch.float16)  # SDPA exact here: only the rounding term, never below 1e-5
    assert gpu_wheel_check._budget(exact, ref, torch.float16) == pytest.approx(atol)


@pytest.mark.parametrize("wheel", [None, "no/such/*.whl"])
def test_a_wheel_that_is_not_one_file_is_refused(wheel, tmp_path, capsys):
    args = ["--out", str(tmp_path)] + (["--wheel", wheel] if wheel else [])
    with pytest.raises(SystemExit) as exc:
        gpu_wheel_check.main(args)
    assert exc.value.code == 2
    assert "--wheel must name exactly one wheel file" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path; a GPU runs the calls")
def test_installs_the_wheel_and_imports_it_from_an_empty_folder(tmp_path):
    wheel = colab_env.build_wheel(tmp_path)
    out = tmp_path / "out"
    assert gpu_wheel_check.main(["--wheel", str(wheel), "--out", str(out)]) == 2
    record = json.loads((out / "wheel_check.json").read_text())
    assert record["installed_from_wheel"] is True, record["course_kernels_file"]
    assert not record["course_kernels_file"].startswith(str(ROOT))
    assert record["ok"] is False and "no CUDA GPU" in record["error"]
    assert record["environment"]["command"].endswith(f"--inner --out {out / 'wheel_check.json'}")
