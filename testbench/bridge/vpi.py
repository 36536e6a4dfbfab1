"""Rows of a simulated memory read and written as raw bytes through the VPI, several rows a call.

cocotb carries a value wider than 32 bits across the GPI as a string of
``0``/``1`` characters: for a 10 kbit ring row the string building, the
simulator's character parsing and Python's ``int`` conversion cost more
than the frame's whole protocol. The VPI also moves a memory's rows as an
array: ``vpi_get_value_array`` / ``vpi_put_value_array`` with the format
``vpiRawTwoStateVal`` copy consecutive rows (wrapping at the end of the
memory) as their bytes, low byte first, in one call. :class:`RowMemory`
calls them through :mod:`ctypes`, on the VPI functions the simulator
executable exports to cocotb's own VPI library, with the bytes in a numpy
array. Row by row as ``vpiVectorVal`` words, Verilator works out every
word's place in the row anew: about 20 us a row at W = 512, against a few
for the byte copy. It works only inside a running simulator (a cocotb test).
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["RowMemory"]

_VPI_RAW_TWO_STATE_VAL = 17  # vpi_user.h: format of s_vpi_arrayvalue
_VPI_SIZE = 4                # vpi_user.h: property, the rows of a memory
_VPI_INT_VAL = 6             # vpi_user.h: format of s_vpi_value
_VPI_LEFT_RANGE, _VPI_RIGHT_RANGE = 79, 83  # vpi_user.h: relations of vpi_handle


class _Value(ctypes.Structure):
    """``s_vpi_value`` with the one union member used here, ``vector`` (a pointer, as wide as the union)."""

    _fields_ = [("format", ctypes.c_int32), ("vector", ctypes.c_void_p)]


class _ArrayValue(ctypes.Structure):
    """``s_vpi_arrayvalue`` with the one union member used here, ``rawvals`` (a pointer, as wide as the union)."""

    _fields_ = [("format", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("rawvals", ctypes.c_void_p)]


def _vpi():
    lib = ctypes.CDLL(None)  # the simulator executable: its VPI functions are exported for cocotb's library
    if not hasattr(lib, "vpi_handle_by_name"):
        raise RuntimeError("the VPI is reachable only inside a running simulator (a cocotb test)")
    handle = ctypes.c_void_p
    array = [handle, ctypes.POINTER(_ArrayValue), ctypes.POINTER(ctypes.c_int32), ctypes.c_uint32]
    for name, args, res in [("vpi_handle_by_name", [ctypes.c_char_p, handle], handle),
                            ("vpi_get", [ctypes.c_int32, handle], ctypes.c_int32),
                            ("vpi_handle", [ctypes.c_int32, handle], handle),
                            ("vpi_get_value", [handle, ctypes.POINTER(_Value)], None),
                            ("vpi_get_value_array", array, None),
                            ("vpi_put_value_array", array, None)]:
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


class RowMemory:
    """The ``depth`` rows of ``bits`` bits of the memory at hierarchical ``path`` (public to the VPI).

    Raises ``LookupError`` when the simulator has no such memory or its rows differ, ``RuntimeError``
    outside a simulator.
    """

    def __init__(self, path: str, depth: int, bits: int):
        self._lib = lib = _vpi()
        self._mem = lib.vpi_handle_by_name(path.encode(), None)
        if not self._mem:
            raise LookupError(f"the simulator has no memory {path!r} (is it public?)")
        if lib.vpi_get(_VPI_SIZE, self._mem) != depth:
            raise LookupError(f"memory {path!r} does not have {depth} rows")
        self.depth, self.row_bytes = depth, -(-bits // 8)
        self._value = _ArrayValue(_VPI_RAW_TWO_STATE_VAL, 0, None)
        self._index = ctypes.c_int32(0)
        self._reversed = self._reversed_rows()

    def _bound(self, which: int) -> int:
        const = self._lib.vpi_handle(which, self._mem)
        value = _Value(_VPI_INT_VAL, None)
        self._lib.vpi_get_value(const, ctypes.byref(value))
        return ctypes.c_int32(value.vector or 0).value  # the union's int sits in its low bytes

    def _reversed_rows(self) -> bool:
        """Whether array element ``i`` is row ``depth - 1 - i``: the array functions count elements from the
        left index of the declaration, which for ``[depth-1:0]`` (as Amaranth writes memories) is the last row."""
        return self._bound(_VPI_LEFT_RANGE) > self._bound(_VPI_RIGHT_RANGE)

    def _transfer(self, f, element: int, n: int) -> "np.ndarray | None":
        self._index.value = element
        f(self._mem, ctypes.byref(self._value), ctypes.byref(self._index), n)
        if f is self._lib.vpi_get_value_array:
            # Verilator's buffer lives until the next array access.
            raw = (ctypes.c_uint8 * (n * self.row_bytes)).from_address(self._value.rawvals)
            return np.frombuffer(raw, np.uint8).reshape(n, self.row_bytes).copy()
        return None

    def _element(self, first: int, n: int) -> int:
        if not 0 < n <= self.depth:
            raise ValueError(f"a transfer moves 1 to {self.depth} rows, not {n}")
        return (self.depth - first - n) % self.depth if self._reversed else first % self.depth

    def write(self, first: int, rows: np.ndarray) -> None:
        """Rows ``first``, ``first + 1``, ... (modulo the depth) become ``rows`` (uint8, C-contiguous, one row
        of ``row_bytes`` each, byte 0 the low bits), in one call."""
        assert rows.dtype == np.uint8 and rows.flags.c_contiguous and rows.size % self.row_bytes == 0
        n = rows.size // self.row_bytes
        element = self._element(first, n)
        if self._reversed:
            rows = np.ascontiguousarray(rows.reshape(n, self.row_bytes)[::-1])
        self._value.rawvals = rows.ctypes.data
        self._transfer(self._lib.vpi_put_value_array, element, n)

    def read(self, first: int, n: int) -> np.ndarray:
        """Rows ``first`` to ``first + n - 1`` (modulo the depth) as a uint8 array of shape (n, row_bytes), a copy."""
        rows = self._transfer(self._lib.vpi_get_value_array, self._element(first, n), n)
        return rows[::-1] if self._reversed else rows
