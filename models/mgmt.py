"""Management frames: the register map read and written over the switch's own Ethernet, authenticated.

A board has no host link but its Ethernet ports, so a host configures it
with management frames (``docs/protocol.md`` section 12): an Ethernet
frame of EtherType :data:`~inagg.models.frame.MGMT_ETHER_TYPE` whose
:data:`~inagg.models.frame.MGMT` header asks for one register write or
read. The request carries a sequence number and a tag, SipHash-2-4 under
the board's 128-bit key over every header field before the tag; the board
performs a request only when the tag is right and the sequence number is
above the last one it accepted (its *floor*), and answers with the same
header, op ``request | RESPONSE``, tagged under the same key, echoing the
sequence number and carrying the read data, a :class:`Status` and the
floor. A request whose sequence number is not above the floor is answered
:attr:`Status.REPLAYED` with the floor, so a host that restarted learns
where to continue; frames that fail an earlier check get no answer. Every
refusal is counted (:data:`~inagg.models.regmap.MGMT_STATS`).

:class:`MgmtBridge` is the board's side, the golden model of
:class:`inagg.hdl.mgmt.MgmtBridge`; :func:`request_frame` and
:func:`parse_response` the host's (``inagg.host.mgmt`` keeps a session).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from inagg.models.frame import ETHERNET, MGMT, MGMT_ETHER_TYPE, MGMT_FRAME, MGMT_TAGGED
from inagg.models.regmap import MGMT_BASE, MGMT_STATS, RegMap
from inagg.models.wire import mac_bytes

__all__ = ["KEY_BYTES", "RESPONSE", "parse_key", "Op", "Status", "initial_state", "siphash24", "tag", "request_frame", "Response",
           "parse_response", "RegOp", "MgmtBridge"]

KEY_BYTES = 16
RESPONSE = 0x80
"""Bit of ``op`` set in a response: a response sent back to the board is not a request, whatever its tag."""
_M64 = (1 << 64) - 1


class Op(enum.IntEnum):
    """The request ops."""

    WRITE = 1
    READ = 2


class Status(enum.IntEnum):
    """A response's ``status``."""

    OK = 0
    SLVERR = 1
    """The register map refused the access (unmapped address, read-only register, a refused value)."""
    REPLAYED = 2
    """The sequence number was not above the floor; nothing was done."""


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M64


def _sipround(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _M64
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _M64
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def parse_key(text: str) -> bytes:
    """The 16-byte key written as 32 hex digits (white space around them ignored), the one form the command
    line and key files take; ``ValueError`` otherwise."""
    digits = text.strip()
    try:
        key = bytes.fromhex(digits)
    except ValueError:
        key = b""
    # fromhex also skips white space between digits: a key is one word, checked by its digit count.
    if len(key) != KEY_BYTES or len(digits) != 2 * KEY_BYTES:
        raise ValueError(f"a management key is {2 * KEY_BYTES} hex digits, not {digits!r}")
    return key


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"management key must be {KEY_BYTES} bytes, not {key!r}")
    return bytes(key)


def initial_state(key: bytes) -> tuple[int, int, int, int]:
    """SipHash's ``v0 .. v3`` under the 16-byte ``key`` before the first block (:class:`inagg.hdl.mgmt.SipHashRounds`
    starts from them too)."""
    k0, k1 = int.from_bytes(_check_key(key)[:8], "little"), int.from_bytes(key[8:], "little")
    return k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573


def siphash24(key: bytes, msg: bytes) -> int:
    """SipHash-2-4 of ``msg`` under the 16-byte ``key``, as the 64-bit integer of the reference (its output bytes
    read little-endian)."""
    v = list(initial_state(key))
    tail = len(msg) % 8
    blocks = [int.from_bytes(msg[i:i + 8], "little") for i in range(0, len(msg) - tail, 8)]
    blocks.append(int.from_bytes(msg[len(msg) - tail:], "little") | (len(msg) & 0xFF) << 56)
    for m in blocks:
        v[3] ^= m
        v = list(_sipround(*_sipround(*v)))
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        v = list(_sipround(*v))
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def tag(key: bytes, header: bytes) -> int:
    """The tag of a :data:`MGMT` header: SipHash-2-4 of its first :data:`MGMT_TAGGED` bytes."""
    return siphash24(key, bytes(header[:MGMT_TAGGED]))


def _frame(key: bytes, dst, src, **fields) -> bytes:
    header = MGMT.pack(**fields, tag=0)
    return (ETHERNET.pack(dst=int.from_bytes(mac_bytes(dst), "big"), src=int.from_bytes(mac_bytes(src), "big"),
                          ether_type=MGMT_ETHER_TYPE)
            + header[:MGMT_TAGGED] + tag(key, header).to_bytes(8, "big"))


def request_frame(key: bytes, *, dst: str | bytes, src: str | bytes, op: Op, seq: int, addr: int,
                  data: int = 0) -> bytes:
    """A request from MAC ``src`` to the board at MAC ``dst``: ``op`` on register ``addr`` (``data``: the value a
    write writes), sequence number ``seq`` (1 .. 2**64 - 1), tagged under ``key``."""
    if not isinstance(seq, int) or not 0 < seq <= _M64:
        raise ValueError(f"sequence number must be an integer in 1..2**64-1, not {seq!r}")
    return _frame(key, dst, src, op=Op(op), status=0, seq=seq, addr=addr, data=data, floor=0)


@dataclass(frozen=True)
class Response:
    """A board's answer to the request of sequence number ``seq``."""

    op: Op
    status: Status
    seq: int
    addr: int
    data: int
    """The register's value (a read) or the value written (a write)."""
    floor: int
    """The board's floor after the request: its sequence number when performed."""


def _fields(frame: bytes) -> dict | None:
    """The management header of ``frame``, or None when it is not a management frame of full length."""
    if len(frame) < MGMT_FRAME or ETHERNET.unpack(frame)["ether_type"] != MGMT_ETHER_TYPE:
        return None
    return MGMT.unpack(frame, ETHERNET.size)


def parse_response(key: bytes, frame: bytes) -> Response | None:
    """The response in ``frame``, or None when ``frame`` is not a management response tagged under ``key``."""
    f = _fields(frame)
    if f is None or not f["op"] & RESPONSE or tag(key, frame[ETHERNET.size:]) != f["tag"]:
        return None
    try:
        return Response(Op(f["op"] & ~RESPONSE), Status(f["status"]), f["seq"], f["addr"], f["data"], f["floor"])
    except ValueError:
        return None


@dataclass(frozen=True)
class RegOp:
    """A register access a request made: a write of ``data`` or a read that returned it; ``ok``: not SLVERR."""

    write: bool
    addr: int
    data: int
    ok: bool


class MgmtBridge:
    """The board's management bridge: requests in, register accesses and responses out.

    Parameters
    ----------
    key:
        The board's 16-byte key.
    read:
        ``read(addr)``: the register map's value at ``addr``, None for SLVERR.
    write:
        ``write(addr, value)``: True when the register map took it, False for SLVERR.
    addr_width:
        Bits of the register map's addresses; a request for an address beyond them is SLVERR.

    The bridge serves reads of its own counters (``MGMT_BASE``) itself, as
    the register map does in the gateware, counting the request first. The
    response's source MAC is the switch's (``MAC_HI``, ``MAC_LO``, read
    through ``read`` and not reported as a request's access).

    Attributes
    ----------
    floor : int
        The last accepted sequence number; 0 after :meth:`reset`, as the gateware's after its reset.
    counters : dict[str, int]
        :data:`~inagg.models.regmap.MGMT_STATS` by name. ``busy`` stays 0: the model takes one frame at a time.
    """

    def __init__(self, key: bytes, read: Callable[[int], int | None], write: Callable[[int, int], bool],
                 addr_width: int):
        self.key = _check_key(key)
        self._read, self._write, self._addr_width = read, write, addr_width
        self.reset()

    def reset(self) -> None:
        """The board's reset: the floor and the counters to 0."""
        self.floor = 0
        self.counters = dict.fromkeys(MGMT_STATS, 0)

    def _read_reg(self, addr: int) -> int | None:
        if MGMT_BASE <= addr < MGMT_BASE + 4 * len(MGMT_STATS) and addr % 4 == 0:
            return self.counters[list(MGMT_STATS)[(addr - MGMT_BASE) // 4]]
        return self._read(addr)

    def receive(self, frame: bytes) -> tuple[bytes | None, list[RegOp]]:
        """The response to ``frame`` (None: no answer) and the register accesses it made.

        A frame of another EtherType, or shorter than its Ethernet header,
        is not the bridge's (no answer, not counted). The checks, in order,
        each counted: ``malformed``, ``bad_op``, ``bad_tag``, ``replayed``.
        """
        if len(frame) < ETHERNET.size or ETHERNET.unpack(frame)["ether_type"] != MGMT_ETHER_TYPE:
            return None, []
        f = _fields(frame)
        if f is None:
            self.counters["malformed"] += 1
            return None, []
        if f["op"] not in tuple(Op):
            self.counters["bad_op"] += 1
            return None, []
        if tag(self.key, frame[ETHERNET.size:]) != f["tag"]:
            self.counters["bad_tag"] += 1
            return None, []
        ops, data = [], f["data"]
        if f["seq"] <= self.floor:
            self.counters["replayed"] += 1
            status = Status.REPLAYED
        else:
            self.floor = f["seq"]
            self.counters["accepted"] += 1
            addr, in_map = f["addr"], f["addr"] < 1 << self._addr_width
            if f["op"] == Op.WRITE:
                ok = in_map and self._write(addr, data)
            else:
                value = self._read_reg(addr) if in_map else None
                ok, data = value is not None, value or 0
            ops.append(RegOp(f["op"] == Op.WRITE, addr, data, ok))
            status = Status.OK if ok else Status.SLVERR
        src = ETHERNET.unpack(frame)["src"].to_bytes(6, "big")
        mac = (self._read(RegMap.switch("MAC_HI")) << 32 | self._read(RegMap.switch("MAC_LO"))).to_bytes(6, "big")
        return _frame(self.key, src, mac, op=f["op"] | RESPONSE, status=status, seq=f["seq"], addr=f["addr"],
                      data=data, floor=self.floor), ops
