"""Rows of a simulated memory read and written as 32-bit words through the VPI, not as strings.

cocotb carries a value wider than 32 bits across the GPI as a string of
``0``/``1`` characters: for a 10 kbit ring row the string building, the
simulator's character parsing and Python's ``int`` conversion cost more
than the frame's whole protocol. The VPI also moves a value as a
``vpiVectorVal``, an array of (aval, bval) word pairs, which Verilator
copies word by word. :class:`RowMemory` calls ``vpi_get_value`` and
``vpi_put_value`` that way through :mod:`ctypes`, on the VPI functions the
simulator executable exports to cocotb's own VPI library, with the words in
a numpy array. It works only inside a running simulator (a cocotb test).
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["RowMemory"]

_VPI_VECTOR_VAL = 9  # vpi_user.h: format of s_vpi_value
_VPI_NO_DELAY = 1    # vpi_user.h: flags of vpi_put_value


class _Value(ctypes.Structure):
    """``s_vpi_value`` with the one union member used here, ``vector`` (a pointer, as wide as the union)."""

    _fields_ = [("format", ctypes.c_int32), ("vector", ctypes.c_void_p)]


def _vpi():
    lib = ctypes.CDLL(None)  # the simulator executable: its VPI functions are exported for cocotb's library
    if not hasattr(lib, "vpi_handle_by_name"):
        raise RuntimeError("the VPI is reachable only inside a running simulator (a cocotb test)")
    handle = ctypes.c_void_p
    for name, args, res in [("vpi_handle_by_name", [ctypes.c_char_p, handle], handle),
                            ("vpi_handle_by_index", [handle, ctypes.c_int32], handle),
                            ("vpi_get_value", [handle, ctypes.POINTER(_Value)], None),
                            ("vpi_put_value", [handle, ctypes.POINTER(_Value), ctypes.c_void_p, ctypes.c_int32],
                             handle)]:
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


class RowMemory:
    """The ``depth`` rows of ``bits`` bits of the memory at hierarchical ``path`` (public to the VPI).

    Raises ``LookupError`` when the simulator has no such memory or row, ``RuntimeError`` outside a simulator.
    """

    def __init__(self, path: str, depth: int, bits: int):
        self._lib = lib = _vpi()
        mem = lib.vpi_handle_by_name(path.encode(), None)
        if not mem:
            raise LookupError(f"the simulator has no memory {path!r} (is it public?)")
        self._rows = [lib.vpi_handle_by_index(mem, i) for i in range(depth)]
        if not all(self._rows):
            raise LookupError(f"memory {path!r} has fewer than {depth} rows")
        self.words = -(-bits // 32)
        self._vec = np.zeros((self.words, 2), np.uint32)  # aval, bval (0: two-state values)
        self._put = _Value(_VPI_VECTOR_VAL, self._vec.ctypes.data)
        self._get = _Value(_VPI_VECTOR_VAL, None)

    def write(self, row: int, words: np.ndarray) -> None:
        """Row ``row`` becomes ``words`` (``self.words`` of them, uint32, word 0 the low bits), at once."""
        self._vec[:, 0] = words
        self._lib.vpi_put_value(self._rows[row], ctypes.byref(self._put), None, _VPI_NO_DELAY)

    def read(self, row: int) -> np.ndarray:
        """The words of row ``row`` (uint32, word 0 the low bits), a copy."""
        self._get.format = _VPI_VECTOR_VAL
        self._lib.vpi_get_value(self._rows[row], ctypes.byref(self._get))
        # Verilator's buffer of (aval, bval) pairs lives until the next vpi_get_value.
        pairs = (ctypes.c_uint32 * (2 * self.words)).from_address(self._get.vector)
        return np.frombuffer(pairs, np.uint32)[0::2].copy()
