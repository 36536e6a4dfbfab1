"""The exception engine: overflow slots in a two-way cuckoo hash table, bit-exact with :mod:`inagg.models.cuckoo`.

A contribution whose direct-mapped slot is held by another job asks this
engine where its slot lives instead (``docs/protocol.md`` section 4). The
engine keeps the keys ``job << 22 | index`` of such slots in two tables of
``table`` entries and a stash, and hands each new key an overflow slot
pointer from a free list, exactly as :class:`inagg.models.switch.ModelSwitch`
does with :class:`inagg.models.cuckoo.CuckooTable`: same hash functions,
same kick-out walk, same stash order, same pointers in the same order, same
refusals. ``docs/exception.md`` describes the pipeline and how the slot
engine uses it.

How the walk works without a plan buffer
----------------------------------------
The model plans a kick-out chain and applies it only when it ends in a free
position. The engine writes the chain through instead -- a read sees the
writes before it, as the model's plan overlay does -- and undoes a chain
that fails by walking it backwards. That needs no log: every key in table
``t`` sits at its own position ``h_t(key)``, and each entry stores its
position in the other table (``other``), so the key displaced last knows the
position it was taken from, the key now there knows its own, and so on back
to the new key. The same datapath step -- write the carried entry, carry the
occupant on to its other position -- runs both ways, one step per cycle.
"""

from __future__ import annotations

from amaranth import Cat, Const, DomainRenamer, Module, Mux, Signal
from amaranth.lib import data, enum, fifo, memory, stream, wiring
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.lib.wiring import In, Out

from inagg.models.cuckoo import KEY_INDEX_BITS, KEY_JOB_SHIFT
from inagg.models.geometry import MAX_KICKS, MAX_STASH

__all__ = ["Op", "Status", "STATS", "KeyHash", "RequestStages", "CuckooLookup", "RequestActions", "KickoutWalk",
           "request_layout", "response_layout", "entry_layout", "stats_layout", "ExceptionEngine"]



class Op(enum.Enum, shape=2):
    """What a request asks for."""

    #: Where does ``key`` live? HIT or MISS.
    LOOKUP = 0
    #: ``ModelSwitch._locate``'s exception branch with the fast slot taken: HIT, else a new entry
    #: (INSERTED) or REFUSED.
    LOCATE = 1
    #: Remove ``key``: DELETED (its pointer returns to the free list) or MISS.
    DELETE = 2
    #: Remove every key of job ``key >> 22`` with an index up to ``key & (2**22 - 1)``, in index
    #: order (``ModelSwitch.remove_job``); one DONE when finished.
    TEARDOWN = 3


class Status(enum.Enum, shape=3):
    """The answer to a request; ``ptr`` is meaningful for HIT, INSERTED and DELETED."""

    HIT = 0
    MISS = 1
    INSERTED = 2
    REFUSED = 3
    DELETED = 4
    DONE = 5


def request_layout(key_width: int) -> data.StructLayout:
    """What a request asks (:class:`Op`) about which key."""
    return data.StructLayout({"op": Op, "key": key_width})


def response_layout(key_width: int, capacity: int) -> data.StructLayout:
    """``key`` is the request's, so a consumer can check which request an answer belongs to."""
    return data.StructLayout({"status": Status, "ptr": range(capacity), "key": key_width})


def entry_layout(key_width: int, capacity: int, table: int) -> data.StructLayout:
    """A table entry: the key, its overflow slot, and its position in the other table."""
    return data.StructLayout({"valid": 1, "key": key_width, "ptr": range(capacity), "other": range(table)})


#: Event counters, 32 bits each, wrapping. ``inserts``, ``kicks``, ``stashed``, ``refused`` and
#: ``deletes`` are :class:`~inagg.models.cuckoo.CuckooStats`; ``full`` counts LOCATEs refused
#: because every entry was in use (the model refuses those before it calls ``insert``, so they
#: are not in ``refused``); ``stalls`` counts cycles in which the request stream was held off.
STATS = ("inserts", "kicks", "stashed", "refused", "full", "deletes", "stalls")


def stats_layout() -> data.StructLayout:
    """The counters of :data:`STATS`, in that order from bit 0."""
    return data.StructLayout({name: 32 for name in STATS})


def _check_table(table):
    if not isinstance(table, int) or isinstance(table, bool) or not 2 <= table <= 65536 or table & (table - 1):
        raise ValueError(f"Table size must be a power of two from 2 to 65536, not {table!r}")
    return table


class _Mode(enum.Enum, shape=2):
    IDLE = 0
    FORWARD = 1  # walking a kick-out chain
    UNDO = 2     # walking a failed chain back


def _check_int(value, low, high, what):
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer from {low} to {high}, not {value!r}")
    return value


class KeyHash(wiring.Component):
    """The positions of a key in the two tables, from one CRC-32 of its 4 big-endian bytes.

    ``h0`` is the CRC's low bits, ``h1`` its bits from 16 up, as
    :func:`inagg.models.cuckoo.hashes`. The CRC register takes ``key`` on a
    cycle with ``load`` high and holds it otherwise, so the hashes are those
    of the last key loaded.

    Parameters
    ----------
    table : int
        Entries per table, a power of two from 2 to 65536.
    key_width : int
        Bits of ``key`` (1 to 32); the CRC is of the key zero-extended to 32 bits.

    Members
    -------
    key : In(key_width)
    load : In(1)
    h0, h1 : Out(log2(table))
    """

    def __init__(self, table: int, key_width: int = 32):
        self.table = _check_table(table)
        self.key_width = _check_int(key_width, 1, 32, "Key width")
        bits = (table - 1).bit_length()
        super().__init__({"key": In(key_width), "load": In(1), "h0": Out(bits), "h1": Out(bits)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC32_ETHERNET(data_width=32).create()
        key = Signal(32)
        bits = len(self.h0)
        m.d.comb += [
            key.eq(self.key),
            # Reflected CRC-32 takes bit 0 of its word first; zlib takes byte 0 (the key's top byte) first.
            crc.data.eq(Cat(key[24:32], key[16:24], key[8:16], key[:8])),
            crc.start.eq(self.load), crc.valid.eq(self.load),
            self.h0.eq(crc.crc[:bits]), self.h1.eq(crc.crc[16:16 + bits]),
        ]
        return m


class RequestStages(wiring.Component):
    """Stages H and R of :class:`ExceptionEngine`: the next request, registered beside its key's hashes.

    H takes the request queue's head; a TEARDOWN becomes one request per
    index of its job (``0 ..`` the key's index, the last one flagged
    ``last``), and the queue pops once that last one is taken. R holds the
    request and the two table positions of its key (:class:`KeyHash`) until
    stage D takes it (``issue``); it loads the next one in the same cycle.

    Parameters
    ----------
    table : int
        Entries per table.
    key_width : int
        Bits of a key.

    Members
    -------
    head : In(request_layout(key_width))
        The request queue's head.
    head_valid : In(1)
        The queue has a head.
    pop : Out(1)
        Take the head out of the queue.
    issue : In(1)
        Stage D takes the request R holds.
    valid, last : Out(1)
        R holds a request (``last``: not a teardown's, or its last index).
    op : Out(Op)
    key : Out(key_width)
    h0, h1 : Out(log2(table))
        The key's positions in tables 0 and 1.
    """

    def __init__(self, table: int, key_width: int):
        self._table, self._key_width = table, key_width
        bits = (table - 1).bit_length()
        super().__init__({"head": In(request_layout(key_width)), "head_valid": In(1), "pop": Out(1), "issue": In(1),
                          "valid": Out(1), "last": Out(1), "op": Out(Op), "key": Out(key_width),
                          "h0": Out(bits), "h1": Out(bits)})

    def elaborate(self, platform):
        m = Module()
        # -- stage H: the request queue's head; a teardown becomes one delete per index --
        head_req = self.head
        td_index = Signal(KEY_INDEX_BITS)
        h_teardown = head_req.op == Op.TEARDOWN
        h_last = ~h_teardown | (td_index == head_req.key[:KEY_INDEX_BITS])
        h_key = Mux(h_teardown, Cat(td_index, head_req.key[KEY_JOB_SHIFT:]), head_req.key)

        # -- stage R: the key registered beside its hashes --
        m.submodules.hash = hasher = KeyHash(self._table, self._key_width)
        load = self.head_valid & (~self.valid | self.issue)
        m.d.comb += [hasher.key.eq(h_key), hasher.load.eq(load), self.pop.eq(load & h_last),
                     self.h0.eq(hasher.h0), self.h1.eq(hasher.h1)]
        with m.If(load):
            m.d.sync += [self.valid.eq(1), self.op.eq(head_req.op), self.key.eq(h_key), self.last.eq(h_last)]
            with m.If(h_teardown):
                m.d.sync += td_index.eq(Mux(h_last, 0, td_index + 1))
        with m.Elif(self.issue):
            m.d.sync += self.valid.eq(0)
        return m


class CuckooLookup(wiring.Component):
    """Where a key is, from the two entries read at its positions and the stash: combinational.

    Parameters
    ----------
    table, stash, key_width, capacity : int
        The engine's (:class:`ExceptionEngine`).

    Members
    -------
    key : In(key_width)
    entries : In(entry_layout(key_width, capacity, table)).array(2)
        Table ``t``'s entry at the key's position in it.
    stash_count : In(range(stash + 1))
    stash_keys : In(key_width).array(stash)
    stash_ptrs : In(range(capacity)).array(stash)
        The stash, its first ``stash_count`` entries in use (these three with a stash only).
    hits : Out(2)
        Bit ``t``: the key is in table ``t``.
    stash_hits : Out(stash)
        Bit ``i``: the key is stash entry ``i`` (with a stash only).
    found : Out(1)
        Anywhere.
    ptr : Out(range(capacity))
        Its overflow slot, when ``found``.
    """

    def __init__(self, table: int, stash: int, key_width: int, capacity: int):
        self._stash = stash
        members = {"key": In(key_width), "entries": In(entry_layout(key_width, capacity, table)).array(2),
                   "hits": Out(2), "found": Out(1), "ptr": Out(range(capacity))}
        if stash:
            members.update({"stash_count": In(range(stash + 1)), "stash_keys": In(key_width).array(stash),
                            "stash_ptrs": In(range(capacity)).array(stash), "stash_hits": Out(stash)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        e, S = self.entries, self._stash
        m.d.comb += [self.hits[t].eq(e[t].valid & (e[t].key == self.key)) for t in (0, 1)]
        stash_ptr = 0
        if S:
            m.d.comb += [self.stash_hits[i].eq((i < self.stash_count) & (self.stash_keys[i] == self.key))
                         for i in range(S)]
            for i in range(S):
                stash_ptr |= Mux(self.stash_hits[i], self.stash_ptrs[i], 0)
        in_stash = self.stash_hits.any() if S else Const(0, 1)
        m.d.comb += [self.found.eq(self.hits.any() | in_stash),
                     self.ptr.eq(Mux(self.hits[0], e[0].ptr, Mux(self.hits[1], e[1].ptr, stash_ptr)))]
        return m


def _placed(m: Module, entry: data.StructLayout, key, ptr, other) -> Signal:
    v = Signal(entry, name="placed")
    m.d.comb += [v.valid.eq(1), v.key.eq(key), v.ptr.eq(ptr), v.other.eq(other)]
    return v


class KickoutWalk(wiring.Component):
    """The kick-out walk: carries one entry from table to table, one step a cycle, and walks a failed chain back.

    Stage D starts a walk (``start``) after it wrote the new key into its
    table-0 position; the walker then carries that position's occupant
    (``start_key`` ...) to its position in table 1. Each step writes the
    carried entry at position ``here`` of table ``wt`` and carries the
    occupant it read there on to its other position; a chain that reaches
    ``max_kicks`` turns round and runs the same step backwards (see the
    module docstring), until the new key is the occupant again. Takes the
    engine's ``table``, ``max_kicks``, ``key_width`` and ``capacity``.

    Members
    -------
    entries : In(entry_layout(key_width, capacity, table)).array(2)
        The entries read at the positions the walker asked for the cycle before.
    start : In(1)
        Stage D starts a walk with the carried entry ``start_key``,
        ``start_ptr``, from position ``start_there`` of table 0 to its
        position ``start_here`` in table 1.
    start_key, start_ptr, start_here, start_there : In
    may_start : In(1)
        Stage D holds a request that may start a walk (from registers and the
        entries' valid bits only), for the read-ahead while idle.
    place_en : Out(1)
        The walker writes ``place`` this cycle.
    place_table : Out(1)
    place_addr : Out(log2(table))
    place : Out(entry_layout(...))
        The entry it writes.
    inserted : Out(1)
        The chain ended in a free position: the new key is in.
    kicks : Out(range(max_kicks + 1))
        Kicks of the chain so far.
    failed : Out(1)
        The chain is walked back: every entry is where it was; the new key goes to the stash or is refused.
    busy_next : Out(1)
        The walker reads next cycle ...
    read_table : Out(1)
    read_addr : Out(log2(table))
        ... this table's position (from a few bits and no key comparison, so that the next
        read address and the issue of the next request stay short paths; a LOCATE with both
        positions taken may turn out a hit, and the cycle after it is then idle).
    """

    def __init__(self, table: int, max_kicks: int, key_width: int, capacity: int):
        self._max_kicks = max_kicks
        self._entry = entry = entry_layout(key_width, capacity, table)
        bits = (table - 1).bit_length()
        super().__init__({
            "entries": In(entry).array(2), "start": In(1), "start_key": In(key_width),
            "start_ptr": In(range(capacity)), "start_here": In(bits), "start_there": In(bits), "may_start": In(1),
            "place_en": Out(1), "place_table": Out(1), "place_addr": Out(bits), "place": Out(entry),
            "inserted": Out(1), "kicks": Out(range(max_kicks + 1)), "failed": Out(1),
            "busy_next": Out(1), "read_table": Out(1), "read_addr": Out(bits),
        })

    def elaborate(self, platform):
        m = Module()
        K, e = self._max_kicks, self.entries
        mode = Signal(_Mode)
        wt = Signal()
        c_key, c_ptr = Signal.like(self.start_key), Signal.like(self.start_ptr)
        c_here, c_there = Signal.like(self.start_here), Signal.like(self.start_there)
        kicks = self.kicks
        n_mode = Signal(_Mode)
        n_wt = Signal()
        n_key, n_ptr = Signal.like(c_key), Signal.like(c_ptr)
        n_here, n_there = Signal.like(c_here), Signal.like(c_there)
        n_kicks = Signal.like(kicks)
        m.d.comb += [n_mode.eq(mode), n_wt.eq(wt), n_key.eq(c_key), n_ptr.eq(c_ptr), n_here.eq(c_here),
                     n_there.eq(c_there), n_kicks.eq(kicks)]
        m.d.sync += [mode.eq(n_mode), wt.eq(n_wt), c_key.eq(n_key), c_ptr.eq(n_ptr), c_here.eq(n_here),
                     c_there.eq(n_there), kicks.eq(n_kicks)]
        occ = Signal(self._entry)
        m.d.comb += occ.eq(Mux(wt, e[1], e[0]))

        with m.If(mode == _Mode.FORWARD):
            m.d.comb += [self.busy_next.eq(occ.valid), self.read_table.eq(~wt),
                         self.read_addr.eq(Mux(kicks == K, c_there, occ.other))]
        with m.Elif(mode == _Mode.UNDO):
            m.d.comb += [self.busy_next.eq(kicks != 1), self.read_table.eq(~wt), self.read_addr.eq(occ.other)]
        with m.Else():
            m.d.comb += [self.busy_next.eq(self.may_start), self.read_table.eq(1), self.read_addr.eq(e[0].other)]

        def carry(key, ptr, here, there):
            m.d.comb += [n_key.eq(key), n_ptr.eq(ptr), n_here.eq(here), n_there.eq(there)]

        m.d.comb += [self.place_en.eq(mode != _Mode.IDLE), self.place_table.eq(wt), self.place_addr.eq(c_here),
                     self.place.eq(_placed(m, self._entry, c_key, c_ptr, c_there))]
        with m.If(self.start):
            carry(self.start_key, self.start_ptr, self.start_here, self.start_there)
            m.d.comb += [n_mode.eq(_Mode.FORWARD), n_wt.eq(1), n_kicks.eq(1)]
        with m.If(mode == _Mode.FORWARD):
            with m.If(~occ.valid):
                m.d.comb += [self.inserted.eq(1), n_mode.eq(_Mode.IDLE)]
            with m.Elif(kicks == K):
                # Chain failed: turn round; the carried key goes back where it was taken from.
                m.d.comb += [self.place_en.eq(0), n_mode.eq(_Mode.UNDO), n_wt.eq(~wt), n_here.eq(c_there),
                             n_there.eq(c_here)]
            with m.Else():
                carry(occ.key, occ.ptr, occ.other, c_here)
                m.d.comb += [n_wt.eq(~wt), n_kicks.eq(kicks + 1)]
        with m.Elif(mode == _Mode.UNDO):
            with m.If(kicks == 1):
                # The occupant is the new key again: every table entry is back where it was.
                m.d.comb += [self.failed.eq(1), n_mode.eq(_Mode.IDLE)]
            with m.Else():
                carry(occ.key, occ.ptr, occ.other, c_here)
                m.d.comb += [n_wt.eq(~wt), n_kicks.eq(kicks - 1)]
        return m


class RequestActions(wiring.Component):
    """Stage D's actions: what a request does with the two entries read for it and the lookup's answer.

    A LOOKUP answers; a LOCATE answers a hit, is refused when no overflow
    slot is free, places the key at a free position of its two, or (both
    taken) places it in table 0 and starts the walk with the occupant; a
    DELETE or a teardown's index clears the key's entry and frees its
    pointer. Combinational; takes the engine's ``table``, ``max_kicks``,
    ``key_width`` and ``capacity``.

    Members
    -------
    valid : In(1)
        Stage D holds a request ...
    op : In(Op)
    key : In(key_width)
    last : In(1)
        ... (not a teardown's, or its last index) ...
    h0, h1 : In(log2(table))
        ... at these positions, ...
    entries : In(entry_layout(...)).array(2)
        ... where these entries were read.
    hits : In(2)
    in_stash, found : In(1)
    found_ptr : In(range(capacity))
        :class:`CuckooLookup`'s answer.
    free_count : In(range(capacity + 1))
    head : In(range(capacity))
        The free list's length and its head, the next key's overflow slot.
    write_en, write_table : Out(1)
    write_addr : Out(log2(table))
    write : Out(entry_layout(...))
        The table write.
    answer : Out(1)
    status : Out(Status)
    ptr : Out(range(capacity))
        The response.
    pop : Out(1)
        The head is taken.
    push : Out(1)
        ``found_ptr`` returns to the free list.
    stash_remove : Out(1)
        The key leaves the stash.
    give_up : Out(1)
        No walk (``max_kicks`` is 0): the key goes to the stash or is refused.
    walk : Out(1)
        Start :class:`KickoutWalk` with table 0's occupant.
    inserted, full, deleted : Out(1)
        Counter strobes (``inserts``, ``full``, ``deletes``).
    """

    def __init__(self, table: int, max_kicks: int, key_width: int, capacity: int):
        self._max_kicks = max_kicks
        self._entry = entry = entry_layout(key_width, capacity, table)
        bits = (table - 1).bit_length()
        super().__init__({
            "valid": In(1), "op": In(Op), "key": In(key_width), "last": In(1), "h0": In(bits), "h1": In(bits),
            "entries": In(entry).array(2), "hits": In(2), "in_stash": In(1), "found": In(1),
            "found_ptr": In(range(capacity)), "free_count": In(range(capacity + 1)), "head": In(range(capacity)),
            "write_en": Out(1), "write_table": Out(1), "write_addr": Out(bits), "write": Out(entry),
            "answer": Out(1), "status": Out(Status), "ptr": Out(range(capacity)), "pop": Out(1), "push": Out(1),
            "stash_remove": Out(1), "give_up": Out(1), "walk": Out(1),
            "inserted": Out(1), "full": Out(1), "deleted": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        e, h, found = self.entries, [self.h0, self.h1], self.found

        def answer(status, ptr=0):
            m.d.comb += [self.answer.eq(1), self.status.eq(status), self.ptr.eq(ptr)]

        def write(t, value):
            m.d.comb += [self.write_en.eq(1), self.write_table.eq(t), self.write_addr.eq(h[t]), self.write.eq(value)]

        def place(t):
            write(t, _placed(m, self._entry, self.key, self.head, h[1 - t]))

        with m.If(self.valid):
            with m.Switch(self.op):
                with m.Case(Op.LOOKUP):
                    answer(Mux(found, Status.HIT, Status.MISS), self.found_ptr)
                with m.Case(Op.LOCATE):
                    with m.If(found):
                        answer(Status.HIT, self.found_ptr)
                    with m.Elif(self.free_count == 0):
                        m.d.comb += self.full.eq(1)
                        answer(Status.REFUSED)
                    with m.Elif(~e[0].valid | ~e[1].valid):
                        with m.If(~e[0].valid):
                            place(0)
                        with m.Else():
                            place(1)
                        m.d.comb += [self.pop.eq(1), self.inserted.eq(1)]
                        answer(Status.INSERTED, self.head)
                    with m.Else():
                        if self._max_kicks:
                            # The first kick: the new key takes table 0's position; its occupant
                            # goes on to its position in table 1.
                            place(0)
                            m.d.comb += self.walk.eq(1)
                        else:
                            m.d.comb += self.give_up.eq(1)
                with m.Case(Op.DELETE, Op.TEARDOWN):
                    with m.If(self.hits[0]):
                        write(0, 0)
                    with m.Elif(self.hits[1]):
                        write(1, 0)
                    with m.Elif(self.in_stash):
                        m.d.comb += self.stash_remove.eq(1)
                    with m.If(found):
                        m.d.comb += [self.push.eq(1), self.deleted.eq(1)]
                    with m.If(self.op == Op.DELETE):
                        answer(Mux(found, Status.DELETED, Status.MISS), self.found_ptr)
                    with m.Elif(self.last):
                        answer(Status.DONE)
        return m


class ExceptionEngine(wiring.Component):
    """Cuckoo hash table of overflow slots with its own request and response queues.

    Requests (:class:`Op`) enter a queue of ``depth`` entries; ``req.ready``
    is low only while it is full (counted in ``stats.stalls``). Each request
    gets one response, in request order, through a second queue of
    ``depth`` entries. Lookups, direct inserts and deletes take one cycle
    each, back to back; an insert that kicks ``k`` keys takes ``k`` more; a
    chain that fails takes ``2 * max_kicks`` more before the key goes to the
    stash or is refused; a teardown takes one cycle per index. For
    ``capacity`` cycles after reset the engine clears its tables and fills
    its free list; requests queue meanwhile.

    Parameters
    ----------
    table : int
        Entries per table, a power of two from 2 to 65536.
    max_kicks : int
        Longest kick-out chain, 0 to 1024.
    stash : int
        Stash entries, 0 to 64 (registers, searched at once).
    key_width : int
        Bits of a key, 23 to 32: the 22 index bits and at least one job bit.
        Hashes are of the key zero-extended to 32 bits, as the model's.
    depth : int
        Entries of the request queue and of the response queue, 4 to 4096
        (rounded up to a power of two when ``domain`` is not ``"sync"``).
    domain : str
        Clock domain of the tables and the decisions. The streams are always
        in ``sync``; another domain makes the two queues asynchronous FIFOs,
        so the engine can run at a clock of its own. ``stats.stalls`` counts
        ``sync`` cycles, the other counters are in ``domain``.

    Members
    -------
    req : In(stream.Signature(request_layout(key_width)))
    resp : Out(stream.Signature(response_layout(key_width, capacity)))
    stats : Out(stats_layout())

    Attributes
    ----------
    capacity : int
        Overflow slots, ``2 * table + stash``; pointers are ``0 .. capacity - 1``.
    tables : tuple of Memory
        The two tables (:func:`entry_layout`); read by testbenches.
    free_list : Memory
        Free pointers, ``free_count`` of them from index ``free_first`` on, wrapping.
    free_first, free_count, stash_count : Signal
    stash_keys, stash_ptrs : tuple of Signal
        The stash in the model's order; the first ``stash_count`` are in use.
    """

    def __init__(self, table: int = 256, max_kicks: int = 16, stash: int = 4, key_width: int = 32,
                 depth: int = 16, domain: str = "sync"):
        self.table = _check_table(table)
        self.max_kicks = _check_int(max_kicks, 0, MAX_KICKS, "Kick-out bound")
        self.stash = _check_int(stash, 0, MAX_STASH, "Stash size")
        self.key_width = _check_int(key_width, KEY_INDEX_BITS + 1, 32, "Key width")
        self.depth = _check_int(depth, 4, 4096, "Queue depth")
        if not isinstance(domain, str) or not domain:
            raise ValueError(f"Domain must be the name of a clock domain, not {domain!r}")
        self.domain = domain
        self.capacity = cap = 2 * table + stash
        entry = entry_layout(key_width, cap, table)
        self.tables = tuple(memory.Memory(shape=entry, depth=table, init=[]) for _ in range(2))
        self.free_list = memory.Memory(shape=range(cap), depth=cap, init=[])
        self.free_first = Signal(range(cap))
        self.free_count = Signal(range(cap + 1))
        self.stash_count = Signal(range(stash + 1))
        self.stash_keys = tuple(Signal(key_width, name=f"stash{i}_key") for i in range(stash))
        self.stash_ptrs = tuple(Signal(range(cap), name=f"stash{i}_ptr") for i in range(stash))
        super().__init__({
            "req": In(stream.Signature(request_layout(key_width))),
            "resp": Out(stream.Signature(response_layout(key_width, cap))),
            "stats": Out(stats_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        T, K, S, cap = self.table, self.max_kicks, self.stash, self.capacity
        hbits = (T - 1).bit_length()

        m.submodules.t0, m.submodules.t1 = self.tables
        wr = [t.write_port() for t in self.tables]
        rd = [t.read_port(transparent_for=(w,)) for t, w in zip(self.tables, wr)]
        m.submodules.free_list = self.free_list
        f_wr = self.free_list.write_port()
        f_rd = self.free_list.read_port(transparent_for=(f_wr,))
        # The queues are the engine's boundary: the streams are in "sync", everything behind them in
        # the engine's domain, which may run at a clock of its own.
        top = Module()
        req_width, resp_width = len(self.req.payload.as_value()), len(self.resp.payload.as_value())
        if self.domain == "sync":
            req_q = fifo.SyncFIFOBuffered(width=req_width, depth=self.depth)
            # Unbuffered: its level is exact, which the room check below relies on.
            resp_q = fifo.SyncFIFO(width=resp_width, depth=self.depth)
        else:
            req_q = fifo.AsyncFIFOBuffered(width=req_width, depth=self.depth, w_domain="sync", r_domain=self.domain)
            resp_q = fifo.AsyncFIFO(width=resp_width, depth=self.depth, w_domain=self.domain, r_domain="sync")
        top.submodules.requests, top.submodules.responses = req_q, resp_q
        stalls = Signal(32)
        top.d.sync += stalls.eq(stalls + (self.req.valid & ~self.req.ready))
        counts = Signal(stats_layout())
        top.d.comb += [req_q.w_data.eq(self.req.payload), req_q.w_en.eq(self.req.valid),
                       self.req.ready.eq(req_q.w_rdy),
                       self.resp.payload.eq(resp_q.r_data), self.resp.valid.eq(resp_q.r_rdy),
                       resp_q.r_en.eq(self.resp.ready),
                       self.stats.eq(counts), self.stats.stalls.eq(stalls)]
        top.submodules.core = m if self.domain == "sync" else DomainRenamer(self.domain)(m)

        # After reset: mark every entry empty and put pointers 0 .. capacity-1 on the free list.
        sweep = Signal(range(cap + 1))
        sweeping = sweep != cap
        with m.If(sweeping):
            m.d.sync += sweep.eq(sweep + 1)

        # -- free list: a FIFO whose head is readable the cycle after any push or pop --
        # (the library's block-RAM FIFO shows a pushed entry only two cycles later; the model
        # may hand out a pointer in the very next request after the delete that freed it).
        pop, push = Signal(), Signal()
        push_ptr = Signal(range(cap))
        f_last = Signal(range(cap))

        def wrap_incr(i):
            return Mux(i == cap - 1, 0, i + 1)

        first_next = Mux(pop, wrap_incr(self.free_first), self.free_first)
        head = f_rd.data
        m.d.comb += [f_rd.addr.eq(first_next), f_wr.addr.eq(f_last), f_wr.data.eq(push_ptr), f_wr.en.eq(push)]
        m.d.sync += [self.free_first.eq(first_next), self.free_count.eq(self.free_count + push - pop)]
        with m.If(push):
            m.d.sync += f_last.eq(wrap_incr(f_last))

        # -- stages H and R: the next request and its key's hashes --
        m.submodules.request = request = RequestStages(T, self.key_width)
        issue = Signal()
        m.d.comb += [request.head.eq(req_q.r_data), request.head_valid.eq(req_q.r_rdy), req_q.r_en.eq(request.pop),
                     request.issue.eq(issue)]
        r_h = [request.h0, request.h1]

        # -- stage D: the two entries are read; decide, write, answer --
        d_valid, d_last = Signal(), Signal()
        d_op = Signal(Op)
        d_key = Signal(self.key_width)
        d_h = [Signal(hbits, name="d_h0"), Signal(hbits, name="d_h1")]
        m.d.sync += d_valid.eq(issue)
        with m.If(issue):
            m.d.sync += [d_op.eq(request.op), d_key.eq(request.key), d_last.eq(request.last),
                         d_h[0].eq(r_h[0]), d_h[1].eq(r_h[1])]
        e = [rd[0].data, rd[1].data]
        m.submodules.lookup = lookup = CuckooLookup(T, S, self.key_width, cap)
        m.d.comb += [lookup.key.eq(d_key), lookup.entries[0].eq(e[0]), lookup.entries[1].eq(e[1])]
        if S:
            m.d.comb += [lookup.stash_count.eq(self.stash_count),
                         *[port.eq(key) for port, key in zip(lookup.stash_keys, self.stash_keys)],
                         *[port.eq(ptr) for port, ptr in zip(lookup.stash_ptrs, self.stash_ptrs)]]
        m.submodules.actions = act = RequestActions(T, K, self.key_width, cap)
        m.d.comb += [act.valid.eq(d_valid), act.op.eq(d_op), act.key.eq(d_key), act.last.eq(d_last),
                     act.h0.eq(d_h[0]), act.h1.eq(d_h[1]), act.entries[0].eq(e[0]), act.entries[1].eq(e[1]),
                     act.hits.eq(lookup.hits), act.in_stash.eq(lookup.stash_hits.any() if S else 0),
                     act.found.eq(lookup.found), act.found_ptr.eq(lookup.ptr), act.free_count.eq(self.free_count),
                     act.head.eq(head)]

        m.submodules.walk = walk = KickoutWalk(T, K, self.key_width, cap)
        m.d.comb += [walk.entries[0].eq(e[0]), walk.entries[1].eq(e[1]), walk.start.eq(act.walk),
                     walk.start_key.eq(e[0].key), walk.start_ptr.eq(e[0].ptr), walk.start_here.eq(e[0].other),
                     walk.start_there.eq(d_h[0])]
        if K:
            m.d.comb += walk.may_start.eq(d_valid & (d_op == Op.LOCATE) & e[0].valid & e[1].valid
                                          & (self.free_count != 0))

        # -- the actions of one cycle (D and the walker never act in the same cycle) --
        resp = Signal(response_layout(self.key_width, cap))
        resp_push = Signal()
        # Registered on its way into the response queue, off the decision's path.
        resp_reg = Signal.like(resp)
        resp_reg_valid = Signal()
        m.d.sync += resp_reg_valid.eq(resp_push)
        with m.If(resp_push):
            m.d.sync += resp_reg.eq(resp)
        m.d.comb += [resp.key.eq(d_key), resp_q.w_data.eq(resp_reg), resp_q.w_en.eq(resp_reg_valid)]
        inc = {name: Signal(name=f"inc_{name}") for name in STATS if name not in ("kicks", "stalls")}
        s_append = Signal()
        gives_up = act.give_up | walk.failed
        with m.If(sweeping):
            for t in (0, 1):
                m.d.comb += [wr[t].en.eq(sweep < T), wr[t].addr.eq(sweep), wr[t].data.eq(0)]
            m.d.comb += [push.eq(1), push_ptr.eq(sweep)]
        with m.Else():
            for t in (0, 1):
                with m.If(act.write_en & (act.write_table == t)):
                    m.d.comb += [wr[t].en.eq(1), wr[t].addr.eq(act.write_addr), wr[t].data.eq(act.write)]
                with m.Elif(walk.place_en & (walk.place_table == t)):
                    m.d.comb += [wr[t].en.eq(1), wr[t].addr.eq(walk.place_addr), wr[t].data.eq(walk.place)]
            m.d.comb += [push.eq(act.push), push_ptr.eq(lookup.ptr)]
        with m.If(act.answer):
            m.d.comb += [resp_push.eq(1), resp.status.eq(act.status), resp.ptr.eq(act.ptr)]
        with m.Elif(walk.inserted):
            m.d.comb += [resp_push.eq(1), resp.status.eq(Status.INSERTED), resp.ptr.eq(head)]
        with m.Elif(gives_up):
            m.d.comb += resp_push.eq(1)
            if S:
                with m.If(self.stash_count != S):
                    m.d.comb += [s_append.eq(1), inc["stashed"].eq(1), resp.status.eq(Status.INSERTED),
                                 resp.ptr.eq(head)]
                with m.Else():
                    m.d.comb += [inc["refused"].eq(1), resp.status.eq(Status.REFUSED)]
            else:
                m.d.comb += [inc["refused"].eq(1), resp.status.eq(Status.REFUSED)]
        m.d.comb += [pop.eq(act.pop | walk.inserted | s_append),
                     inc["inserts"].eq(act.inserted | walk.inserted), inc["full"].eq(act.full),
                     inc["deletes"].eq(act.deleted)]

        # Next cycle's reads: the walker's position while it walks on, else stage R's key. A read of
        # the position written in the same cycle returns the new entry (transparent ports).
        for t in (0, 1):
            m.d.comb += rd[t].addr.eq(Mux(walk.busy_next & (walk.read_table == t), walk.read_addr, r_h[t]))
        # A request issued now answers into the queue two cycles from now at the earliest; by then
        # the register and the decision of this cycle (at most one answer) may have gone in before it.
        level = resp_q.w_level + resp_reg_valid
        if self.domain != "sync":
            # The asynchronous queue's level is a register: it counts a write one cycle late.
            written = Signal()
            m.d.sync += written.eq(resp_q.w_en & resp_q.w_rdy)
            level = level + written
        room = level < resp_q.depth - 1
        m.d.comb += issue.eq(request.valid & ~sweeping & ~walk.busy_next & room)

        # -- the stash, in the model's list order: append at the end, close the gap on removal --
        for i in range(S):
            with m.If(s_append & (self.stash_count == i)):
                m.d.sync += [self.stash_keys[i].eq(d_key), self.stash_ptrs[i].eq(head)]
            if i + 1 < S:
                with m.If(act.stash_remove & lookup.stash_hits[:i + 1].any()):
                    m.d.sync += [self.stash_keys[i].eq(self.stash_keys[i + 1]),
                                 self.stash_ptrs[i].eq(self.stash_ptrs[i + 1])]
        if S:
            m.d.sync += self.stash_count.eq(self.stash_count + s_append - act.stash_remove)

        for name, strobe in inc.items():
            m.d.sync += getattr(counts, name).eq(getattr(counts, name) + strobe)
        m.d.sync += counts.kicks.eq(counts.kicks + Mux(walk.inserted, walk.kicks, 0))
        return top
