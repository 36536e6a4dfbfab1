"""The IncTree: a tree of switches whose leaves are the ranks (``docs/protocol.md`` section 10).

A tree is written as its fan-out per level, root first: ``"4"`` is one
switch with four ranks, ``"2x4"`` a root with two leaf switches of four
ranks each, ``"2x2x2"`` a tree of depth 3 with eight ranks. :meth:`Tree.parse`
validates such a spec and numbers everything: switches breadth first (the
root is switch 0), ranks left to right. A switch's children sit on its ports
0, 1, ... in order; a non-root switch's port after its last child is its
uplink. Every switch and rank gets its own MAC and IPv4 address here, so
that one description gives every address of the tree.

The job on each switch (which children are ranks, which are switches, the
uplink) is the controller's to build from this (``inagg.host.controller``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from inagg.models.protocol import MAX_WORKERS

__all__ = ["Child", "TreeSwitch", "Tree", "TreeCounter", "MAX_DEPTH", "MAX_RANKS"]

MAX_DEPTH = 4
# Addresses give a rank and a switch 16 bits (rank_ip, TreeSwitch.ip).
MAX_RANKS = 1 << 15


class TreeCounter(enum.IntEnum):
    """The events and drops of the tree and collective rules (``ModelSwitch.tree_counters``).

    Kept apart from :class:`~inagg.models.protocol.Counter`, whose order is
    the RTL's register map: the gateware has no tree yet.
    """

    UP_PARTIALS = 0       # completed partials sent to the parent
    UP_RESENDS = 1        # partials sent again: a child resent a contribution to a slot waiting for the parent
    UP_PROMOTED = 2       # partials sent with promoted lanes (opcode 0x2B, promotion bits after the lanes)
    RX_PARENT = 3         # results from the parent taken and sent down
    DUP_PARENT = 4        # results from the parent for a chunk that has its result already (dropped)
    DROP_PARENT_STALE = 5 # results from the parent for a chunk this switch is not waiting for (dropped)
    TX_COMPLETIONS = 6    # payload-less results (completions) sent to children that get no data
    ACK_UP = 7            # Mode II Reduce/Broadcast: an ACK sent to the parent (the root rank's, or the lowest
                          # ACK point of the children)
    ACK_DOWN = 8          # Mode II Reduce/Broadcast: an ACK sent to a child (the root rank's to every child, or
                          # the gathered one to the child on the root rank's side)
    DROP_NO_DATA = 9      # Modes I-III: a frame the collective has nobody send (a contribution from a child that
                          # sends nothing, an ACK from one that gets no result, a result off the root's side)


@dataclass(frozen=True)
class Child:
    """A child of a switch: rank ``index`` or switch ``index``."""

    switch: bool
    index: int


@dataclass(frozen=True)
class TreeSwitch:
    """One switch of a tree.

    ``index`` numbers switches breadth first; ``level`` is 0 at the root;
    ``parent`` the parent's index (None at the root) and ``position`` this
    switch's child index there (its worker index at the parent);
    ``children`` its children in port order; ``ranks`` the ranks below it,
    a contiguous range.
    """

    index: int
    level: int
    parent: int | None
    position: int
    children: tuple[Child, ...]
    ranks: range

    @property
    def uplink_port(self) -> int | None:
        """The port towards the parent (the one after the children's), None at the root."""
        return None if self.parent is None else len(self.children)

    @property
    def ports(self) -> int:
        """Ports in use: one per child, and the uplink."""
        return len(self.children) + (self.parent is not None)

    @property
    def mac(self) -> str:
        return f"02:00:00:fe:{self.index >> 8:02x}:{self.index & 0xFF:02x}"

    @property
    def ip(self) -> str:
        return _ip(2, self.index)

    def child_towards(self, rank: int) -> int | None:
        """Index of the child on whose side ``rank`` is; None when ``rank`` is not below this switch."""
        if rank not in self.ranks:
            return None
        per_child = len(self.ranks) // len(self.children)
        return (rank - self.ranks.start) // per_child


def _ip(net: int, n: int) -> str:
    return f"10.{net}.{(n + 1) >> 8}.{(n + 1) & 0xFF}"


@dataclass(frozen=True)
class Tree:
    """A tree of switches: its spec, fan-out per level and switches (see the module docstring)."""

    fanouts: tuple[int, ...]
    switches: tuple[TreeSwitch, ...]

    @classmethod
    def parse(cls, spec: str) -> "Tree":
        """The tree of ``spec`` (``"2x4"``); ``ValueError`` with the reason when it is not one."""
        if not isinstance(spec, str):
            raise TypeError(f"a tree spec is a string such as '2x4', not {type(spec).__name__}")
        parts = spec.strip().lower().split("x")
        fanouts = []
        for p in parts:
            if not (p.strip().isascii() and p.strip().isdigit()):
                raise ValueError(f"tree spec {spec!r}: fan-outs are positive integers joined by 'x' (e.g. '2x4'), "
                                 f"not {p.strip()!r}")
            n = int(p)
            if not 1 <= n <= MAX_WORKERS:
                raise ValueError(f"tree spec {spec!r}: a switch has 1..{MAX_WORKERS} children, not {n}")
            fanouts.append(n)
        if len(fanouts) > MAX_DEPTH:
            raise ValueError(f"tree spec {spec!r}: depth {len(fanouts)} exceeds {MAX_DEPTH}")
        if math.prod(fanouts) > MAX_RANKS:
            raise ValueError(f"tree spec {spec!r}: {math.prod(fanouts)} ranks exceed {MAX_RANKS}")
        return cls.of(tuple(fanouts))

    @classmethod
    def of(cls, fanouts: tuple[int, ...]) -> "Tree":
        """The tree with these fan-outs per level, root first (validated by :meth:`parse`)."""
        ranks = math.prod(fanouts)
        switches: list[TreeSwitch] = []
        level = [(None, 0, range(ranks))]  # (parent, position, ranks) of each switch of the level
        for depth, fan in enumerate(fanouts):
            leaf = depth == len(fanouts) - 1
            first_child = len(switches) + len(level)
            nxt = []
            for parent, position, below in level:
                index = len(switches)
                step = len(below) // fan
                if leaf:
                    children = tuple(Child(False, r) for r in below)
                else:
                    children = tuple(Child(True, first_child + len(nxt) + i) for i in range(fan))
                    nxt += [(index, i, below[i * step:(i + 1) * step]) for i in range(fan)]
                switches.append(TreeSwitch(index, depth, parent, position, children, below))
            level = nxt
        return cls(tuple(fanouts), tuple(switches))

    @property
    def spec(self) -> str:
        """The spec string of this tree (``"2x4"``)."""
        return "x".join(map(str, self.fanouts))

    @property
    def ranks(self) -> int:
        return math.prod(self.fanouts)

    @property
    def depth(self) -> int:
        return len(self.fanouts)

    @property
    def root(self) -> TreeSwitch:
        return self.switches[0]

    def leaf_of(self, rank: int) -> tuple[int, int]:
        """(switch index, port) where ``rank`` is attached."""
        if not isinstance(rank, int) or not 0 <= rank < self.ranks:
            raise ValueError(f"rank must be an integer in 0..{self.ranks - 1}, not {rank!r}")
        fan = self.fanouts[-1]
        leaves = len(self.switches) - self.ranks // fan
        return leaves + rank // fan, rank % fan

    def peer(self, switch: int, port: int) -> tuple[Child, int | None]:
        """What is at the far end of ``switch``'s ``port``: the node, and its port (None for a rank)."""
        s = self.switches[switch]
        if port == s.uplink_port:
            return Child(True, s.parent), s.position
        if not 0 <= port < len(s.children):
            raise ValueError(f"switch {switch} has no port {port}: it uses ports 0..{s.ports - 1}")
        child = s.children[port]
        return child, self.switches[child.index].uplink_port if child.switch else None

    @staticmethod
    def rank_mac(rank: int) -> str:
        """MAC address of ``rank``."""
        return f"02:00:00:01:{rank >> 8:02x}:{rank & 0xFF:02x}"

    @staticmethod
    def rank_ip(rank: int) -> str:
        """IPv4 address of ``rank``."""
        return _ip(1, rank)
