"""``python -m course_kernels``: clear errors without a GPU or with bad options; dram parse."""

import importlib
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


# -- from a mutation audit: options reach the runs (the runs replaced by stand-ins) ---------------
@pytest.fixture
def gpu_here(monkeypatch):
    """Pretend a GPU is present and record what each command would run."""
    import course_kernels.__main__ as cli
    from course_kernels import bench
    from course_kernels.apps import runs

    monkeypatch.setattr(cli, "_cuda", lambda: True)
    calls = {}

    def record(name, result):
        def fn(*a, **kw):
            calls[name] = (a, kw)
            return result() if callable(result) else result

        return fn

    calls["rows"] = []
    monkeypatch.setattr(bench, "run_bench", record("bench", lambda: calls["rows"]))
    monkeypatch.setattr(bench, "run_sweep", record("sweep", []))
    monkeypatch.setattr(bench, "run_memory", record("memory", []))
    monkeypatch.setattr(runs, "run", record("apps", None))
    return calls


def test_bench_options_reach_run_bench(gpu_here, capsys):
    assert main(["bench", "--causal", "yes", "--ds", "32,64", "--ns", "128,256"]) == 0
    (out_dir,), kw = gpu_here["bench"]
    assert out_dir == "course_kernels/data/bench"
    assert kw["causals"] == (True,) and kw["ds"] == (32, 64) and kw["ns"] == (128, 256)
    assert kw["check"] is True and kw["batch"] == 4 and kw["hidden"] == 2048
    assert kw["dtypes"] == ("float16", "bfloat16") and kw["modes"] == ("fwd", "bwd")
    assert main(["bench", "--causal", "no", "--no-check", "--dtypes", "float32"]) == 0
    kw = gpu_here["bench"][1]
    assert kw["causals"] == (False,) and kw["check"] is False and kw["dtypes"] == ("float32",)
    assert "correctness: 0 failing shapes" in capsys.readouterr().out


def test_bench_exit_status_follows_the_correctness_checks(gpu_here, capsys):
    row = {"provider": "flash", "dtype": "float16", "d": 64, "N": 128, "causal": False,
           "mode": "fwd", "tflops": 1.0}  # fmt: skip
    gpu_here["rows"] += [{**row, "check": {"ok": True}}]
    assert main(["bench"]) == 0
    gpu_here["rows"] += [{**row, "N": 256, "check": {"ok": False}}]
    assert main(["bench"]) == 1
    assert "correctness: 1 failing shapes" in capsys.readouterr().out


def test_sweep_memory_and_apps_options_reach_their_runs(gpu_here):
    assert main(["sweep", "--n", "512", "--ds", "64"]) == 0
    assert gpu_here["sweep"] == (("course_kernels/data/bench",), {"n": 512, "ds": (64,)})
    assert main(["memory", "--ns", "1024,2048", "--out", "m"]) == 0
    assert gpu_here["memory"] == (("m",), {"ns": (1024, 2048)})
    assert main(["apps", "decode", "--out", "a"]) == 0
    assert gpu_here["apps"] == (("decode", "a"), {})


def test_dram_parse_needs_both_inputs(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["dram", "parse", "--ncu-csv", str(tmp_path / "x.csv")])
    assert "--cases" in capsys.readouterr().err


def test_dram_parse_uses_the_last_case_list_and_environment(tmp_path):
    raw = tmp_path / "ncu.csv"
    raw.write_text(
        '"ID","Stream","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"\n'
        '"0","7","_attn_fwd","300","4"\n'
    )
    old = [{"provider": "naive", "N": 8, "batch": 1, "heads": 4, "d": 64}] * 2
    new = [{"provider": "flash", "N": 1024, "batch": 1, "heads": 4, "d": 64}]
    cases = tmp_path / "cases.txt"
    cases.write_text(
        "\n".join(
            [
                json.dumps({"environment": {"gpu": "Old GPU"}}),
                json.dumps(old),
                json.dumps({"environment": {"gpu": "New GPU"}}),
                json.dumps(new),
            ]
        )
        + "\n"
    )
    out = tmp_path / "dram.csv"
    main(["dram", "parse", "--ncu-csv", str(raw), "--cases", str(cases), "--out", str(out)])
    lines = out.read_text().splitlines()
    assert "New GPU" in lines[0] and "Old GPU" not in lines[0]
    assert lines[2].startswith("flash,1024,1,4,64,float16,300,4,1,")


@pytest.mark.parametrize(
    "module,argv0,usage",
    [
        ("course_kernels.__main__", "/u/venv/bin/course-kernels", "course-kernels"),
        ("course_kernels.__main__", "/site/course_kernels/__main__.py", "python -m course_kernels"),
        ("course_kernels.grading.instructor.cli", "/u/venv/bin/course-grade", "course-grade"),
        (
            "course_kernels.grading.instructor.cli",
            "/site/course_kernels/grading/__main__.py",
            "python -m course_kernels.grading",
        ),
    ],
)
def test_usage_names_the_command_the_user_typed(module, argv0, usage, capsys, monkeypatch):
    """Both console scripts (``course-kernels``, ``course-grade``) and both ``-m`` forms."""
    monkeypatch.setattr("sys.argv", [argv0, "--help"])
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main(["--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {usage} ")
