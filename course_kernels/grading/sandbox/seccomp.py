"""The seccomp filter of the sandbox: a classic-BPF program, assembled here in pure Python, that
bubblewrap installs (``bwrap --seccomp FD``) just before it starts the sandboxed command.

What it denies is modelled on two published profiles, and each entry below says which:

- Flatpak's ``flatpak-run.c``, ``setup_seccomp`` (``syscall_blocklist`` and
  ``syscall_nondevel_blocklist``): https://github.com/flatpak/flatpak/blob/main/common/flatpak-run.c
- Docker's default profile (an allowlist; the calls it leaves out, or allows only with a
  capability the sandbox never has, count as denied): https://github.com/moby/profiles/blob/main/
  seccomp/default.json and the table "Significant syscalls blocked by the default profile" of
  https://docs.docker.com/engine/security/seccomp/

Everything else is allowed: the filter is a deny list, so NumPy, Triton's interpreter, threads,
``fork``/``subprocess`` and CUDA (``ioctl`` on ``/dev/nvidia*``, ``mmap``) run as before. Decisions:

- ``clone3`` returns ENOSYS, not EPERM (Flatpak; CVE-2021-41133): seccomp cannot read
  ``clone3``'s flags (they are behind a pointer), and glibc >= 2.34 falls back to ``clone`` on
  ENOSYS only, so ``subprocess``, ``os.fork`` and threads keep working. ``clone`` itself is
  denied only with a namespace flag (Docker's mask; Flatpak checks CLONE_NEWUSER alone).
- The new mount API (``open_tree``, ``fsopen``, ...) returns ENOSYS (Flatpak).
- ``ioctl`` is denied only for TIOCSTI and TIOCLINUX (Flatpak; CVE-2017-5226, CVE-2023-28100),
  compared on the low 32 bits as the kernel does.
- ``personality`` is allowed only with Docker's values (0, PER_LINUX32, UNAME26, both, and the
  query 0xffffffff); ADDR_NO_RANDOMIZE and the rest are EPERM (Flatpak: PER_LINUX only).
- The NUMA calls (``mbind``, ``get/set_mempolicy``, ``move_pages``, ``migrate_pages``) are EPERM
  as in both profiles; CUDA runs under Docker's default profile, which denies them too.
- ``kcmp``, ``pidfd_getfd`` and ``process_madvise`` act on another process like ``ptrace``
  (Docker: CAP_SYS_PTRACE only); ``modify_ldt`` serves 16-bit code only; ``fanotify_init``
  (Docker: CAP_SYS_ADMIN).
- A call of another ABI is never looked up in the wrong table: a foreign ``seccomp_data.arch``
  (e.g. i386's ``int 0x80`` from an x86_64 process) kills the process, and x86_64's x32 calls
  (``nr >= 0x40000000``) return ENOSYS.

Only x86_64 and aarch64 have tables here; on any other machine :func:`program` raises
:class:`SeccompUnsupported` and the grader refuses to start the sandbox.
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000

RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

# classic BPF opcodes (linux/bpf_common.h)
LD_W_ABS = 0x20  # A = u32 at seccomp_data[k]
JEQ = 0x15  # pc += (A == k) ? jt : jf
JGE = 0x35
JSET = 0x45  # pc += (A & k) ? jt : jf
RET = 0x06

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian)
OFF_NR, OFF_ARCH = 0, 4


def arg_low(i: int) -> int:
    """Offset of the low 32 bits of argument ``i``."""
    return 16 + 8 * i


# (name, errno, source): the plain deny list
DENY = [
    # other processes, their memory and their descriptors
    ("ptrace", errno.EPERM, "Flatpak, Docker"),
    ("process_vm_readv", errno.EPERM, "Docker"),
    ("process_vm_writev", errno.EPERM, "Docker"),
    ("kcmp", errno.EPERM, "Docker"),
    ("pidfd_getfd", errno.EPERM, "Docker"),
    ("process_madvise", errno.EPERM, "Docker"),
    # the kernel keyring
    ("add_key", errno.EPERM, "Flatpak, Docker"),
    ("keyctl", errno.EPERM, "Flatpak, Docker"),
    ("request_key", errno.EPERM, "Flatpak, Docker"),
    # kernel attack surface with a long CVE record
    ("bpf", errno.EPERM, "Docker"),
    ("perf_event_open", errno.EPERM, "Flatpak, Docker"),
    ("userfaultfd", errno.EPERM, "Docker"),
    ("io_uring_setup", errno.EPERM, "Docker"),
    ("io_uring_enter", errno.EPERM, "Docker"),
    ("io_uring_register", errno.EPERM, "Docker"),
    ("fanotify_init", errno.EPERM, "Docker"),
    ("modify_ldt", errno.EPERM, "this grader: 16-bit code only"),
    # namespaces, mounts, the root
    ("unshare", errno.EPERM, "Flatpak, Docker"),
    ("setns", errno.EPERM, "Flatpak, Docker"),
    ("mount", errno.EPERM, "Flatpak, Docker"),
    ("umount2", errno.EPERM, "Flatpak, Docker"),
    ("pivot_root", errno.EPERM, "Flatpak, Docker"),
    ("chroot", errno.EPERM, "Flatpak"),
    ("open_tree", errno.ENOSYS, "Flatpak"),
    ("move_mount", errno.ENOSYS, "Flatpak"),
    ("fsopen", errno.ENOSYS, "Flatpak"),
    ("fsconfig", errno.ENOSYS, "Flatpak"),
    ("fsmount", errno.ENOSYS, "Flatpak"),
    ("fspick", errno.ENOSYS, "Flatpak"),
    ("mount_setattr", errno.ENOSYS, "Flatpak"),
    ("open_tree_attr", errno.ENOSYS, "Flatpak's open_tree, extended to Linux 6.15's variant"),
    ("clone3", errno.ENOSYS, "Flatpak, Docker: glibc then falls back to clone"),
    ("open_by_handle_at", errno.EPERM, "Docker"),
    ("name_to_handle_at", errno.EPERM, "Docker"),
    # the machine: swap, reboot, modules, accounting, clocks, quotas, the console, I/O ports
    ("swapon", errno.EPERM, "Docker"),
    ("swapoff", errno.EPERM, "Docker"),
    ("reboot", errno.EPERM, "Docker"),
    ("kexec_load", errno.EPERM, "Docker"),
    ("kexec_file_load", errno.EPERM, "Docker"),
    ("init_module", errno.EPERM, "Docker"),
    ("finit_module", errno.EPERM, "Docker"),
    ("delete_module", errno.EPERM, "Docker"),
    ("acct", errno.EPERM, "Flatpak, Docker"),
    ("settimeofday", errno.EPERM, "Docker"),
    ("clock_settime", errno.EPERM, "Docker"),
    ("clock_adjtime", errno.EPERM, "Docker"),
    ("adjtimex", errno.EPERM, "Docker"),
    ("quotactl", errno.EPERM, "Flatpak, Docker"),
    ("quotactl_fd", errno.EPERM, "Docker"),
    ("nfsservctl", errno.EPERM, "Docker"),
    ("vhangup", errno.EPERM, "Docker"),
    ("syslog", errno.EPERM, "Flatpak, Docker"),
    ("iopl", errno.EPERM, "Docker"),
    ("ioperm", errno.EPERM, "Docker"),
    ("lookup_dcookie", errno.EPERM, "Docker"),
    ("uselib", errno.EPERM, "Flatpak, Docker"),
    ("sysfs", errno.EPERM, "Docker"),
    ("ustat", errno.EPERM, "Docker"),
    ("_sysctl", errno.EPERM, "Docker"),
    ("create_module", errno.EPERM, "Docker"),
    ("get_kernel_syms", errno.EPERM, "Docker"),
    ("query_module", errno.EPERM, "Docker"),
    # NUMA placement of memory (of this process or, with migrate_pages, of another)
    ("mbind", errno.EPERM, "Flatpak, Docker (CAP_SYS_NICE)"),
    ("get_mempolicy", errno.EPERM, "Flatpak, Docker (CAP_SYS_NICE)"),
    ("set_mempolicy", errno.EPERM, "Flatpak, Docker (CAP_SYS_NICE)"),
    ("set_mempolicy_home_node", errno.EPERM, "Docker (CAP_SYS_NICE)"),
    ("move_pages", errno.EPERM, "Flatpak, Docker (CAP_SYS_NICE)"),
    ("migrate_pages", errno.EPERM, "Flatpak, Docker (CAP_SYS_NICE)"),
]

# clone(flags, ...): a new namespace of any kind (Docker's mask)
CLONE_NAMESPACES = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # Docker's allowed values

# Syscall numbers (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h). Calls that an
# architecture does not have are absent; tests/test_grading_seccomp.py checks them against the
# kernel headers where those are installed.
_COMMON_NEW = {  # numbered alike on every architecture since Linux 5.1
    "pidfd_getfd": 438, "process_madvise": 440, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "clone3": 435, "mount_setattr": 442, "quotactl_fd": 443,
    "set_mempolicy_home_node": 450, "open_tree_attr": 467,
}  # fmt: skip
NR = {
    "x86_64": {
        **_COMMON_NEW,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "add_key": 248, "keyctl": 250, "request_key": 249, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "fanotify_init": 300, "modify_ldt": 154, "unshare": 272,
        "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "swapon": 167, "swapoff": 168,
        "reboot": 169, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "acct": 163, "settimeofday": 164,
        "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "quotactl": 179,
        "nfsservctl": 180, "vhangup": 153, "syslog": 103, "iopl": 172, "ioperm": 173,
        "lookup_dcookie": 212, "uselib": 134, "sysfs": 139, "ustat": 136, "_sysctl": 156,
        "create_module": 174, "get_kernel_syms": 177, "query_module": 178, "mbind": 237,
        "get_mempolicy": 239, "set_mempolicy": 238, "move_pages": 279, "migrate_pages": 256,
        "clone": 56, "ioctl": 16, "personality": 135,
    },
    "aarch64": {
        **_COMMON_NEW,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "add_key": 217, "keyctl": 219, "request_key": 218, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "fanotify_init": 262, "unshare": 97, "setns": 268, "mount": 40,
        "umount2": 39, "pivot_root": 41, "chroot": 51, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "swapon": 224, "swapoff": 225, "reboot": 142,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "acct": 89, "settimeofday": 170, "clock_settime": 112,
        "clock_adjtime": 266, "adjtimex": 171, "quotactl": 60, "nfsservctl": 42, "vhangup": 58,
        "syslog": 116, "lookup_dcookie": 18, "mbind": 235, "get_mempolicy": 236,
        "set_mempolicy": 237, "move_pages": 239, "migrate_pages": 238,
        "clone": 220, "ioctl": 29, "personality": 92,
    },
}  # fmt: skip


class SeccompUnsupported(RuntimeError):
    """No syscall table for this machine's architecture."""


def machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def instructions(arch: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) tuples, jumps already relative."""
    arch = arch or machine()
    if arch not in NR:
        raise SeccompUnsupported(
            f"the sandbox's seccomp filter has syscall tables for {' and '.join(NR)} only, "
            f"and this machine is {arch!r}: the grader will not run student code without it"
        )
    nr = NR[arch]
    prog: list = [
        (LD_W_ABS, 0, 0, OFF_ARCH),
        (JEQ, 1, 0, AUDIT_ARCH[arch]),
        (RET, 0, 0, RET_KILL_PROCESS),  # another ABI's numbers: never look them up here
        (LD_W_ABS, 0, 0, OFF_NR),
    ]
    if arch == "x86_64":
        prog += [(JGE, 0, 1, X32_BIT), (RET, 0, 0, RET_ERRNO | errno.ENOSYS)]
    for name, err, _source in DENY:
        if name in nr:
            prog += [(JEQ, 0, 1, nr[name]), (RET, 0, 0, RET_ERRNO | err)]
    eperm = (RET, 0, 0, RET_ERRNO | errno.EPERM)
    allow = (RET, 0, 0, RET_ALLOW)
    # clone: EPERM when a namespace flag is set (flags: the low word of argument 0)
    prog += [(JEQ, 0, 4, nr["clone"]), (LD_W_ABS, 0, 0, arg_low(0))]
    prog += [(JSET, 0, 1, CLONE_NAMESPACES), eperm, allow]
    # ioctl: EPERM for TIOCSTI and TIOCLINUX (the request: the low word of argument 1)
    prog += [(JEQ, 0, 5, nr["ioctl"]), (LD_W_ABS, 0, 0, arg_low(1))]
    prog += [(JEQ, 1, 0, TIOCSTI), (JEQ, 0, 1, TIOCLINUX), eperm, allow]
    # personality: only the values Docker allows
    n = len(PERSONALITIES)
    prog += [(JEQ, 0, n + 3, nr["personality"]), (LD_W_ABS, 0, 0, arg_low(0))]
    prog += [(JEQ, n - i, 0, value) for i, value in enumerate(PERSONALITIES)]
    prog += [eperm, allow]
    prog.append(allow)
    return prog


def program(arch: str | None = None) -> bytes:
    """The filter as ``struct sock_filter[]`` bytes, what ``bwrap --seccomp FD`` reads."""
    out = b""
    for code, jt, jf, k in instructions(arch):
        assert 0 <= jt <= 255 and 0 <= jf <= 255
        out += struct.pack("<HBBI", code, jt, jf, k)
    return out


# What the start-up probe runs inside the sandbox (it prints "seccomp <Seccomp> <ok>"): the
# filter is active (mode 2) and ptrace, keyctl and unshare answer EPERM, whatever they would do
# unfiltered (PTRACE_TRACEME succeeds without the filter).
PROBE = """
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
mode = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
nrs = {"x86_64": (101, 250, 272), "aarch64": (117, 219, 97)}.get(platform.machine(), ())
errs = []
for nr, args in zip(nrs, ((0, 0, 0, 0), (0, -3, 0), (0x10000000,))):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    errs.append(ctypes.get_errno() if r == -1 else 0)
print("seccomp", (mode or ["?"])[0], int(len(errs) == 3 and set(errs) == {errno.EPERM}))
"""
