"""The run's cgroup (v2, or v1's memory/pids/cpu hierarchies): limits of the whole process tree,
peak memory, kill and removal; ``leftover_cgroups`` for the tests.

Where a run's cgroup is made:

- **as root**: under the cgroup v2 mount's root (memory, pids and cpu enabled there), or in the
  v1 memory/pids/cpu hierarchies under the grader's own cgroup (or the hierarchy's root);
- **delegated** (any user, root too when ``COURSE_GRADING_CGROUP`` is set): in a cgroup v2
  directory the grader may write and whose ``cgroup.controllers`` offers memory and pids:
  ``COURSE_GRADING_CGROUP`` (the CLI's ``--cgroup``; ``self``: the grader's own cgroup,
  whatever else it holds), else the grader's own cgroup only when it holds nothing but the
  grader's own process tree, which is what ``systemd-run --user --scope -p Delegate=yes
  course-grade ...`` gives. cgroup v2 allows no process in a cgroup that hands controllers to
  its children, so the grader first moves the processes of that cgroup into a leaf child,
  :data:`LEAF`, then enables memory and pids (and cpu) in its ``cgroup.subtree_control``; every
  run is a sibling of the leaf. Moving processes it did not start (a desktop terminal's shell in
  the terminal's writable scope) would be a surprise, so an own cgroup that holds others is
  used only when asked for (``--cgroup self``). Where the controllers live in cgroup v1 (a
  hybrid layout), the grader's own memory and pids cgroups are used if it may write them (what
  v1 delegation gives; v1 moves no process: runs are made beside them).

:attr:`Cgroup.why_not` says why no cgroup could be made (the CLI's refusal quotes it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time

from ._common import Limits, _tag

ENV = "COURSE_GRADING_CGROUP"
SELF = "self"  # COURSE_GRADING_CGROUP=self / --cgroup self: the grader's own cgroup, asked for
NEED = ("memory", "pids")
LEAF = "course-grader"  # where a delegated grader's own processes live
PREFIX = "course-grading-"  # every run's cgroup


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
    """This process's cgroup in the hierarchy of ``controller`` ("" for cgroup v2)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if controller in ctrls.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return "/"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _put(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def delegated_base() -> tuple[str | None, str]:
    """(the cgroup v2 directory runs are made in, "") or (None, why not)."""
    v2 = _mountpoints().get("cgroup2")
    given = os.environ.get(ENV)
    if not v2:
        return None, "no cgroup v2 file system is mounted"
    if given and given != SELF:
        inside = given == v2 or given.startswith(v2.rstrip("/") + "/")
        path = given if inside else os.path.join(v2, given.lstrip("/"))
    else:
        path = os.path.join(v2, _own_cgroup("").lstrip("/")).rstrip("/")
        if os.path.basename(path) == LEAF:  # a worker of a grader that already moved
            path = os.path.dirname(path)
    who = f"uid {os.geteuid()}"
    try:
        offered = _read(os.path.join(path, "cgroup.controllers")).split()
    except OSError as e:
        return None, f"{path} is not a cgroup v2 directory ({e.strerror})"
    missing = [c for c in NEED if c not in offered]
    if missing:
        return None, (
            f"the cgroup {path} does not offer the {' and '.join(missing)} controller(s) to "
            f"its children (its cgroup.controllers: {' '.join(offered) or 'none'})"
        )
    for name in ("", "cgroup.procs", "cgroup.subtree_control"):
        if not os.access(os.path.join(path, name), os.W_OK):
            return None, f"the cgroup {path} is not delegated to {who} (cannot write it)"
    if not given:
        others = _others_in(path)
        if others:
            return None, (
                f"the grader's own cgroup {path} also holds {len(others)} process(es) it did "
                f"not start ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}), "
                f"which using it would move into a leaf {LEAF}: run the grader in a scope of "
                "its own (`systemd-run --user --scope -p Delegate=yes course-grade grade "
                f"...`), or pass --cgroup {SELF} ({ENV}={SELF}) to use this cgroup anyway"
            )
    return path, ""


def _others_in(path: str) -> list[str]:
    """The processes in the cgroup ``path`` that are neither this process nor its descendants,
    as "pid (command)"."""
    me, out = os.getpid(), []
    try:
        pids = [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return ["(cgroup.procs unreadable)"]
    for pid in pids:
        seen, p = set(), pid
        while p > 1 and p != me and p not in seen:  # up the parents: is it under this process?
            seen.add(p)
            p = _parent(p)
        if p != me:
            with contextlib.suppress(OSError):  # gone since: nothing to move
                out.append(f"{pid} ({_read(f'/proc/{pid}/comm').strip()})")
    return out


def _parent(pid: int) -> int:
    try:
        stat = _read(f"/proc/{pid}/stat")
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return 0  # gone (it was not ours to keep) or unreadable


def _prepare(base: str) -> None:
    """Let ``base`` hold the runs' cgroups: its processes moved into LEAF, controllers on."""
    enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
    if all(c in enabled for c in NEED):
        return
    procs = _read(os.path.join(base, "cgroup.procs")).split()
    if procs:
        leaf = os.path.join(base, LEAF)
        os.makedirs(leaf, exist_ok=True)
        for pid in procs:
            with contextlib.suppress(ProcessLookupError):
                _put(os.path.join(leaf, "cgroup.procs"), pid)
    _put(os.path.join(base, "cgroup.subtree_control"), " ".join("+" + c for c in NEED))
    if "cpu" in _read(os.path.join(base, "cgroup.controllers")).split():
        with contextlib.suppress(OSError):
            _put(os.path.join(base, "cgroup.subtree_control"), "+cpu")


class Cgroup:
    """One run's cgroup(s): limits, peak memory, kill, remove. ``None`` where none can be made."""

    _kind: str | None | bool = False
    why_not: str = ""

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
        if os.environ.get("COURSE_GRADING_NO_CGROUP") == "1":
            cls.why_not = "COURSE_GRADING_NO_CGROUP=1 is set"
            return None
        name = f"{PREFIX}{_tag()}{secrets.token_hex(6)}"
        mounts = _mountpoints()
        if os.geteuid() == 0 and not os.environ.get(ENV):
            v2 = mounts.get("cgroup2")
            with contextlib.suppress(OSError):
                if v2 and set(NEED) <= set(_read(os.path.join(v2, "cgroup.controllers")).split()):
                    have = _read(os.path.join(v2, "cgroup.controllers")).split()
                    _put(
                        os.path.join(v2, "cgroup.subtree_control"),
                        " ".join("+" + c for c in (*NEED, "cpu") if c in have),
                    )
                    g = cls._v2(os.path.join(v2, name), limits)
                    if g:
                        return g
            g = cls._v1(mounts, name, limits, own_only=False)
            cls.why_not = "" if g else "root, but no cgroup file system is writable"
            return g
        base, why = delegated_base()
        if base:
            try:
                _prepare(base)
                os.environ[ENV] = base  # the pool's workers make their runs' cgroups there too
                g = cls._v2(os.path.join(base, name), limits)
                if g:
                    return g
                why = f"cannot create a cgroup with limits in {base}"
            except OSError as e:
                why = f"cannot prepare the delegated cgroup {base}: {e}"
        g = cls._v1(mounts, name, limits, own_only=True)
        if g is None:
            cls.why_not = f"{why}; and no writable cgroup v1 memory and pids hierarchies"
        return g

    @classmethod
    def _v2(cls, d: str, limits: Limits) -> Cgroup | None:
        try:
            os.mkdir(d)
        except OSError:
            return None
        g = cls("v2", {"v2": d})
        try:
            g._write("v2", "memory.max", limits.memory_bytes)
            g._write("v2", "memory.swap.max", 0, optional=True)
            g._write("v2", "pids.max", limits.nproc)
            g._write("v2", "cpu.max", "100000 100000", optional=True)
            return g
        except OSError:
            g.remove()
            return None

    @classmethod
    def _v1(cls, mounts, name, limits: Limits, own_only: bool) -> Cgroup | None:
        """v1's memory and pids (and, where writable, cpu) cgroups under the grader's own
        (root: or under the hierarchy's root when its own is not writable)."""
        if not all(c in mounts for c in NEED):
            return None
        dirs = {}
        try:
            for c in (*NEED, "cpu"):
                if c not in mounts:
                    continue
                own = os.path.join(mounts[c], _own_cgroup(c).lstrip("/"))
                parent = own if os.access(own, os.W_OK) or own_only else mounts[c]
                try:
                    os.mkdir(os.path.join(parent, name))
                except OSError:
                    if c == "cpu":
                        continue  # one core's share is a nicety; memory and pids are not
                    raise
                dirs[c] = os.path.join(parent, name)
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
            _put(os.path.join(self.dirs[role], fname), value)
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
            return int(_read(os.path.join(self.dirs[fname[0]], fname[1])).strip())
        except (OSError, ValueError, KeyError):
            return None

    def _pids(self) -> list[int]:
        role = "v2" if self.kind_ == "v2" else "pids"
        try:
            return [int(x) for x in _read(os.path.join(self.dirs[role], "cgroup.procs")).split()]
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
    roots = set(_mountpoints().values())
    if os.environ.get(ENV, SELF) != SELF:
        roots.add(os.environ[ENV])
    for point in roots:
        for dirpath, dirnames, _ in os.walk(point):
            out += [os.path.join(dirpath, d) for d in dirnames if d.startswith(PREFIX)]
            dirnames[:] = [d for d in dirnames if not d.startswith(PREFIX)]
            if dirpath.count(os.sep) - point.count(os.sep) > 3:
                dirnames[:] = []
    return sorted(set(out))
