"""A non-root instructor grading a class (issue 20): the wheel pip-installed into a venv that an
unprivileged user made from the system Python, in a folder that user owns, then ``course-grade
release`` and ``course-grade grade`` on a roster with an honest, a wrong, a fork-storm and a
memory-hog submission, run inside a cgroup delegated to that user as systemd's ``Delegate=yes``
would (emulated by root: the directory and its ``cgroup.procs``/``subtree_control``/... chowned
to the user; cgroup v2 where it has the memory and pids controllers, else the v1 memory and
pids hierarchies). The storm and the hog must not cost the honest student a point, every
sandbox must get its own cgroup there, and the tiling check must be measured. Then the same
user without a delegated cgroup: a class is refused with the message saying what to set up,
and with ``--shared-limits`` it is graded, the tiling test failing closed. The same user also
grades the class of 200 (whose even half root grades, tests/test_grading_class.py) and the
project's hostile set, and meets a cgroup of its own shared with another process (left alone
unless asked for with ``self``).

Needs root (to make the user and emulate the delegation), bubblewrap, ``useradd`` and a system
``/usr/bin/python3`` of this interpreter's version (its NumPy is copied and its torch and Triton
hard-linked, offline); skipped with the reason otherwise. Everything made (user, cgroups, folders) is removed, also on failure."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import colab_env  # noqa: E402
import hostile_set  # noqa: E402
from generate_class import misgraded, share  # noqa: E402

from course_kernels.grading.sandbox import cgroups, isolation  # noqa: E402
from course_kernels.grading.sandbox.sandbox import leftovers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("heavy_grading")]  # see ./dev

BOMB = """
import os, time
_fork = getattr(os, "fo" + "rk")
def stable_softmax(x):
    while True:  # every child holds a process slot; the parent keeps forking
        try:
            if _fork() == 0:
                time.sleep(120)
        except OSError:
            time.sleep(0.01)
"""
HOG = """
import os, time
_fork = getattr(os, "fo" + "rk")
def stable_softmax(x):
    for _ in range(5):  # 5 x 1 GiB touched, in 5 processes (each under the 4 GB rlimit)
        if _fork() == 0:
            hoard = np.ones(1 << 27)
            time.sleep(120)
    time.sleep(120)
"""


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root to make a test user and emulate cgroup delegation"
    if not isolation()["sandbox"]:
        return "needs the bubblewrap sandbox"
    if not shutil.which("useradd") or not shutil.which("userdel"):
        return "needs useradd/userdel"
    if not os.path.exists(SYSTEM_PYTHON):
        return f"needs {SYSTEM_PYTHON}"
    version = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if version != str(sys.version_info[:2]):
        return f"{SYSTEM_PYTHON} is {version}, not {sys.version_info[:2]}: NumPy cannot be copied"
    if _layout() is None:
        return "no cgroup v2 with memory and pids controllers and no v1 memory/pids hierarchies"
    return None


def _layout():
    m = cgroups._mountpoints()
    v2 = m.get("cgroup2")
    with contextlib.suppress(OSError):
        if v2 and {"memory", "pids"} <= set(cgroups._read(f"{v2}/cgroup.controllers").split()):
            return "v2"
    return "v1" if "memory" in m and "pids" in m else None


class Delegation:
    """cgroup directories made by root and handed to ``uid`` as systemd's Delegate=yes does."""

    def __init__(self, uid, gid):
        self.dirs, name = [], f"course-deleg-{secrets.token_hex(4)}"
        m = cgroups._mountpoints()
        if _layout() == "v2":
            v2 = m["cgroup2"]
            cgroups._put(f"{v2}/cgroup.subtree_control", "+memory +pids")
            self.dirs.append(os.path.join(v2, name))
            files = ("cgroup.procs", "cgroup.threads", "cgroup.subtree_control")
        else:
            for c in ("memory", "pids"):
                self.dirs.append(os.path.join(m[c], cgroups._own_cgroup(c).lstrip("/"), name))
            files = ("cgroup.procs", "tasks")
        for d in self.dirs:
            os.mkdir(d)
            for f in ("", *files):
                os.chown(os.path.join(d, f), uid, gid)

    def procs_files(self):
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def runs_seen(self, stop, seen, most):
        """Record the runs' cgroups made in the delegated one, and most at the same time."""
        while not stop.is_set():
            now = set()
            for d in self.dirs[:1]:
                with contextlib.suppress(OSError):
                    now = {n for n in os.listdir(d) if n.startswith(cgroups.PREFIX)}
            seen.update(now)
            most.append(max(len(now), most.pop() if most else 0))
            time.sleep(0.05)

    def remove(self):
        for d in self.dirs:
            subs = [os.path.join(r, n) for r, ns, _ in os.walk(d, topdown=False) for n in ns]
            for c in [*subs, d]:
                for _ in range(100):
                    with contextlib.suppress(OSError, ValueError):
                        for pid in cgroups._read(os.path.join(c, "cgroup.procs")).split():
                            os.kill(int(pid), signal.SIGKILL)
                    try:
                        os.rmdir(c)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)


def _kill_processes_of(user):
    """Every process of the test's own user, by pid."""
    import pwd

    with contextlib.suppress(KeyError):
        uid = pwd.getpwnam(user).pw_uid
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.2)


def _link_torch(site: Path) -> None:
    """torch and Triton (and what they need beyond the copied packages) for the Triton
    notebooks, as hard links to this interpreter's files (~1 s; a copy is 1.8 GB): root's files,
    mode 0644, which the user can read and not change (``/tmp`` and the venv are one file
    system here; otherwise they are copied)."""
    have = {d.metadata["Name"] for d in colab_env.closure(["numpy", "tqdm", "nbformat"])}
    for d in colab_env.closure(["torch", "triton"]):
        if d.metadata["Name"] in have:
            continue
        base = Path(str(d.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in d.files or []} - {"__pycache__", ".."}:
            src, dst = base / top, site / top
            if src.is_dir():
                shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
            elif src.exists() and not dst.exists():
                _link_or_copy(src, dst)


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def user_env(tmp_path_factory):
    why = _why_not()
    if why:
        pytest.skip(why)
    name = f"cgtest{os.getpid() % 100000}"
    subprocess.run(["useradd", "-r", "-M", "-U", "-s", "/usr/sbin/nologin", name], check=True)
    home = Path(tempfile.mkdtemp(prefix="course-nonroot-", dir="/tmp"))
    try:
        import pwd

        pw = pwd.getpwnam(name)
        uid, gid = pw.pw_uid, pw.pw_gid
        wheel = colab_env.build_wheel(tmp_path_factory.mktemp("wheel"))
        site = home / "site"  # what the grader imports, copied (the test's venv is not readable
        for d in colab_env.closure(["numpy", "tqdm", "nbformat"]):  # by other users)
            base = Path(str(d.locate_file("")))
            for top in {Path(str(f)).parts[0] for f in d.files or []} - {"__pycache__", ".."}:
                src = base / top
                if src.is_dir():
                    shutil.copytree(src, site / top, dirs_exist_ok=True, symlinks=True)
                elif src.exists():
                    site.mkdir(exist_ok=True)
                    shutil.copy2(src, site / top)
        shutil.copy(wheel, home / wheel.name)
        for src, sub in (("solutions", "c_honest"), ("exercises", "d_wrong")):
            (home / "subs" / sub).mkdir(parents=True)
            for nb in ("01_stable_softmax", "03_tiled_forward")[: 2 if sub == "c_honest" else 1]:
                shutil.copy(ROOT / src / f"{nb}.ipynb", home / "subs" / sub / f"{nb}.ipynb")
        from course_kernels.grading.runner import replace_solution

        solved = json.loads((ROOT / "solutions/01_stable_softmax.ipynb").read_text())
        for sub, code in (("a_bomb", BOMB), ("b_hog", HOG)):
            (home / "subs" / sub).mkdir()
            nb = replace_solution(solved, "stable_softmax", code)
            (home / "subs" / sub / "01_stable_softmax.ipynb").write_text(json.dumps(nb))
        (home / "roster.csv").write_text("id\na_bomb\nb_hog\nc_honest\nd_wrong\n")
        subprocess.run(["chown", "-R", f"{uid}:{gid}", str(home)], check=True)
        _link_torch(site)  # after the chown: the links are root's files
        os.chmod(home, 0o755)
        env = {"HOME": str(home), "PATH": f"{home}/venv/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        env["COURSE_GRADING_TAG"] = f"nonroot{os.getpid()}"

        def run(cmd, procs=(), timeout=300):
            def pre():
                for f in procs:  # root puts the process in the delegated cgroup, then drops
                    cgroups._put(f, os.getpid())
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)

            return subprocess.run(
                cmd, cwd=home, env=env, preexec_fn=pre, capture_output=True, text=True,
                timeout=timeout,
            )  # fmt: skip

        r = run([SYSTEM_PYTHON, "-m", "venv", str(home / "venv")])
        assert r.returncode == 0, r.stderr
        (purelib,) = (home / "venv/lib").glob("python3*/site-packages")
        (purelib / "copied.pth").write_text(f"{site}\n")
        os.chown(purelib / "copied.pth", uid, gid)
        r = run([f"{home}/venv/bin/pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir"]
                + [str(home / wheel.name)])  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        yield home, uid, gid, run
    finally:
        _kill_processes_of(name)
        shutil.rmtree(home, ignore_errors=True)
        subprocess.run(["userdel", name], check=False)


def _grade(home, *extra):
    out = f"out{secrets.token_hex(3)}"
    cmd = [f"{home}/venv/bin/course-grade", "grade", "subs", "--roster", "roster.csv"]
    cmd += ["--expect", "01,03", "--out", out, "--no-progress", "--call-seconds", "5"]
    return out, cmd + list(extra)


def _roster(home, out):
    return {r["id"]: r for r in csv.DictReader((home / out / "roster.csv").open())}


def test_a_delegated_cgroup_isolates_the_class(user_env):
    home, uid, gid, run = user_env
    r = run([f"{home}/venv/bin/course-grade", "release", "--out", "rel"])
    assert r.returncode == 0 and len(list((home / "rel").glob("*.ipynb"))) == 11, r.stderr
    deleg = Delegation(uid, gid)
    stop, seen, most = threading.Event(), set(), []
    watcher = threading.Thread(target=deleg.runs_seen, args=(stop, seen, most), daemon=True)
    watcher.start()
    try:  # 3 workers: the storm, the hog and the honest student's notebooks run side by side
        out, cmd = _grade(home, "--workers", "3")
        r = run(cmd, procs=deleg.procs_files())
        stop.set()
        watcher.join()
        assert r.returncode == 0, r.stderr[-3000:]
        rows = _roster(home, out)
        honest = rows["c_honest"]
        assert float(honest["total"]) == float(honest["max_total"]) > 0, honest
        for sid in ("a_bomb", "b_hog", "d_wrong"):
            assert float(rows[sid]["total"]) < float(rows[sid]["max_total"]), rows[sid]
        tiled = json.loads((home / out / "results/c_honest/03_tiled_forward.json").read_text())
        assert "tiled (extra memory" in json.dumps(tiled)  # measured by the run's cgroup
        assert len(seen) >= 6 and most == [3], (seen, most)  # a cgroup per sandbox
        left = [n for d in deleg.dirs for n in os.listdir(d) if n.startswith(cgroups.PREFIX)]
        assert left == [], left
    finally:
        stop.set()
        deleg.remove()


def test_without_a_delegated_cgroup_a_class_is_refused_unless_shared_limits(user_env):
    home, _, _, run = user_env
    for sid in ("a_bomb", "b_hog"):  # no fork storm under shared limits
        shutil.rmtree(home / "subs" / sid, ignore_errors=True)
    out, cmd = _grade(home, "--workers", "1")
    r = run(cmd)
    assert r.returncode == 2, r.stderr[-3000:]
    msg = " ".join(r.stderr.split())
    assert "refusing to grade 3 submissions without a cgroup per sandbox" in msg, msg
    assert "systemd-run --user --scope -p Delegate=yes course-grade grade" in msg, msg
    assert "--shared-limits" in msg and "as root" in msg, msg
    assert not (home / out).exists()
    help_text = " ".join(run([f"{home}/venv/bin/course-grade", "grade", "--help"]).stdout.split())
    assert "--shared-limits" in help_text and "fail closed" in help_text
    assert help_text.startswith("usage: course-grade grade "), help_text[:200]
    out, cmd = _grade(home, "--workers", "1", "--shared-limits")
    r = run(cmd)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((home / out / "results/c_honest/01_stable_softmax.json").read_text())
    assert res["score"] == sum(t["max_score"] for t in res["tests"]) > 0
    tiled = json.loads((home / out / "results/c_honest/03_tiled_forward.json").read_text())
    unverified = [t for t in tiled["tests"] if "cannot verify 'really tiled'" in t["output"]]
    assert unverified and all(t["score"] == 0 for t in unverified), tiled["tests"]
    assert any(t["score"] == t["max_score"] > 0 for t in tiled["tests"])


MECHANICS = """
import json, os, time
from course_kernels.grading.sandbox import cgroups
cgroups.NEED = tuple(os.environ["NEED"].split())
base, why = cgroups.delegated_base()
cgroups._prepare(base)
run = os.path.join(base, cgroups.PREFIX + "mechanics")
os.mkdir(run)
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
cgroups._put(os.path.join(run, "cgroup.procs"), pid)  # as the launcher joins its run's cgroup
inside = cgroups._read(os.path.join(run, "cgroup.procs")).split()
cgroups.Cgroup("v2", {"v2": run}).remove()
print(json.dumps({"base": base, "why": why, "me": os.getpid(), "child": pid, "inside": inside,
                  "own": cgroups._own_cgroup(""), "env": os.environ.get(cgroups.ENV),
                  "child_gone": os.waitpid(pid, os.WNOHANG)[0] == pid, "left": os.path.exists(run)}))
"""


@contextlib.contextmanager
def _v2_delegated(uid, gid):
    """A cgroup v2 directory delegated to ``uid`` with up to two controllers cgroup v2 has here
    (hugetlb on a hybrid layout, where memory and pids live in v1): yields (dir, controllers);
    removed afterwards, with every process in it."""
    v2 = cgroups._mountpoints().get("cgroup2")
    if not v2:
        pytest.skip("no cgroup v2 mounted")
    offered = cgroups._read(f"{v2}/cgroup.controllers").split()
    need = [c for c in ("memory", "pids", "hugetlb", "cpu", "io") if c in offered][:2]
    if not need:
        pytest.skip("cgroup v2 offers no controller here")
    enabled_before = cgroups._read(f"{v2}/cgroup.subtree_control").split()
    cgroups._put(f"{v2}/cgroup.subtree_control", " ".join("+" + c for c in need))
    d = os.path.join(v2, f"course-deleg-{secrets.token_hex(4)}")
    os.mkdir(d)
    try:
        for f in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
            os.chown(os.path.join(d, f), uid, gid)
        yield d, need
    finally:
        Delegation.remove(type("D", (), {"dirs": [d]})())
        for c in need:
            if c not in enabled_before:
                with contextlib.suppress(OSError):
                    cgroups._put(f"{v2}/cgroup.subtree_control", "-" + c)


def test_cgroup_v2_delegation_mechanics_as_the_user(user_env):
    """What the delegated path relies on, on this kernel's cgroup v2 as the unprivileged user:
    it moves itself out of its delegated cgroup into the leaf, enables a controller there, puts
    a process into a run's cgroup, kills and removes it. Uses a controller cgroup v2 has here
    (hugetlb on a hybrid layout, where memory and pids live in v1)."""
    home, uid, gid, run = user_env
    with _v2_delegated(uid, gid) as (d, need):
        env_need = " ".join(need)
        r = run(
            ["env", f"NEED={env_need}", f"{home}/venv/bin/python", "-c", MECHANICS],
            procs=[f"{d}/cgroup.procs"],
        )
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout)
        assert got["base"] == d and got["env"] is None, got
        assert got["own"] == "/" + os.path.basename(d) + "/" + cgroups.LEAF, got
        assert got["inside"] == [str(got["child"])] and got["child_gone"], got
        assert not got["left"]
        assert set(need) <= set(cgroups._read(f"{d}/cgroup.subtree_control").split())
        assert cgroups._read(f"{d}/cgroup.procs").split() == []  # no internal process


OWN = """
import json, os
from course_kernels.grading.sandbox import cgroups
cgroups.NEED = tuple(os.environ["NEED"].split())
base, why = cgroups.delegated_base()
if base:
    cgroups._prepare(base)
print(json.dumps({"base": base, "why": why}))
"""


def test_a_shared_own_cgroup_is_left_alone_unless_asked_for(user_env):
    """The desktop case, on this kernel as the user: the grader's own cgroup v2 is writable but
    also holds a process the grader did not start (a terminal's shell; here a ``sleep`` of the
    user). Without ``--cgroup``/``COURSE_GRADING_CGROUP`` the grader does not use it: it says
    why (naming the process and ``--cgroup self``) and moves nothing, enables nothing. With
    ``COURSE_GRADING_CGROUP=self`` it uses it: the shell is moved into the leaf."""
    home, uid, gid, run = user_env
    with _v2_delegated(uid, gid) as (d, need):

        def as_user_in_d():
            cgroups._put(f"{d}/cgroup.procs", os.getpid())
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)

        shell = subprocess.Popen(["sleep", "300"], preexec_fn=as_user_in_d)
        try:
            cmd = ["env", f"NEED={' '.join(need)}", f"{home}/venv/bin/python", "-c", OWN]
            r = run(cmd, procs=[f"{d}/cgroup.procs"])
            assert r.returncode == 0, r.stderr[-3000:]
            got = json.loads(r.stdout)
            assert got["base"] is None, got
            assert f"{shell.pid} (sleep)" in got["why"] and "--cgroup self" in got["why"], got
            assert str(shell.pid) in cgroups._read(f"{d}/cgroup.procs").split()
            assert not os.path.exists(f"{d}/{cgroups.LEAF}")
            assert not set(need) & set(cgroups._read(f"{d}/cgroup.subtree_control").split())
            r = run(["env", f"{cgroups.ENV}=self", *cmd[1:]], procs=[f"{d}/cgroup.procs"])
            assert r.returncode == 0, r.stderr[-3000:]
            assert json.loads(r.stdout) == {"base": d, "why": ""}
            leaf = f"{d}/{cgroups.LEAF}/cgroup.procs"
            assert str(shell.pid) in cgroups._read(leaf).split()
            assert cgroups._read(f"{d}/cgroup.procs").split() == []
        finally:
            shell.kill()
            shell.wait()


INSIDE = """
import json, numpy as np
from course_kernels.grading.sandbox import isolation
from course_kernels.grading.sandbox.sandbox import Limits, run_submission
CODE = '''
import ctypes, errno, os
def f():
    out = []
    for p in ("/", "/dev", "/req", "/tmp"):
        try:
            open(os.path.join(p, "x"), "w").close()
            out.append(p + ":writable")
        except OSError as e:
            out.append(p + ":" + errno.errorcode[e.errno])
    libc = ctypes.CDLL(None, use_errno=True)
    out.append("ptrace:" + ("ok" if libc.ptrace(0, 0, 0, 0) == 0 else errno.errorcode[ctypes.get_errno()]))
    st = os.statvfs("/tmp")
    out.append("tmp_mib:%d" % (st.f_blocks * st.f_frsize >> 20))
    out.append("uid:%d" % os.getuid())
    out.append("seccomp:" + [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0])
    return tuple(out)
'''
rep = run_submission("", [{"exercise": "e", "source": CODE}],
                     [{"id": 0, "exercise": "e", "func": "f", "args": [], "kwargs": {}}], {},
                     Limits(call_seconds=20))
print(json.dumps({"iso": {k: isolation()[k] for k in ("mode", "userns", "cgroup")},
                  "out": rep.calls[0].output, "status": rep.calls[0].status,
                  "error": rep.calls[0].error}))
"""


def test_the_users_sandbox_is_read_only_capped_and_filtered(user_env):
    """Without root bwrap runs in a user namespace, where its own root tmpfs would belong to
    the sandbox's nobody: it is read-only, /dev too, /tmp is capped, the filter is on."""
    home, _, _, run = user_env
    r = run([f"{home}/venv/bin/python", "-c", INSIDE])
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["iso"] == {"mode": "userns", "userns": True, "cgroup": None}, got
    assert got["status"] == "ok", got
    assert got["out"] == [
        "/:EROFS",
        "/dev:EROFS",
        "/req:EROFS",
        "/tmp:writable",
        "ptrace:EPERM",
        "tmp_mib:64",
        "uid:65534",
        "seccomp:2",
    ], got


def test_the_class_of_200_as_the_user_in_a_delegated_cgroup(user_env, class_of_200):
    """The class of 200 of tests/test_grading_class.py (the session fixture ``class_of_200``;
    root grades its even half there), all 200 graded by the user with the same command as
    root's (2 workers, 5 s per call) inside a delegated cgroup, with the same assertions: no
    false pass, no false fail
    (tests/generate_class.py's ``misgraded``), feedback for every submission, and nothing left
    behind (the grader's temporary folders, processes of the user, run cgroups); and every
    sandbox had a cgroup of its own, two at a time. The Triton notebooks run with the torch and
    Triton linked into the user's packages (``_link_torch``)."""
    home, uid, gid, run = user_env
    base = home / "class200"
    answers = share(*class_of_200, base / "class")  # all 200 (root: the even half)
    (base / "tmp").mkdir()
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(base)], check=True)
    deleg = Delegation(uid, gid)
    stop, seen, most = threading.Event(), set(), []
    watcher = threading.Thread(target=deleg.runs_seen, args=(stop, seen, most), daemon=True)
    watcher.start()
    try:
        cmd = ["env", f"TMPDIR={base / 'tmp'}", f"{home}/venv/bin/course-grade", "grade"]
        cmd += [str(base / "class"), "--out", str(base / "out"), "--workers", "2"]
        r = run([*cmd, "--call-seconds", "5", "--no-progress"], deleg.procs_files(), 900)
        stop.set()
        watcher.join()
        assert r.returncode == 0, r.stderr[-3000:]
        assert len(seen) >= len(answers) and most == [2], (len(seen), most)  # own cgroups
        time.sleep(0.2)
        assert _processes_of(uid) == []
        left = [n for d in deleg.dirs for n in os.listdir(d) if n.startswith(cgroups.PREFIX)]
        assert left == [] and leftovers(f"nonroot{os.getpid()}") == {
            "processes": [],
            "cgroups": [],
        }, left
    finally:
        stop.set()
        deleg.remove()
    assert list((base / "tmp").iterdir()) == [], "temporary folders of the grader were left"
    rows = {r["submission"]: r for r in csv.DictReader((base / "out/gradebook.csv").open())}
    assert set(rows) == set(answers)
    wrong = misgraded(rows, answers)
    assert not wrong, wrong
    assert all((base / "out/feedback" / f"{sid}.txt").stat().st_size > 0 for sid in answers)


# The hostile set as the user: every attack (the Triton ones with the linked torch) and the
# honest controls.
HOSTILE = hostile_set.FIXTURES


def _owned_by(uid, folder):
    """Entries of ``folder`` (not recursive) that belong to ``uid``."""
    return sorted(n for n in os.listdir(folder) if os.lstat(os.path.join(folder, n)).st_uid == uid)


def _processes_of(uid):
    return [p for p in filter(str.isdigit, os.listdir("/proc")) if _uid_of(p) == uid]


def _uid_of(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _exercise_scores(results):
    """{exercise: (earned, maximum)} from a results JSON (test names are "exercise: test")."""
    out: dict = {}
    for t in results["tests"]:
        ex = t["name"].split(":", 1)[0]
        got, most = out.get(ex, (0.0, 0.0))
        out[ex] = (got + t["score"], most + t["max_score"])
    return out


def test_the_hostile_set_as_the_user_in_a_delegated_cgroup(user_env):
    """The project's hostile set (tests/adversarial, built as tests/test_grading_adversarial.py
    builds it: tests/hostile_set.py) graded by the user in one ``course-grade grade`` of a roster,
    one student per fixture, with the honest controls as students, 2 workers, 5 s per call,
    inside a delegated cgroup: there the sandbox (user namespace) and a cgroup per sandbox both
    hold, so the attacks the root test runs only with them (NEEDS_NAMESPACES, a10's fork bomb)
    run here too, each sandbox in a cgroup of its own (counted: two at a time). Every attack
    earns less than the maximum of the exercise it attacks and the rest of its notebook keeps
    every point, the controls get full marks, every student gets feedback, and afterwards
    nothing of the user runs, no run cgroup is left, and no file outside the user's folders
    (nor the grader's own installed files in them) changed.

    ``{repo}`` (where a12, a18, a20 and a30 look for the repository) is ``repo`` in the user's
    folder: a root-owned folder that the user can read, holding a copy of ``solutions/`` and a
    link ``course_kernels`` to the package installed in the user's venv (what this grader reads
    its hidden tests and feedback code from, and the user may write): the checkout itself may
    not be readable by the user, and these are what an unsandboxed submission of this grader
    could read or rewrite. A root-owned ``/tmp/grade-*`` folder holding a solved notebook is the
    "other grader's temp dir" a30 looks for.

    The attacks on Triton notebooks (a24, a26, a27, a28) run with the torch and Triton linked
    into the user's packages (``_link_torch``), as the class of 200's Triton notebooks do."""
    home, uid, gid, run = user_env
    base = home / "hostile"
    (purelib,) = (home / "venv/lib").glob("python3*/site-packages")
    repo = base / "repo"
    students = {f.stem: f for f in HOSTILE + hostile_set.HONEST}
    for sid, fixture in students.items():
        sub = base / "subs" / sid
        sub.mkdir(parents=True)
        nb = hostile_set.header(fixture)["notebook"]
        (sub / f"{nb}.ipynb").write_text(json.dumps(hostile_set.injected(fixture, sub, repo)))
    (base / "roster.csv").write_text("id\n" + "".join(f"{sid}\n" for sid in students))
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(base)], check=True)
    shutil.copytree(ROOT / "solutions", repo / "solutions")  # root's, readable by the user
    (repo / "course_kernels").symlink_to(purelib / "course_kernels")
    probe = Path(tempfile.mkdtemp(prefix="grade-probe-", dir="/tmp"))
    shutil.copy(ROOT / "solutions/01_stable_softmax.ipynb", probe / "01_stable_softmax.ipynb")
    for d in (probe, repo, repo / "solutions"):
        os.chmod(d, 0o755)
    guarded = [
        *(str(ROOT / p) for p in hostile_set.PROTECTED),  # the checkout's (a12's targets)
        *(str(purelib / p) for p in hostile_set.PROTECTED),  # the user's installed grader's
        str(repo / "solutions/01_stable_softmax.ipynb"),
        str(probe / "01_stable_softmax.ipynb"),
    ]
    before = hostile_set.digest(guarded)
    in_tmp, in_shm = _owned_by(uid, "/tmp"), _owned_by(uid, "/dev/shm")  # its home is in /tmp
    deleg = Delegation(uid, gid)
    stop, seen, most = threading.Event(), set(), []
    watcher = threading.Thread(target=deleg.runs_seen, args=(stop, seen, most), daemon=True)
    watcher.start()
    try:
        out = "out"
        cmd = [f"{home}/venv/bin/course-grade", "grade", "hostile/subs", "--roster"]
        cmd += ["hostile/roster.csv", "--out", out, "--no-progress", "--workers", "2"]
        t0 = time.monotonic()
        r = run([*cmd, "--call-seconds", "5"], procs=deleg.procs_files(), timeout=400)
        took = time.monotonic() - t0
        stop.set()
        watcher.join()
        assert r.returncode == 0, r.stderr[-3000:]
        assert len(seen) >= len(students) and most == [2], (len(seen), most)  # own cgroups
        time.sleep(0.2)
        assert _processes_of(uid) == [] and hostile_set.sleepers() == []
        left = [n for d in deleg.dirs for n in os.listdir(d) if n.startswith(cgroups.PREFIX)]
        tag = f"nonroot{os.getpid()}"
        assert left == [] and leftovers(tag) == {"processes": [], "cgroups": []}, left
        assert hostile_set.digest(guarded) == before, "a submission changed a file outside it"
    finally:
        stop.set()
        deleg.remove()
        shutil.rmtree(probe, ignore_errors=True)
    assert _owned_by(uid, "/tmp") == in_tmp and _owned_by(uid, "/dev/shm") == in_shm
    assert not os.path.exists("/dev/course-attack-file")
    book = {r["submission"]: r for r in csv.DictReader((home / out / "gradebook.csv").open())}
    assert len(book) == len(students), sorted(book)
    wrong, report = [], {}
    for sid, fixture in students.items():
        meta = hostile_set.header(fixture)
        key = f"{sid}/{meta['notebook']}"
        feedback = home / out / "feedback" / sid / f"{meta['notebook']}.txt"
        assert feedback.stat().st_size > 0, sid
        scores = _exercise_scores(json.loads((home / out / f"results/{key}.json").read_text()))
        got, most = scores[meta["exercise"]]
        assert float(book[key][meta["exercise"]]) == pytest.approx(got), (sid, book[key])
        report[sid] = f"{got:g}/{most:g}"
        others = {ex: s for ex, s in scores.items() if ex != meta["exercise"] and s[0] < s[1]}
        if sid in (f.stem for f in hostile_set.HONEST):
            assert most > 0 and got == most and not others, (sid, scores)
        elif got >= most or others:
            wrong.append((sid, scores))
    assert wrong == [], wrong
    print(f"{len(students)} students in {took:.0f} s: {report}")
