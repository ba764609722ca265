"""The few Linux system calls the executor needs that Python 3.11's `os`
lacks (unshare, setns, mount, pivot_root, sethostname, prctl, capset), through
ctypes on the C library. Standard library only: the executor starts as a
fresh interpreter for every task and must start fast."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from corral.domain import driver_config

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_KEEPCAPS = 8
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2

_LINUX_CAPABILITY_VERSION_3 = 0x20080522

#: pivot_root(2) has no C library wrapper: its syscall number by machine
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41}

#: capability numbers by name (the kernel may know fewer: `supported_capabilities`)
CAPABILITIES = {name: number for number, name in enumerate(driver_config.CAPABILITIES)}

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _check(result: int, what: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def unshare(flags: int) -> None:
    _check(_c().unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    """Join namespaces: of a namespace file, or (a pidfd, Linux 5.8+) the
    `nstype` namespaces of that process at once."""
    _check(_c().setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    result = _c().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(result, f"mount {source or fstype or ''} on {target}")


def umount2(target: str, flags: int) -> None:
    _check(_c().umount2(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unknown system call number on {platform.machine()}")
    _check(_c().syscall(ctypes.c_long(number), new_root.encode(), put_old.encode()), "pivot_root")


def can_pivot_root() -> bool:
    return platform.machine() in _SYS_PIVOT_ROOT


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_c().sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> int:
    return _check(
        _c().prctl(
            ctypes.c_int(option),
            ctypes.c_ulong(arg2),
            ctypes.c_ulong(arg3),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        f"prctl {option}",
    )


def supported_capabilities() -> dict[str, int]:
    """The capabilities this kernel knows (its bounding set answers for them)."""
    out = {}
    for name, number in CAPABILITIES.items():
        try:
            prctl(PR_CAPBSET_READ, number)
        except OSError:
            continue
        out[name] = number
    return out


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def capset(numbers: set[int]) -> None:
    """Effective, permitted and inheritable sets of this thread = numbers."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for n in numbers:
        word, bit = divmod(n, 32)
        data[word].effective |= 1 << bit
        data[word].permitted |= 1 << bit
        data[word].inheritable |= 1 << bit
    _check(_c().capset(ctypes.byref(header), data), "capset")
