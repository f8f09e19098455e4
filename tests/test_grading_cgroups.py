"""Which cgroup a non-root grader makes its runs' cgroups in (``cgroups.delegated_base``), on a
fake cgroup v2 tree: the grader's own cgroup is used by itself only when it holds nothing but the
grader's own process tree (what ``systemd-run --user --scope -p Delegate=yes course-grade ...``
gives); one shared with other processes (a desktop terminal's scope) is refused, nothing moved,
unless asked for with ``--cgroup self`` or a path. The kernel's side of it (moving processes into
the leaf, enabling controllers, as an unprivileged user) is tests/test_grading_nonroot.py's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from course_kernels.grading.instructor import cli
from course_kernels.grading.sandbox import cgroups

SCOPE = "/user.slice/user-1000.slice/user@1000.service/app.slice/vte-spawn-1.scope"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A cgroup v2 mount in tmp_path with the grader in SCOPE; returns (mount, scope dir, own)."""
    mount = tmp_path / "cgroup2"
    scope = mount / SCOPE.lstrip("/")
    scope.mkdir(parents=True)
    (scope / "cgroup.controllers").write_text("cpu memory pids\n")
    (scope / "cgroup.subtree_control").write_text("")
    (scope / "cgroup.procs").write_text(f"{os.getpid()}\n")
    own = {"path": SCOPE}
    monkeypatch.setattr(cgroups, "_mountpoints", lambda: {"cgroup2": str(mount)})
    monkeypatch.setattr(cgroups, "_own_cgroup", lambda controller: own["path"])
    monkeypatch.delenv(cgroups.ENV, raising=False)
    return mount, scope, own


def _procs(scope, *pids):
    (scope / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


def test_the_own_cgroup_holding_only_the_grader_is_used(tree):
    _, scope, _ = tree
    assert cgroups.delegated_base() == (str(scope), "")


def test_the_own_cgroup_holding_the_graders_children_is_used(tree):
    _, scope, _ = tree
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _procs(scope, os.getpid(), child.pid)
        assert cgroups.delegated_base() == (str(scope), "")
    finally:
        child.kill()
        child.wait()


def test_an_own_cgroup_shared_with_other_processes_is_refused_and_nothing_moves(tree, monkeypatch):
    """The desktop case: the terminal's shell (here this process's parent, not under the
    grader) shares the grader's writable cgroup. Using it would move the shell into a leaf."""
    _, scope, _ = tree
    _procs(scope, os.getppid(), os.getpid())
    base, why = cgroups.delegated_base()
    assert base is None
    assert f"{os.getppid()} (" in why and "--cgroup self" in why, why
    assert "systemd-run --user --scope -p Delegate=yes" in why, why
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 1000)  # the non-root path of create()
    assert cgroups.Cgroup.create(cgroups.Limits()) is None
    assert why in cgroups.Cgroup.why_not
    assert sorted(p.name for p in scope.iterdir()) == [
        "cgroup.controllers",
        "cgroup.procs",
        "cgroup.subtree_control",
    ], "a cgroup was made or a leaf prepared"
    assert (scope / "cgroup.procs").read_text() == f"{os.getppid()}\n{os.getpid()}\n"
    assert (scope / "cgroup.subtree_control").read_text() == ""


@pytest.mark.parametrize("setting", ["self", "path"])
def test_asked_for_the_shared_cgroup_is_used_and_prepared(tree, monkeypatch, setting):
    _, scope, _ = tree
    _procs(scope, os.getppid(), os.getpid())
    monkeypatch.setenv(cgroups.ENV, "self" if setting == "self" else str(scope))
    assert cgroups.delegated_base() == (str(scope), "")
    cgroups._prepare(str(scope))  # moves the processes: each pid written to the leaf's file
    assert (scope / cgroups.LEAF / "cgroup.procs").read_text() == str(os.getpid())


def test_a_grader_already_in_its_leaf_uses_the_cgroup_above(tree):
    """A pool worker, or a grader started from a shell a ``--cgroup self`` run moved there."""
    _, scope, own = tree
    (scope / cgroups.LEAF).mkdir()
    _procs(scope)  # every process is in the leaf
    own["path"] = f"{SCOPE}/{cgroups.LEAF}"
    assert cgroups.delegated_base() == (str(scope), "")


def test_the_cli_passes_self_as_self_and_paths_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.cgroup_setting("self") == cgroups.SELF == "self"
    assert cli.cgroup_setting("mine") == str(tmp_path / "mine")


def test_the_help_says_when_the_own_cgroup_is_used(capsys):
    with pytest.raises(SystemExit):
        cli.main(["grade", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--cgroup DIR|self" in text
    assert "holds no process but the grader's" in text and "never a cgroup shared" in text
