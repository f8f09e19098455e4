"""The sandbox's seccomp filter (course_kernels/grading/sandbox/seccomp.py): the assembled BPF
program run by a small classic-BPF interpreter for chosen (arch, nr, args), its syscall tables
against the kernel headers, and, inside a real sandbox, denied calls answering EPERM while
honest code (NumPy, fork, subprocess, threads) still runs. Also the start-up probe refusing a
sandbox whose filter is missing, and the bubblewrap command line's capped, read-only tmpfs."""

from __future__ import annotations

import ast
import errno
import os
import re
import struct
import subprocess
from pathlib import Path

import numpy as np

import pytest

from course_kernels.grading.sandbox import bwrap, probe, seccomp
from course_kernels.grading.sandbox._common import Limits, SandboxUnavailable
from course_kernels.grading.sandbox.sandbox import run_submission

boxed = pytest.mark.skipif(not probe.isolation()["sandbox"], reason="needs the sandbox")
ALLOW, KILL = seccomp.RET_ALLOW, seccomp.RET_KILL_PROCESS
X86, ARM = seccomp.AUDIT_ARCH["x86_64"], seccomp.AUDIT_ARCH["aarch64"]


def EPERM_(e=errno.EPERM):
    return seccomp.RET_ERRNO | e


def run_bpf(prog: bytes, nr: int, arch: int, args=(0,) * 6) -> int:
    """A classic-BPF interpreter for what a seccomp filter may use (LD W ABS, JEQ/JGE/JSET K,
    RET K); anything else, a jump out of the program or falling off its end fails."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & (2**64 - 1) for a in args])
    insns = [struct.unpack_from("<HBBI", prog, i) for i in range(0, len(prog), 8)]
    assert len(prog) % 8 == 0 and 0 < len(insns) <= 4096
    pc, acc = 0, 0
    for _ in range(len(insns)):
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            assert k % 4 == 0 and k + 4 <= len(data)
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"opcode {code:#x} at {pc}")
        assert 0 <= pc < len(insns), "jumped out of the program"
    raise AssertionError("no return")


@pytest.mark.parametrize(
    "arch, nr, args, verdict",
    [
        ("x86_64", 39, (), ALLOW),  # getpid
        ("x86_64", 101, (), EPERM_()),  # ptrace
        ("x86_64", 250, (), EPERM_()),  # keyctl
        ("x86_64", 272, (0x10000000,), EPERM_()),  # unshare
        ("x86_64", 425, (), EPERM_()),  # io_uring_setup
        ("x86_64", 435, (), EPERM_(errno.ENOSYS)),  # clone3: glibc falls back to clone
        ("x86_64", 56, (0x11,), ALLOW),  # clone(SIGCHLD): fork
        ("x86_64", 56, (0x3D0F00,), ALLOW),  # clone as pthread_create calls it
        ("x86_64", 56, (0x10000011,), EPERM_()),  # clone(CLONE_NEWUSER | SIGCHLD)
        ("x86_64", 56, (0x40000000 | (1 << 40),), EPERM_()),  # CLONE_NEWNET, high bits set
        ("x86_64", 16, (0, 0x5412), EPERM_()),  # ioctl TIOCSTI
        ("x86_64", 16, (0, 0x5412 | (1 << 32)), EPERM_()),  # the kernel truncates to 32 bits
        ("x86_64", 16, (0, 0x541C), EPERM_()),  # TIOCLINUX
        ("x86_64", 16, (0, 0x541B), ALLOW),  # FIONREAD
        ("x86_64", 135, (0,), ALLOW),  # personality(PER_LINUX)
        ("x86_64", 135, (0xFFFFFFFF,), ALLOW),  # the query
        ("x86_64", 135, (0x0040000,), EPERM_()),  # ADDR_NO_RANDOMIZE
        ("x86_64", 0x40000000 | 39, (), EPERM_(errno.ENOSYS)),  # x32 getpid
        ("x86_64", 0x40000000 | 521, (), EPERM_(errno.ENOSYS)),  # x32 ptrace
        ("aarch64", 117, (), EPERM_()),  # ptrace
        ("aarch64", 101, (), ALLOW),  # nanosleep (x86_64's ptrace number)
        ("aarch64", 219, (), EPERM_()),  # keyctl
        ("aarch64", 220, (0x10000011,), EPERM_()),  # clone(CLONE_NEWUSER | SIGCHLD)
        ("aarch64", 220, (0x11,), ALLOW),
        ("aarch64", 29, (0, 0x5412), EPERM_()),  # ioctl TIOCSTI
        ("aarch64", 92, (0x0040000,), EPERM_()),  # personality
        ("aarch64", 435, (), EPERM_(errno.ENOSYS)),
    ],
)
def test_the_filter_decides_as_intended(arch, nr, args, verdict):
    prog = seccomp.program(arch)
    own = seccomp.AUDIT_ARCH[arch]
    assert run_bpf(prog, nr, own, tuple(args) + (0,) * (6 - len(args))) == verdict


def test_another_abi_is_killed_not_looked_up():
    assert run_bpf(seccomp.program("x86_64"), 101, 0x40000003) == KILL  # i386: int 0x80
    assert run_bpf(seccomp.program("x86_64"), 101, ARM) == KILL
    assert run_bpf(seccomp.program("aarch64"), 117, X86) == KILL
    assert run_bpf(seccomp.program("aarch64"), 117, 0x40000028) == KILL  # 32-bit arm


def test_every_denied_call_is_denied_with_its_errno():
    for arch, table in seccomp.NR.items():
        prog = seccomp.program(arch)
        for name, err, source in seccomp.DENY:
            assert source
            if name in table:
                got = run_bpf(prog, table[name], seccomp.AUDIT_ARCH[arch])
                assert got == seccomp.RET_ERRNO | err, (arch, name)
        denied = {table[n] for n, _, _ in seccomp.DENY if n in table}
        for nr in set(range(0, 470)) - denied - {table["clone"], table["ioctl"]}:
            if nr != table["personality"]:
                assert run_bpf(prog, nr, seccomp.AUDIT_ARCH[arch]) == ALLOW, (arch, nr)


def test_an_unknown_architecture_is_refused_with_a_reason():
    with pytest.raises(seccomp.SeccompUnsupported, match="x86_64 and aarch64 only.*riscv64"):
        seccomp.program("riscv64")


def _header_numbers(path):
    text = Path(path).read_text()
    return {m[0]: int(m[1]) for m in re.findall(r"#define __NR3?2?_?(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize(
    "arch, header",
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        ("aarch64", "/usr/include/asm-generic/unistd.h"),
    ],
)
def test_the_syscall_numbers_match_the_kernel_headers(arch, header):
    if not os.path.exists(header):
        pytest.skip(f"no {header} here")
    known = _header_numbers(header)
    checked = [n for n in seccomp.NR[arch] if n in known]
    assert len(checked) > 40
    for name in checked:
        assert seccomp.NR[arch][name] == known[name], name


CALLS = r"""
import ctypes, errno, fcntl, os, platform, subprocess, termios, threading
libc = ctypes.CDLL(None, use_errno=True)
KEYCTL = {"x86_64": 250, "aarch64": 219}[platform.machine()]
IO_URING_SETUP = 425
def err(r):
    return errno.errorcode.get(ctypes.get_errno(), "?") if r == -1 else "ok"
def f(x):
    out = {}
    ctypes.set_errno(0)
    out["keyctl"] = err(libc.syscall(KEYCTL, 0, ctypes.c_long(-3), 0))
    out["unshare"] = err(libc.unshare(0x10000000))
    out["io_uring"] = err(libc.syscall(IO_URING_SETUP, 1, 0))  # EFAULT unfiltered
    out["personality"] = err(libc.personality(0x0040000))  # succeeds unfiltered
    try:
        fcntl.ioctl(0, termios.TIOCSTI, b"x")  # ENOTTY unfiltered (stdin is /dev/null)
        out["tiocsti"] = "ok"
    except OSError as e:
        out["tiocsti"] = errno.errorcode[e.errno]
    out["seccomp"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
    # honest code: NumPy, threads, fork, subprocess (glibc tries clone3 first)
    out["numpy"] = float(np.ones(4).sum())
    box = []
    t = threading.Thread(target=box.append, args=(1,))
    t.start(); t.join()
    out["thread"] = box
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out["subprocess"] = subprocess.run(["/bin/echo", "hi"], capture_output=True, text=True).stdout
    out["personality_query"] = libc.personality(0xFFFFFFFF) >= 0
    ctypes.set_errno(0)
    out["ptrace"] = err(libc.ptrace(0, 0, 0, 0))  # PTRACE_TRACEME: succeeds unfiltered (last:
    # a traced process stops at its next signal)
    return tuple(f"{k}={v!r}" for k, v in sorted(out.items()))  # each string is short
"""


@boxed
def test_denied_calls_answer_eperm_inside_and_honest_code_runs():
    rep = run_submission(
        "import numpy as np\n",
        [{"exercise": "e", "source": CALLS}],
        [{"id": 0, "exercise": "e", "func": "f", "args": [{"array": "x"}], "kwargs": {}}],
        {"x": np.ones(3)},
        Limits(call_seconds=30),
    )
    o = rep.calls[0]
    assert o.status == "ok", (o.status, o.error, o.message)
    got = {k: ast.literal_eval(v) for k, v in (s.split("=", 1) for s in o.output)}
    for name in ("ptrace", "keyctl", "unshare", "io_uring", "personality", "tiocsti"):
        assert got[name] == "EPERM", (name, got)
    assert got["seccomp"] == ["2"]
    assert got["numpy"] == 4.0 and got["thread"] == [1] and got["fork"] == 7
    assert got["subprocess"] == "hi\n" and got["personality_query"]


@boxed
@pytest.mark.parametrize("broken", [b"\x06\x00\x00\x00\x00\x00\xff\x7f", b"\x01"])
def test_the_probe_refuses_a_sandbox_without_the_filter(monkeypatch, broken):
    """An allow-all filter (bwrap applies it: Seccomp 2, but ptrace is not EPERM) and a
    program bwrap rejects: neither is a sandbox the grader uses."""
    monkeypatch.setattr(seccomp, "program", lambda arch=None: broken)
    got = probe._probe()
    assert not got["sandbox"] and "seccomp" in got["why"].lower(), got
    monkeypatch.setattr(probe, "_ISOLATION", got)
    with pytest.raises(SandboxUnavailable, match="refusing to run student code"):
        probe.require_sandbox(False)


def test_every_tmpfs_is_capped_and_only_tmp_and_box_stay_writable(monkeypatch, tmp_path):
    for gpu in ("0", "1"):
        monkeypatch.setenv("COURSE_GRADING_GPU", gpu)
        a = bwrap._bwrap_args("bwrap", str(tmp_path), Limits(), False, "root", True, 9)
        assert a[a.index("--seccomp") + 1] == "9"
        tmpfs = [i for i, x in enumerate(a) if x == "--tmpfs"]
        assert {a[i + 1] for i in tmpfs} >= {"/tmp", "/box", "/dev"}
        for i in tmpfs:  # --size N [--perms M] --tmpfs
            assert "--size" in a[max(0, i - 4) : i], a[i + 1]
        assert "--dev" not in a  # bwrap's --dev cannot be capped
        ro = {a[i + 1] for i, x in enumerate(a) if x == "--remount-ro"}
        assert {"/", "/dev"} <= ro and a[-2:] == ["--remount-ro", "/"]
        assert {a[i + 1] for i in tmpfs} - ro == {"/tmp", "/box"}


def test_gpu_children_get_the_cuda_driver_folder_without_running_ldconfig(monkeypatch, tmp_path):
    """Triton finds libcuda with `/sbin/ldconfig -p`, which exited 1 inside the sandbox on the
    H200 (Ubuntu's ldconfig is a shell wrapper): the grader looks it up outside and passes it as
    TRITON_LIBCUDA_PATH, with the folder bound read-only where /usr does not cover it."""
    lib = tmp_path / "nvidia" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.1").write_bytes(b"")
    monkeypatch.delenv("TRITON_LIBCUDA_PATH", raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{lib}")

    def no_ldconfig(*args, **kwargs):
        raise OSError("no ldconfig here")

    monkeypatch.setattr(subprocess, "run", no_ldconfig)  # the lookup falls back to the path
    assert bwrap.libcuda_dir() == str(lib)
    monkeypatch.setenv("COURSE_GRADING_GPU", "1")
    assert bwrap._child_env(True)["TRITON_LIBCUDA_PATH"] == str(lib)
    a = bwrap._bwrap_args("bwrap", str(tmp_path), Limits(), True, "root", True, 9)
    i = a.index(str(lib))
    assert a[i - 1] == "--ro-bind-try" and a[i + 1] == str(lib)
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", "/usr/lib/wsl/lib")  # the instructor's own wins
    assert bwrap.libcuda_dir() == "/usr/lib/wsl/lib"
    monkeypatch.setenv("COURSE_GRADING_GPU", "0")
    assert "TRITON_LIBCUDA_PATH" not in bwrap._child_env(True)  # CPU mode: the interpreter
