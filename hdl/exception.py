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

__all__ = ["Op", "Status", "STATS", "KeyHash", "RequestStages", "CuckooLookup", "request_layout", "response_layout",
           "entry_layout", "stats_layout", "ExceptionEngine"]



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
        entry = entry_layout(self.key_width, cap, T)

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
        r_valid, r_last, r_op, r_key = request.valid, request.last, request.op, request.key
        r_h = [request.h0, request.h1]

        # -- stage D: the two entries are read; decide, write, answer --
        d_valid, d_last = Signal(), Signal()
        d_op = Signal(Op)
        d_key = Signal(self.key_width)
        d_h = [Signal(hbits, name="d_h0"), Signal(hbits, name="d_h1")]
        m.d.sync += d_valid.eq(issue)
        with m.If(issue):
            m.d.sync += [d_op.eq(r_op), d_key.eq(r_key), d_last.eq(r_last), d_h[0].eq(r_h[0]), d_h[1].eq(r_h[1])]
        e = [rd[0].data, rd[1].data]
        m.submodules.lookup = lookup = CuckooLookup(T, S, self.key_width, cap)
        m.d.comb += [lookup.key.eq(d_key), lookup.entries[0].eq(e[0]), lookup.entries[1].eq(e[1])]
        if S:
            m.d.comb += [lookup.stash_count.eq(self.stash_count),
                         *[port.eq(key) for port, key in zip(lookup.stash_keys, self.stash_keys)],
                         *[port.eq(ptr) for port, ptr in zip(lookup.stash_ptrs, self.stash_ptrs)]]
        hit = [lookup.hits[0], lookup.hits[1]]
        in_stash = lookup.stash_hits.any() if S else Const(0, 1)
        found, found_ptr = lookup.found, lookup.ptr

        # -- the walker: carries one entry (key, ptr) to position `here` of table `wt`;
        #    `there` is its position in the other table --
        mode = Signal(_Mode)
        wt = Signal()
        c_key = Signal(self.key_width)
        c_ptr = Signal(range(cap))
        c_here, c_there = Signal(hbits), Signal(hbits)
        kicks = Signal(range(K + 1))
        n_mode = Signal(_Mode)
        n_wt = Signal()
        n_key = Signal.like(c_key)
        n_ptr = Signal.like(c_ptr)
        n_here, n_there = Signal.like(c_here), Signal.like(c_there)
        n_kicks = Signal.like(kicks)
        m.d.comb += [n_mode.eq(mode), n_wt.eq(wt), n_key.eq(c_key), n_ptr.eq(c_ptr), n_here.eq(c_here),
                     n_there.eq(c_there), n_kicks.eq(kicks)]
        m.d.sync += [mode.eq(n_mode), wt.eq(n_wt), c_key.eq(n_key), c_ptr.eq(n_ptr), c_here.eq(n_here),
                     c_there.eq(n_there), kicks.eq(n_kicks)]
        occ = Signal(entry)
        m.d.comb += occ.eq(Mux(wt, e[1], e[0]))

        # Whether the walker reads next cycle, and where: from a few bits and no key comparison, so
        # that the next read address and the issue of the next request stay short paths. They equal
        # n_wt and n_here below whenever the walk goes on. A LOCATE with both positions taken may
        # turn out a hit (no walk); the cycle after it is then idle.
        busy_next, w_table = Signal(), Signal()
        w_addr = Signal(hbits)
        with m.If(mode == _Mode.FORWARD):
            m.d.comb += [busy_next.eq(occ.valid), w_table.eq(~wt), w_addr.eq(Mux(kicks == K, c_there, occ.other))]
        with m.Elif(mode == _Mode.UNDO):
            m.d.comb += [busy_next.eq(kicks != 1), w_table.eq(~wt), w_addr.eq(occ.other)]
        with m.Else():
            if K:
                m.d.comb += busy_next.eq(d_valid & (d_op == Op.LOCATE) & e[0].valid & e[1].valid
                                         & (self.free_count != 0))
            m.d.comb += [w_table.eq(1), w_addr.eq(e[0].other)]

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
        add_kicks = Signal.like(kicks)
        s_append, s_remove = Signal(), Signal()

        def answer(status, ptr=0):
            m.d.comb += [resp_push.eq(1), resp.status.eq(status), resp.ptr.eq(ptr)]

        def write(t, addr, value):
            m.d.comb += [wr[t].en.eq(1), wr[t].addr.eq(addr), wr[t].data.eq(value)]

        def place(t, addr, key, ptr, other):
            v = Signal(entry, name="placed")
            m.d.comb += [v.valid.eq(1), v.key.eq(key), v.ptr.eq(ptr), v.other.eq(other)]
            if isinstance(t, int):
                write(t, addr, v)
            else:
                with m.If(t):
                    write(1, addr, v)
                with m.Else():
                    write(0, addr, v)

        def carry(key, ptr, here, there):
            m.d.comb += [n_key.eq(key), n_ptr.eq(ptr), n_here.eq(here), n_there.eq(there)]

        def stash_or_refuse():
            if S:
                with m.If(self.stash_count != S):
                    m.d.comb += [s_append.eq(1), pop.eq(1), inc["stashed"].eq(1)]
                    answer(Status.INSERTED, head)
                with m.Else():
                    m.d.comb += inc["refused"].eq(1)
                    answer(Status.REFUSED)
            else:
                m.d.comb += inc["refused"].eq(1)
                answer(Status.REFUSED)

        with m.If(sweeping):
            for t in (0, 1):
                m.d.comb += [wr[t].en.eq(sweep < T), wr[t].addr.eq(sweep), wr[t].data.eq(0)]
            m.d.comb += [push.eq(1), push_ptr.eq(sweep)]
        with m.Elif(d_valid):
            with m.Switch(d_op):
                with m.Case(Op.LOOKUP):
                    answer(Mux(found, Status.HIT, Status.MISS), found_ptr)
                with m.Case(Op.LOCATE):
                    with m.If(found):
                        answer(Status.HIT, found_ptr)
                    with m.Elif(self.free_count == 0):
                        m.d.comb += inc["full"].eq(1)
                        answer(Status.REFUSED)
                    with m.Elif(~e[0].valid | ~e[1].valid):
                        with m.If(~e[0].valid):
                            place(0, d_h[0], d_key, head, d_h[1])
                        with m.Else():
                            place(1, d_h[1], d_key, head, d_h[0])
                        m.d.comb += [pop.eq(1), inc["inserts"].eq(1)]
                        answer(Status.INSERTED, head)
                    with m.Else():
                        if K:
                            # The first kick: the new key takes table 0's position; its occupant
                            # goes on to its position in table 1.
                            place(0, d_h[0], d_key, head, d_h[1])
                            carry(e[0].key, e[0].ptr, e[0].other, d_h[0])
                            m.d.comb += [n_mode.eq(_Mode.FORWARD), n_wt.eq(1), n_kicks.eq(1)]
                        else:
                            stash_or_refuse()
                with m.Case(Op.DELETE, Op.TEARDOWN):
                    with m.If(hit[0]):
                        write(0, d_h[0], 0)
                    with m.Elif(hit[1]):
                        write(1, d_h[1], 0)
                    with m.Elif(in_stash):
                        m.d.comb += s_remove.eq(1)
                    with m.If(found):
                        m.d.comb += [push.eq(1), push_ptr.eq(found_ptr), inc["deletes"].eq(1)]
                    with m.If(d_op == Op.DELETE):
                        answer(Mux(found, Status.DELETED, Status.MISS), found_ptr)
                    with m.Elif(d_last):
                        answer(Status.DONE)
        with m.Elif(mode == _Mode.FORWARD):
            with m.If(~occ.valid):
                place(wt, c_here, c_key, c_ptr, c_there)
                m.d.comb += [pop.eq(1), inc["inserts"].eq(1), add_kicks.eq(kicks), n_mode.eq(_Mode.IDLE)]
                answer(Status.INSERTED, head)
            with m.Elif(kicks == K):
                # Chain failed: turn round; the carried key goes back where it was taken from.
                m.d.comb += [n_mode.eq(_Mode.UNDO), n_wt.eq(~wt), n_here.eq(c_there), n_there.eq(c_here)]
            with m.Else():
                place(wt, c_here, c_key, c_ptr, c_there)
                carry(occ.key, occ.ptr, occ.other, c_here)
                m.d.comb += [n_wt.eq(~wt), n_kicks.eq(kicks + 1)]
        with m.Elif(mode == _Mode.UNDO):
            place(wt, c_here, c_key, c_ptr, c_there)
            with m.If(kicks == 1):
                # The occupant is the new key again: every table entry is back where it was.
                stash_or_refuse()
                m.d.comb += n_mode.eq(_Mode.IDLE)
            with m.Else():
                carry(occ.key, occ.ptr, occ.other, c_here)
                m.d.comb += [n_wt.eq(~wt), n_kicks.eq(kicks - 1)]

        # Next cycle's reads: the walker's position while it walks on, else stage R's key. A read of
        # the position written in the same cycle returns the new entry (transparent ports).
        for t in (0, 1):
            m.d.comb += rd[t].addr.eq(Mux(busy_next & (w_table == t), w_addr, r_h[t]))
        # A request issued now answers into the queue two cycles from now at the earliest; by then
        # the register and the decision of this cycle (at most one answer) may have gone in before it.
        level = resp_q.w_level + resp_reg_valid
        if self.domain != "sync":
            # The asynchronous queue's level is a register: it counts a write one cycle late.
            written = Signal()
            m.d.sync += written.eq(resp_q.w_en & resp_q.w_rdy)
            level = level + written
        room = level < resp_q.depth - 1
        m.d.comb += issue.eq(r_valid & ~sweeping & ~busy_next & room)

        # -- the stash, in the model's list order: append at the end, close the gap on removal --
        for i in range(S):
            with m.If(s_append & (self.stash_count == i)):
                m.d.sync += [self.stash_keys[i].eq(d_key), self.stash_ptrs[i].eq(head)]
            if i + 1 < S:
                with m.If(s_remove & lookup.stash_hits[:i + 1].any()):
                    m.d.sync += [self.stash_keys[i].eq(self.stash_keys[i + 1]),
                                 self.stash_ptrs[i].eq(self.stash_ptrs[i + 1])]
        if S:
            m.d.sync += self.stash_count.eq(self.stash_count + s_append - s_remove)

        for name, strobe in inc.items():
            m.d.sync += getattr(counts, name).eq(getattr(counts, name) + strobe)
        m.d.sync += counts.kicks.eq(counts.kicks + add_kicks)
        return top
