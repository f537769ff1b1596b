"""The CPU engine's allocator setting: glibc malloc keeps what a step frees, so the next step's
multi-MB tensors reuse those pages instead of faulting in fresh ones.

Why (issue 42; 2-core AVX-512 machine, all-MiniLM-L6-v2, the STSb test sentences in steps of 2,048
tokens; docs/decisions.md): by default glibc serves a block above its mmap threshold with a fresh
``mmap`` and gives the top of its heap back to the kernel once more than its trim threshold lies
free there. Both thresholds start at 128 KiB and follow the largest mmapped block freed so far, so
a step holding many 1–12 MB tensors at once frees more than the threshold allows and the next step
faults its working set in again: 730,000 minor page faults a pass of the int8 path at 704
sentences/s against none at 1,050/s, and which one a process got depended on the order of its first
allocations. Fixed thresholds (``mallopt``) keep the heap: memory stays at the largest step's
working set (a few tens of MB more resident memory for MiniLM).

What this module does not own: torch's thread count (the server and the jobs set it), and
allocators other than glibc's (musl, macOS; jemalloc or tcmalloc preloaded by a user keep their own
settings: ``mallopt`` then changes nothing they read).
"""
from __future__ import annotations

import ctypes
import platform

# mallopt parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD_BYTES = 1 << 30  # free memory at the heap's top kept up to 1 GiB: in practice all of it
MMAP_THRESHOLD_BYTES = 32 << 20  # blocks up to 32 MiB from the heap: glibc's largest mmap threshold on 64-bit


def keep_freed_memory() -> str:
    """Set this process's glibc malloc trim threshold to 1 GiB and its mmap threshold to 32 MiB
    (``mallopt``; both process-wide, and fixed from then on instead of glibc's sliding ones).
    Returns what was done, for the engine's start-up log line. Where the C library is not glibc,
    or ``mallopt`` refuses a value, nothing changes and the reason is returned; never raises.
    Calling it again sets the same values."""
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        return f"left as is (the C library is {libc_name or 'not glibc'}; the thresholds set here are glibc's)"
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError) as e:
        return f"left as is (mallopt not found: {e})"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) != 1 or mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        return "left as is (mallopt refused the thresholds)"
    return ("glibc malloc keeps freed memory (trim threshold 1 GiB) and serves blocks up to 32 MiB from its heap "
            "(mmap threshold): a step reuses the last one's pages instead of faulting in fresh ones")
