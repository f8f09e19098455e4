"""The run's cgroup (v2, or v1's memory/pids/cpu hierarchies): limits of the whole process tree,
peak memory, kill and removal; ``leftover_cgroups`` for the tests."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time

from ._common import Limits, _tag


# -- cgroups ------------------------------------------------------------------------------------
def _mountpoints() -> dict:
    """fstype or v1 controller -> mount point."""
    found = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype, _src, opts = (right.split() + ["", "", ""])[:3]
                point = left.split()[4]
                if fstype == "cgroup2":
                    found.setdefault("cgroup2", point)
                elif fstype == "cgroup":
                    for c in ("memory", "pids", "cpu"):
                        if c in opts.split(","):
                            found.setdefault(c, point)
    except OSError:
        pass
    return found


def _own_cgroup(controller: str) -> str:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if controller in ctrls.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return "/"


class Cgroup:
    """One run's cgroup(s): limits, peak memory, kill, remove. ``None`` where not writable."""

    _kind: str | None | bool = False

    def __init__(self, kind: str, dirs: dict):
        self.kind_, self.dirs = kind, dirs  # dirs: role ("v2" | "memory" | "pids" | "cpu") -> path

    @classmethod
    def kind(cls):
        if cls._kind is False:
            g = cls.create(Limits())
            cls._kind = g.kind_ if g else None
            if g:
                g.remove()
        return cls._kind

    @classmethod
    def create(cls, limits: Limits) -> Cgroup | None:
        if os.geteuid() != 0 or os.environ.get("COURSE_GRADING_NO_CGROUP") == "1":
            return None
        mounts = _mountpoints()
        name = f"course-grading-{_tag()}{secrets.token_hex(6)}"
        v2 = mounts.get("cgroup2")
        if v2 and os.path.exists(os.path.join(v2, "cgroup.controllers")):
            try:
                with open(os.path.join(v2, "cgroup.controllers")) as f:
                    have = f.read().split()
                if {"memory", "pids"} <= set(have):
                    with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                        f.write(" ".join("+" + c for c in ("memory", "pids", "cpu") if c in have))
                    d = os.path.join(v2, name)
                    os.mkdir(d)
                    g = cls("v2", {"v2": d})
                    try:
                        g._write("v2", "memory.max", limits.memory_bytes)
                        g._write("v2", "memory.swap.max", 0, optional=True)
                        g._write("v2", "pids.max", limits.nproc)
                        g._write("v2", "cpu.max", "100000 100000", optional=True)
                        return g
                    except OSError:
                        g.remove()
            except OSError:
                pass
        if "memory" in mounts and "pids" in mounts:
            dirs = {}
            try:
                for c in ("memory", "pids", "cpu"):
                    if c not in mounts:
                        continue
                    base = mounts[c]
                    own = os.path.join(base, _own_cgroup(c).lstrip("/"))
                    parent = own if os.access(own, os.W_OK) else base
                    d = os.path.join(parent, name)
                    os.mkdir(d)
                    dirs[c] = d
                g = cls("v1", dirs)
                try:
                    g._write("memory", "memory.limit_in_bytes", limits.memory_bytes)
                    g._write(
                        "memory", "memory.memsw.limit_in_bytes", limits.memory_bytes, optional=True
                    )
                    g._write("pids", "pids.max", limits.nproc)
                    if "cpu" in dirs:
                        g._write("cpu", "cpu.cfs_quota_us", 100000, optional=True)
                    return g
                except OSError:
                    g.remove()
            except OSError:
                for d in dirs.values():
                    with contextlib.suppress(OSError):
                        os.rmdir(d)
        return None

    def _write(self, role, fname, value, optional=False):
        try:
            with open(os.path.join(self.dirs[role], fname), "w") as f:
                f.write(str(value))
        except OSError:
            if not optional:
                raise

    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def peak(self) -> int | None:
        fname = (
            ("v2", "memory.peak") if self.kind_ == "v2" else ("memory", "memory.max_usage_in_bytes")
        )
        try:
            with open(os.path.join(self.dirs[fname[0]], fname[1])) as f:
                return int(f.read().strip())
        except (OSError, ValueError, KeyError):
            return None

    def _pids(self) -> list[int]:
        role = "v2" if self.kind_ == "v2" else "pids"
        try:
            with open(os.path.join(self.dirs[role], "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        if self.kind_ == "v2":
            self._write("v2", "cgroup.kill", 1, optional=True)
        for _ in range(200):
            pids = self._pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        self.kill()
        for d in self.dirs.values():
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def leftover_cgroups() -> list[str]:
    """Cgroups of this grader that still exist (tests assert there are none)."""
    out = []
    for point in set(_mountpoints().values()):
        for dirpath, dirnames, _ in os.walk(point):
            out += [os.path.join(dirpath, d) for d in dirnames if d.startswith("course-grading-")]
            dirnames[:] = [d for d in dirnames if not d.startswith("course-grading-")]
            if dirpath.count(os.sep) - point.count(os.sep) > 3:
                dirnames[:] = []
    return out
