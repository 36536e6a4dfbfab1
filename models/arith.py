"""Lane arithmetic of the switch: INT32 sums, promoted to FP32 on overflow.

Semantics, bit for bit (the RTL and P4 match this for the same arrival
order):

* A lane accumulates INT32 contributions in INT32 while no addition
  overflows.
* The addition that overflows promotes the lane: its exact sum (33 bits) is
  converted to FP32 with round-to-nearest-even (RNE).
* From then on each contribution to that lane is converted INT32 -> FP32
  (RNE) and added in FP32 (RNE), in arrival order.
* At emit, a chunk with any promoted lane goes out entirely as FP32
  (unpromoted lanes converted INT32 -> FP32 with RNE); otherwise as INT32.

In the slot memory (and here) a lane is one 32-bit word -- INT32 bits or
FP32 bits -- plus a promotion bit, so model and gateware hold the same state.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lane_add", "int_to_fp32", "fp32_add", "accumulate", "merge", "emit", "aggregate", "LaneState"]

_I32_MIN = np.int64(-(1 << 31))
_I32_MAX = np.int64((1 << 31) - 1)


def lane_add(acc: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """INT32 lane addition: the exact sum as int64 and a flag where it overflows INT32."""
    s = np.asarray(acc, np.int32).astype(np.int64) + np.asarray(x, np.int32).astype(np.int64)
    return s, (s > _I32_MAX) | (s < _I32_MIN)


def int_to_fp32(x: np.ndarray) -> np.ndarray:
    """Signed integers (int32 or the 33-bit exact sums as int64) to FP32 with RNE.

    numpy converts int64 to float32 in one rounding (the CPU's RNE mode), not
    through float64, so no double rounding occurs.
    """
    x = np.asarray(x)
    if x.dtype not in (np.int32, np.int64):
        raise TypeError(f"int_to_fp32 takes int32 or int64, not {x.dtype}")
    return x.astype(np.float32)


def fp32_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE-754 binary32 addition with RNE."""
    return (np.asarray(a, np.float32) + np.asarray(b, np.float32)).astype(np.float32)


class LaneState:
    """One chunk's lanes as the slot memory holds them: 32-bit words and promotion bits."""

    __slots__ = ("words", "promoted")

    def __init__(self, lanes: int):
        self.words = np.zeros(lanes, np.uint32)
        self.promoted = np.zeros(lanes, bool)

    def copy(self) -> "LaneState":
        s = LaneState(0)
        s.words, s.promoted = self.words.copy(), self.promoted.copy()
        return s


def accumulate(state: LaneState, x: np.ndarray, first: bool = False) -> None:
    """Add one contribution ``x`` (int32, one value per lane) into ``state`` in place.

    ``first`` marks the slot's first contribution: it is stored as is (the
    slot's old words are not read), which is how the slot memory starts a
    chunk without a separate clear.
    """
    x = np.asarray(x, np.int32)
    if x.shape != state.words.shape:
        raise ValueError(f"contribution has {x.size} lanes, the slot {state.words.size}")
    merge(state, x.view(np.uint32), np.zeros(x.shape, bool), first=first)


def merge(state: LaneState, words: np.ndarray, promoted: np.ndarray, first: bool = False) -> None:
    """Add a partial aggregate (32-bit words and promotion bits, as a slot holds them) into ``state`` in place.

    A switch of a tree adds its children's partials this way
    (``docs/protocol.md`` section 10); an INT32 contribution is a partial
    without promoted lanes (:func:`accumulate`). Per lane: two INT32 words
    add in INT32 and promote on overflow; when either side is promoted, the
    INT32 side is converted to FP32 (RNE) and the two are added in FP32
    (RNE). ``first`` stores the partial as is.
    """
    words = np.asarray(words, np.uint32)
    q = np.asarray(promoted, bool)
    if words.shape != state.words.shape or q.shape != words.shape:
        raise ValueError(f"partial has {words.size} lanes and {q.size} promotion bits, the slot {state.words.size}")
    if first:
        state.words[:] = words
        state.promoted[:] = q
        return
    p = state.promoted
    s, ovf = lane_add(state.words.view(np.int32), words.view(np.int32))
    out = s.astype(np.int32).view(np.uint32)  # INT32 lanes that did not overflow
    newly = ovf & ~p & ~q
    out[newly] = int_to_fp32(s[newly]).view(np.uint32)
    fp = p | q
    if fp.any():
        a = np.where(p[fp], state.words[fp].view(np.float32), int_to_fp32(state.words[fp].view(np.int32)))
        b = np.where(q[fp], words[fp].view(np.float32), int_to_fp32(words[fp].view(np.int32)))
        out[fp] = fp32_add(a, b).view(np.uint32)
    state.words[:] = out
    state.promoted[:] = fp | newly


def emit(state: LaneState) -> np.ndarray:
    """The emitted lanes: int32 when no lane is promoted, else float32 for every lane."""
    if not state.promoted.any():
        return state.words.view(np.int32).copy()
    return np.where(state.promoted, state.words.view(np.float32),
                    int_to_fp32(state.words.view(np.int32))).astype(np.float32)


def aggregate(contribs: np.ndarray) -> np.ndarray:
    """What the switch emits for INT32 contributions of shape (k, lanes), rows in arrival order."""
    c = np.asarray(contribs)
    if c.dtype != np.int32 or c.ndim != 2 or c.shape[0] < 1:
        raise ValueError(f"contributions must be int32 of shape (k >= 1, lanes), not {c.dtype} {c.shape}")
    state = LaneState(c.shape[1])
    for i, row in enumerate(c):  # rows are arrival order; lanes are vectorized
        accumulate(state, row, first=(i == 0))
    return emit(state)
