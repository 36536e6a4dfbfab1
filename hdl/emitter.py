"""Result emitter of one egress port: RDMA WRITE WITH IMMEDIATE frames, headers rewritten, ICRC fresh.

The slot engine broadcasts every result payload to all emitters; an emitter
keeps it when one of the result's workers sits on its port, in one of two
buffer entries, and sends one frame per such worker, in worker-index
order, as :mod:`inagg.models.switch` does.

Whether a result goes out as INT32 or as binary32 (ImmDt bit 31) is known
only once its last beat has left the slot pipeline: a promotion in the last
beat changes every lane of the chunk. So a buffer entry holds each beat
twice, the lanes as the slot holds them and every lane as binary32 (the
engine sends both), and a result joins the queue of frames to send only
after its last beat is in; the head's flag then picks one of the two
copies. The entry is reserved from the first beat on, so the engine never
overruns the buffer. Holding the start costs the result latency of one
chunk's beats; throughput is unchanged, since the buffer takes a beat per
cycle and the frames of one result take longer than its beats.

Each beat goes through two registers before the port, ``b`` and ``o``: the
ICRC generator takes its beat from ``b``, so that the buffer read and the
beat multiplexer have a cycle and the generator's XOR tree another, and it
has seen the frame's last data bytes when the beat that carries the ICRC
leaves ``o``. The header is built into a register in the cycle before the
frame (``LOAD``), and the payload is read from the buffer, a block RAM,
one beat ahead. The second register costs a cycle of latency, which the
emitter wins back between results: it picks a frame's worker in the cycle
it sees the result (or the frame before ends), not in a cycle of its own.
"""

from __future__ import annotations

import enum

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, memory, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.frame import IPV4, RESULT, Opcode
from inagg.models.protocol import (
    ETH_LEN, ICRC_LEN, IMM_CHUNK_MASK, IPV4_LEN, QP_SPORT_BASE, QP_SPORT_QPN_BITS, RESULT_HDR_LEN, Counter,
)
from inagg.hdl.axis import beat_signature, check_chunk_bytes, check_slots, check_width
from inagg.hdl.control import N_COUNTERS, SwitchConfig, WorkerRead, event_vector
from inagg.hdl.engine import result_desc_layout, result_signature
from inagg.hdl.headers import header_bytes, header_value
from inagg.hdl.icrc import ICRCGenerator, icrc_mask

__all__ = ["ipv4_checksum", "to_worker", "ResultEmitter"]

_ENTRIES = 2


def ipv4_checksum(words):
    """The IPv4 header checksum of 16-bit ``words`` (checksum field as 0), as ``wire.ipv4_checksum`` folds it."""
    total = sum(words)
    fold1 = (total[:16] + total[16:])
    fold2 = (fold1[:16] + fold1[16:])[:16]
    return ~fold2


def to_worker(entry, switch, frame_len: int) -> dict:
    """The Ethernet, IPv4 and UDP fields (``"header.field"``) of a frame of ``frame_len`` bytes (ICRC included)
    from the switch to the worker ``entry`` describes: its MAC and IP, the UDP source port of its QP
    (:func:`~inagg.models.protocol.qp_udp_sport`), the lengths and the IPv4 checksum."""
    total = frame_len - ETH_LEN
    ipv4 = {"total_len": total, "src": switch.ip, "dst": entry.ip}
    zeroed = header_value(IPV4, {**ipv4, "checksum": 0})
    words = IPV4.size // 2
    csum = ipv4_checksum([zeroed.word_select(words - 1 - k, 16) for k in range(words)])
    sport = Cat(entry.qpn[:QP_SPORT_QPN_BITS], Const(QP_SPORT_BASE >> QP_SPORT_QPN_BITS, 16 - QP_SPORT_QPN_BITS))
    return {"ethernet.dst": entry.mac, "ethernet.src": switch.mac, **{f"ipv4.{k}": v for k, v in ipv4.items()},
            "ipv4.checksum": csum, "udp.sport": sport, "udp.len": total - IPV4_LEN}


class _State(enum.Enum):
    IDLE = 0
    LOAD = 1
    FRAME = 2


class ResultEmitter(wiring.Component):
    """The result frames of one port (see the module docstring).

    Parameters
    ----------
    width, chunk_bytes, slots:
        The switch's beat width, chunk size and slot count.
    jobs, workers:
        Geometry of the worker table.
    port:
        This emitter's port number.
    port_bits:
        Width of a worker's port number in ``ports``.

    Members
    -------
    i : In(result_signature(width, slots))
        Every result payload of the engine.
    o : Out(beat_signature(width))
        Frames to the port.
    space : Out(1)
        A buffer entry is free: the engine may start one more contribution.
    worker : Out(WorkerRead())
        The worker table, read for the worker of the frame being sent.
    ports : In(jobs * workers * port_bits)
        Every worker's port.
    switch : In(SwitchConfig)
        The switch's own addresses and P_Key.
    events : Out(N_COUNTERS)
        ``TX_RESULTS`` strobes.
    """

    def __init__(self, *, width: int, chunk_bytes: int, slots: int, jobs: int, workers: int, port: int,
                 port_bits: int):
        self._width = check_width(width)
        self._chunk = check_chunk_bytes(chunk_bytes)
        self._slots = check_slots(slots)
        self._jobs, self._workers, self._port, self._port_bits = jobs, workers, port, port_bits
        super().__init__({
            "i": In(result_signature(width, slots)),
            "o": Out(beat_signature(width)),
            "space": Out(1),
            "worker": Out(WorkerRead()),
            "ports": In(jobs * workers * port_bits),
            "switch": In(SwitchConfig),
            "events": Out(N_COUNTERS),
        })

    def _header(self, entry, switch, psn, va, chunk, fp32, rc):
        """The 74 header bytes of a result to the worker ``entry`` describes, its ring entry at ``va``.

        ``rc``: a Mode II result, RC WRITE ONLY WITH IMMEDIATE with AckReq
        (``docs/protocol.md`` section 6.2), else the UC opcode. Fields not
        given here (IPv4 version and flags, TTL, the UDP port and checksum,
        the other BTH flags) take their fixed values of :mod:`inagg.models.frame`.
        """
        c = self._chunk
        return header_bytes(RESULT, {
            **to_worker(entry, switch, RESULT_HDR_LEN + c + ICRC_LEN),
            "bth.opcode": Mux(rc, Opcode.RC_RDMA_WRITE_ONLY_IMM, RESULT.opcode), "bth.ackreq": rc,
            "bth.pkey": switch.pkey, "bth.dqpn": entry.qpn, "bth.psn": psn,
            "reth.va": va, "reth.rkey": entry.rkey, "reth.dma_len": c,
            "immdt.imm": Cat(chunk[:IMM_CHUNK_MASK.bit_length()], Const(0, 1), fp32),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self._width // 8
        beats = self._chunk // nb
        workers = self._workers
        # Block RAM whatever its size: Yosys maps the W = 512 buffer (32 words) to distributed RAM
        # otherwise, whose read is asynchronous, so the read port's register lands on the address and
        # the read (fanned out to 1,024 bits), the beat multiplexer and what follows make one path.
        m.submodules.buf = buf = memory.Memory(shape=data.StructLayout({"data": self._width, "fp": self._width}),
                                               depth=_ENTRIES * beats, init=[], attrs={"ram_style": "block"})
        qlayout = data.StructLayout({"desc": result_desc_layout(self._slots), "mask": workers, "fp32": 1})
        m.submodules.queue = queue = fifo.SyncFIFO(width=qlayout.size, depth=_ENTRIES)
        q, r = divmod(RESULT_HDR_LEN, nb)
        n_beats = q + beats + 1
        # Masked beats, and a frame's last beat holds byte `end - 1` (r > 0 at every width): the
        # generator's XOR tree takes a register's output with no compare in front of it.
        m.submodules.icrc = gen = ICRCGenerator(self._width, RESULT_HDR_LEN + self._chunk, beats=n_beats, masked=True)

        def port_of(job, w):
            return self.ports.word_select(job * workers + w, self._port_bits)

        # -- take the results that have a worker on this port --
        used = Signal(range(_ENTRIES + 1))
        m.d.comb += self.space.eq(used < _ENTRIES)
        d = self.i.p.desc
        mask = Signal(workers)
        with m.If(d.all):
            m.d.comb += mask.eq(Cat(*[(w < d.workers) & (port_of(d.job, w) == self._port) for w in range(workers)]))
        with m.Else():
            m.d.comb += mask.eq((port_of(d.job, d.worker) == self._port) << d.worker)
        wr = buf.write_port()
        wr_entry = Signal(range(_ENTRIES))
        wj = Signal(range(beats))
        mine = Signal()
        start = self.i.valid & self.i.p.first & (mask != 0)
        keep = self.i.valid & Mux(self.i.p.first, mask != 0, mine)
        m.d.comb += [wr.addr.eq(Cat(wj, wr_entry)), wr.data.data.eq(self.i.p.data), wr.data.fp.eq(self.i.p.fp),
                     wr.en.eq(keep), queue.w_data.eq(Cat(d, mask, self.i.p.promoted)),
                     queue.w_en.eq(keep & self.i.p.last)]
        with m.If(self.i.valid & self.i.p.first):
            m.d.sync += mine.eq(mask != 0)
        with m.If(keep):
            m.d.sync += wj.eq(Mux(self.i.p.last, 0, wj + 1))
            with m.If(self.i.p.last):
                m.d.sync += wr_entry.eq(wr_entry + 1)
        done_entry = Signal()
        m.d.sync += used.eq(used + start - done_entry)

        # -- send one frame per worker of the head result --
        head = data.View(qlayout, queue.r_data)
        rd_entry = Signal(range(_ENTRIES))
        rem = Signal(workers)
        w = Signal(range(workers))
        i = Signal(range(n_beats + 1))
        entry = self.worker.entry
        m.d.comb += self.worker.index.eq(head.desc.job * workers + w)
        va = Signal(64)
        m.d.comb += va.eq(entry.va + head.desc.ring * self._chunk)
        # The header is built in LOAD, from the worker-table read and the worker's PSN before
        # its increment, into a register: the table read, the address adder and the IPv4
        # checksum's adders get a cycle of their own instead of sitting in front of the beat
        # mux and the ICRC generator's XOR tree (the W = 256 switch's worst path).
        hdr = Signal(8 * RESULT_HDR_LEN)

        # The payload is read one beat ahead into the read port's register (address `i + 1`
        # while the frame advances to beat `i + 1`), and the beat before the current one is the
        # last beat read, kept in `prv_data`: one read port, whose register is the block RAM's.
        cur = buf.read_port(transparent_for=())
        m.d.comb += cur.addr.eq(Cat((i + 1 - q)[:len(wj)], rd_entry))
        cur_data = Mux(head.fp32, cur.data.fp, cur.data.data)
        prv_data = Signal(self._width)
        split = 8 * (nb - r)
        hdr_pad = Signal((q + 1) * self._width)
        m.d.comb += hdr_pad.eq(hdr)
        g_data = Signal(self._width)
        g_keep = Signal(nb)
        g_last = i == n_beats - 1
        with m.If(i < q):
            m.d.comb += g_data.eq(hdr_pad.word_select(i, self._width))
        with m.Elif(i == q):
            m.d.comb += g_data.eq(Cat(hdr_pad[q * self._width:len(hdr)], cur_data[:split]))
        with m.Elif(g_last):
            m.d.comb += g_data.eq(prv_data[split:])
        with m.Else():
            m.d.comb += g_data.eq(Cat(prv_data[split:], cur_data[:split]))
        m.d.comb += g_keep.eq(Mux(g_last, (1 << (r + ICRC_LEN)) - 1, (1 << nb) - 1))

        # Two registers: `b` takes the beat from the read port and the multiplexer, the generator
        # takes it from `b` (so the buffer read and the generator's XOR tree of W + 32 inputs,
        # the W = 512 switch's worst path, are a cycle each), and `o` holds the beat before the
        # port while the generator steps, so that the ICRC is ready when the last beat leaves.
        # The generator's copy of `b`, `b_icrc`, is masked before the register, so that the XOR
        # tree starts at flip-flops; the bytes after the ICRC's offset are zero in `g_data`
        # already, and the bytes the masks leave alone are `b_data`'s (Yosys merges those).
        b_valid, b_last = Signal(), Signal()
        b_data = Signal(self._width, reset_less=True)
        b_icrc = Signal(self._width, reset_less=True)
        b_keep = Signal(nb, reset_less=True)
        b_beat = Signal(range(n_beats), reset_less=True)
        o_valid, o_last = Signal(), Signal()
        o_data = Signal(self._width, reset_less=True)
        o_keep = Signal(nb, reset_less=True)
        g_valid = Signal()
        move = b_valid & (~o_valid | self.o.ready)
        adv = g_valid & (~b_valid | move)
        m.d.comb += [gen.valid.eq(move), gen.beat.eq(b_beat), gen.data.eq(b_icrc), cur.en.eq(adv)]
        with m.If(adv):
            m.d.sync += prv_data.eq(cur_data)
        with m.If(move):
            m.d.sync += [b_valid.eq(0), o_valid.eq(1), o_data.eq(b_data), o_keep.eq(b_keep), o_last.eq(b_last)]
        with m.Elif(self.o.ready):
            m.d.sync += o_valid.eq(0)
        with m.If(adv):
            m.d.sync += [b_valid.eq(1), b_data.eq(g_data), b_icrc.eq(icrc_mask(g_data, i, self._width)),
                         b_keep.eq(g_keep), b_last.eq(g_last), b_beat.eq(i)]
        m.d.comb += [
            self.o.valid.eq(o_valid), self.o.p.keep.eq(o_keep), self.o.p.last.eq(o_last),
            self.o.p.data.eq(Mux(o_last, o_data | (gen.value << (8 * r)), o_data)),
        ]

        sent = Signal()
        m.d.comb += self.events.eq(event_vector({Counter.TX_RESULTS: sent}))
        # The workers still to send the head result to, as this cycle leaves them: the head's
        # mask when it reaches the queue's head, the rest when a frame ends. The next worker is
        # picked in that same cycle, so a frame's LOAD follows at once.
        todo = Signal(workers)
        pick = Signal()
        with m.If(pick):
            m.d.sync += rem.eq(todo)
            with m.If(todo == 0):
                m.d.comb += [queue.r_en.eq(1), done_entry.eq(1)]
                m.d.sync += rd_entry.eq(rd_entry + 1)
            with m.Else():
                for k in reversed(range(workers)):
                    with m.If(todo[k]):
                        m.d.sync += w.eq(k)
        with m.FSM():
            with m.State(_State.IDLE):
                m.d.comb += [todo.eq(head.mask), pick.eq(queue.r_rdy)]
                with m.If(queue.r_rdy & (head.mask != 0)):
                    m.next = _State.LOAD
            with m.State(_State.LOAD):
                # A Mode II result has its contributions' PSN; a UC one the worker's next result PSN.
                rc = head.desc.translated
                m.d.sync += [hdr.eq(self._header(entry, self.switch, Mux(rc, head.desc.psn, entry.psn), va,
                                                 head.desc.chunk, head.fp32, rc)),
                             i.eq(0)]
                m.d.comb += [self.worker.psn_inc.eq(~rc), sent.eq(1)]
                m.next = _State.FRAME
            with m.State(_State.FRAME):
                m.d.comb += [g_valid.eq(1), todo.eq(rem & ~(Const(1, workers) << w)[:workers])]
                with m.If(adv):
                    m.d.sync += i.eq(i + 1)
                    with m.If(g_last):
                        m.d.comb += pick.eq(1)
                        with m.If(todo == 0):
                            m.next = _State.IDLE
                        with m.Else():
                            m.next = _State.LOAD
        return m
