"""An exact sum of int32 vectors through the switch (sans-IO), for data that must not be quantized.

:class:`ExactSum` is :class:`~inagg.host.worker.AllReduce` with the int32
lanes sent as they are: the same agreement round (which checks that every
rank passed the same length), then the data. Sums of int32 tensors use it,
and so do broadcasts and gathers of any data, as the bit patterns of the
owning rank added to zeros from the others: ``x + 0`` never overflows, so
the result is the owner's bytes exactly.
"""

from __future__ import annotations

import numpy as np

from inagg.host.worker import AllReduce, ProtocolError, padded_rows

__all__ = ["ExactSum", "SumOverflowError"]


class SumOverflowError(ProtocolError, OverflowError):
    """An exact int32 sum left the int32 range: the switch promoted (or saturated) a lane."""


class ExactSum(AllReduce):
    """The element-wise int32 sum of every rank's int32 vector; :meth:`result` is int32.

    A sum outside the int32 range raises :class:`SumOverflowError` on every
    rank alike (they all see the same promoted or saturated results), rather
    than a rounded or clipped sum.
    """

    dtype = np.dtype(np.int32)

    def _data_lanes(self) -> np.ndarray:
        w = self.worker
        if self.rescales:
            raise SumOverflowError(f"job {w.job.job} worker {w.rank}: the switch saturated an int32 sum")
        return padded_rows(self.data, w.switch.lanes)

    def _dequantize(self, words: np.ndarray, fp32: np.ndarray) -> np.ndarray:
        if fp32.any():
            w = self.worker
            raise SumOverflowError(f"job {w.job.job} worker {w.rank}: an int32 sum overflowed (the switch "
                                   "promoted it to float32); gloo would wrap it around, inagg refuses it")
        return words.view(np.int32).ravel()[:self.data.size].copy()
