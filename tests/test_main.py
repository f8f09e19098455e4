"""``python -m course_kernels``: clear errors without a GPU or with bad options; dram parse."""

import json

import pytest

from course_kernels.__main__ import _cuda, main

NO_GPU = pytest.mark.skipif(_cuda(), reason="checks the message shown where there is no GPU")


@NO_GPU
@pytest.mark.parametrize(
    "argv",
    [
        ["bench"],
        ["sweep"],
        ["memory"],
        ["gpu-check"],
        ["dram", "run"],
        ["apps", "train"],
        ["apps", "decode"],
    ],
)
def test_gpu_commands_say_they_need_a_gpu(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and argv[0] in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.parametrize(
    "flag,value,word",
    [
        ("--dtypes", "float16,float64", "float64"),
        ("--modes", "fwd,both", "both"),
        ("--providers", "flash,xformers", "xformers"),
    ],
)
def test_bench_rejects_unknown_choices(flag, value, word, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and repr(word) in err and "choose from" in err


def test_dram_parse_needs_its_inputs(capsys):
    with pytest.raises(SystemExit):
        main(["dram", "parse"])
    assert "--ncu-csv" in capsys.readouterr().err


def test_dram_parse_from_the_command_line(tmp_path, capsys):
    raw = tmp_path / "ncu.csv"
    raw.write_text(
        '"ID","Stream","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"\n'
        '"","","","byte","byte"\n"0","7","_attn_fwd","300","4"\n'
    )
    cases = tmp_path / "cases.txt"
    env = {"gpu": "Some GPU", "torch": "9.9", "triton": "8.8", "date": "2026-01-01T00:00:00"}
    cases.write_text(
        "some log line\n"
        + json.dumps({"environment": env})
        + "\n"
        + json.dumps([{"provider": "flash", "N": 1024, "batch": 1, "heads": 4, "d": 64}])
        + "\n"
    )
    out = tmp_path / "dram.csv"
    assert (
        main(["dram", "parse", "--ncu-csv", str(raw), "--cases", str(cases), "--out", str(out)])
        == 0
    )
    assert "flash,1024,1,4,64,float16,300,4,1," in out.read_text()
    header = out.read_text().splitlines()[0]
    assert "Some GPU" in header and "torch 9.9" in header and "2026-01-01" in header
    assert "flash,1024" in capsys.readouterr().out
