"""What the tests read from a kernel library einopt linked (einopt's own code never needs it)."""

from __future__ import annotations

import ctypes
from pathlib import Path


def exported_alignment(library: bytes, folder: Path) -> int:
    """The buffer alignment (bytes) the library says its kernels assume (``einopt_buffer_alignment``)."""
    path = folder / "kernels.so"
    path.write_bytes(library)
    return ctypes.c_int32.in_dll(ctypes.CDLL(str(path)), "einopt_buffer_alignment").value
