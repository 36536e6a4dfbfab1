"""The management bridge: register writes and reads from authenticated frames on a switch port.

:class:`MgmtBridge` watches every beat that a switch port takes (a tap: it
never holds the port back) and keeps the first
:data:`~inagg.models.frame.MGMT_FRAME` bytes of a frame while it is idle.
After the frame's last beat, a frame of the management EtherType goes
through the checks of :class:`inagg.models.mgmt.MgmtBridge`, in its order
(``malformed``, ``bad_op``, then the tag, then the sequence number), one
SipHash round per cycle; a performed request becomes one AXI4-Lite write
or read as a manager of the register map (beside the external one, through
:class:`AXILiteArbiter`), and the response, tagged under the same key,
leaves on :attr:`MgmtBridge.o`. The switch's ingress sees the frame too, and
drops and counts it as any frame that is not RoCEv2 (``DROP_NON_ROCE``).

A request takes 12 cycles for its tag, the register access, and 12 more
for the response's tag before the response's ``ceil(50 * 8 / width)``
beats. A management frame that ends while the bridge serves another is dropped,
counted as ``busy``: a host waits for each answer.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.frame import ETHERNET, MGMT, MGMT_ETHER_TYPE, MGMT_FRAME, MGMT_TAGGED
from inagg.models.mgmt import KEY_BYTES, RESPONSE, Op, Status, initial_state
from inagg.hdl.axis import be_bytes, be_get, beat_layout, beat_signature, check_width
from inagg.hdl.control import AXILiteSignature, MgmtStats
from inagg.hdl.headers import header_value

__all__ = ["AXILiteArbiter", "SipHashRounds", "MgmtBridge", "check_key"]

_M64 = (1 << 64) - 1
_ROUNDS = 2 * ((MGMT_TAGGED + 8) // 8) + 4  # SipHash-2-4: two per block (the last holds the length), four to end


def check_key(key) -> bytes:
    """``key`` as the 16 bytes of a management key; ``ValueError`` for anything else."""
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"Management key must be {KEY_BYTES} bytes, not {key!r}")
    return bytes(key)


class AXILiteArbiter(wiring.Component):
    """Two AXI4-Lite managers onto one subordinate, one whole transaction at a time.

    Between transactions the arbiter grants ``a`` before ``b`` and a write
    before a read, and from the next cycle passes the granted transaction's
    channels through until its response is taken. A manager that is not
    granted sees its ready signals low, so its request waits.

    Parameters
    ----------
    addr_width:
        Bits of the byte address.

    Members
    -------
    a, b : In(AXILiteSignature(addr_width))
        The managers.
    o : Out(AXILiteSignature(addr_width))
        To the subordinate.
    """

    def __init__(self, addr_width: int):
        if not isinstance(addr_width, int) or isinstance(addr_width, bool) or not 2 <= addr_width <= 32:
            raise ValueError(f"Address width must be an integer in 2..32, not {addr_width!r}")
        sig = AXILiteSignature(addr_width)
        super().__init__({"a": In(sig), "b": In(sig), "o": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        o = self.o
        requests, responses = ("awaddr", "awvalid", "wdata", "wstrb", "wvalid", "bready"), \
            ("awready", "wready", "bresp", "bvalid")
        reads, read_back = ("araddr", "arvalid", "rready"), ("arready", "rdata", "rresp", "rvalid")

        def grant(src, names, back):
            return ([getattr(o, n).eq(getattr(src, n)) for n in names]
                    + [getattr(src, n).eq(getattr(o, n)) for n in back])

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.a.awvalid & self.a.wvalid):
                    m.next = "WRITE_A"
                with m.Elif(self.a.arvalid):
                    m.next = "READ_A"
                with m.Elif(self.b.awvalid & self.b.wvalid):
                    m.next = "WRITE_B"
                with m.Elif(self.b.arvalid):
                    m.next = "READ_B"
            for src, name in ((self.a, "A"), (self.b, "B")):
                with m.State(f"WRITE_{name}"):
                    m.d.comb += grant(src, requests, responses)
                    with m.If(o.bvalid & o.bready):
                        m.next = "IDLE"
                with m.State(f"READ_{name}"):
                    m.d.comb += grant(src, reads, read_back)
                    with m.If(o.rvalid & o.rready):
                        m.next = "IDLE"
        return m


def _rotl(x: Value, b: int) -> Value:
    return Cat(x[64 - b:], x[:64 - b])


def _sipround(v0, v1, v2, v3):
    v0 = (v0 + v1)[:64]
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3)[:64]
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3)[:64]
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1)[:64]
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


class SipHashRounds(wiring.Component):
    """SipHash-2-4 of a :data:`~inagg.models.frame.MGMT` header's tagged bytes, one round per cycle.

    The message has a fixed length (:data:`~inagg.models.frame.MGMT_TAGGED`
    bytes), so its blocks, the length byte included, are wires of
    :attr:`header` and the hash takes 2 rounds per block and 4 more, 12
    cycles from :attr:`start` to :attr:`done`.

    Parameters
    ----------
    key:
        The 16-byte key; its initial state is a constant of the gateware.

    Members
    -------
    header : In(8 * MGMT_TAGGED)
        The bytes (byte ``k`` in bits ``8k .. 8k+7``), held from :attr:`start` to :attr:`done`.
    start : In(1)
    done : Out(1)
        Strobes with :attr:`tag` valid; it holds until the next :attr:`start`.
    tag : Out(64)
    """

    def __init__(self, key: bytes):
        self._key = check_key(key)
        super().__init__({"header": In(8 * MGMT_TAGGED), "start": In(1), "done": Out(1), "tag": Out(64)})

    def elaborate(self, platform):
        m = Module()
        init = initial_state(self._key)
        v = [Signal(64, name=f"v{i}") for i in range(4)]
        full = MGMT_TAGGED // 8
        blocks = [self.header[64 * b:64 * b + 64] for b in range(full)]
        blocks.append(Cat(self.header[64 * full:], Const(0, 56 - 8 * (MGMT_TAGGED % 8)), Const(MGMT_TAGGED & 0xFF, 8)))
        r = Signal(range(_ROUNDS + 1), init=_ROUNDS)
        word = Array(blocks)[r[1:1 + (len(blocks) - 1).bit_length()]]
        absorbing = r < 2 * len(blocks)
        pre = [v[0], v[1], Mux(r == 2 * len(blocks), v[2] ^ 0xFF, v[2]), Mux(absorbing & ~r[0], v[3] ^ word, v[3])]
        post = list(_sipround(*pre))
        post[0] = Mux(absorbing & r[0], post[0] ^ word, post[0])
        with m.If(self.start):
            m.d.sync += [r.eq(0)] + [reg.eq(c) for reg, c in zip(v, init)]
        with m.Elif(r < _ROUNDS):
            m.d.sync += [r.eq(r + 1)] + [reg.eq(p) for reg, p in zip(v, post)]
        done = Signal()
        m.d.sync += done.eq(~self.start & (r == _ROUNDS - 1))
        m.d.comb += [self.done.eq(done), self.tag.eq(v[0] ^ v[1] ^ v[2] ^ v[3])]
        return m


def _field(vec: Value, name: str) -> Value:
    """Field ``name`` of the :data:`MGMT` header in the frame bytes ``vec``."""
    off, n = MGMT.span(name)
    return be_get(vec, ETHERNET.size + off, n)


class MgmtBridge(wiring.Component):
    """Management requests from a port's frames to the register map, and their responses (module docstring).

    Parameters
    ----------
    width:
        Beat width of the port, 64, 256 or 512.
    key:
        The board's 16-byte key (:mod:`inagg.models.mgmt`), a constant of the bitstream.
    addr_width:
        Bits of the register map's addresses; a request beyond them is SLVERR without an access.

    Members
    -------
    i : In(stream.Signature(beat_layout(width), always_ready=True))
        Every beat the port takes.
    o : Out(beat_signature(width))
        Responses: ``MGMT_FRAME`` bytes each, to the requester's MAC from :attr:`mac`.
    bus : Out(AXILiteSignature(addr_width))
        The register map, as a manager.
    mac : In(48)
        The switch's MAC (``MAC_HI``, ``MAC_LO``), the responses' source.
    stats : Out(MgmtStats)
        The counters of :data:`~inagg.models.regmap.MGMT_STATS`, 32 bits, wrapping.
    floor : Out(64)
        The last accepted sequence number; 0 after reset.
    """

    def __init__(self, *, width: int, key: bytes, addr_width: int):
        self._width = check_width(width)
        self._key = check_key(key)
        if not isinstance(addr_width, int) or isinstance(addr_width, bool) or not 2 <= addr_width <= 32:
            raise ValueError(f"Address width must be an integer in 2..32, not {addr_width!r}")
        self._addr_width = addr_width
        super().__init__({
            "i": In(stream.Signature(beat_layout(width), always_ready=True)),
            "o": Out(beat_signature(width)),
            "bus": Out(AXILiteSignature(addr_width)),
            "mac": In(48),
            "stats": Out(MgmtStats),
            "floor": Out(64),
        })

    def elaborate(self, platform):
        m = Module()
        width, nbytes, E = self._width, self._width // 8, ETHERNET.size
        m.submodules.hash = hasher = SipHashRounds(self._key)
        beats = -(-MGMT_FRAME // nbytes)

        # -- capture: the first MGMT_FRAME bytes of a frame that starts while the bridge is idle --
        beat = self.i.p
        k = Signal(range(beats + 1))  # beat of the frame, saturating
        buf = Signal(8 * MGMT_FRAME)
        etype = Signal(16)
        capturing = Signal()  # this frame's bytes go to buf
        can_capture = Signal()
        take = Mux(k == 0, can_capture, capturing)

        def reaches(n):  # the frame, ending on this beat, has at least n bytes (keep is packed)
            j, b = divmod(n - 1, nbytes)
            return (k > j) | ((k == j) & beat.keep[b])

        with m.If(self.i.valid):
            m.d.sync += [k.eq(Mux(beat.last, 0, Mux(k == beats, k, k + 1))), capturing.eq(take)]
            for j in range(beats):
                lo, hi = j * nbytes, min(MGMT_FRAME, (j + 1) * nbytes)
                with m.If((k == j) & take):
                    m.d.sync += buf[8 * lo:8 * hi].eq(beat.data[:8 * (hi - lo)])
            off, _ = ETHERNET.span("ether_type")
            for b in (off, off + 1):
                with m.If(k == b // nbytes):
                    m.d.sync += etype.word_select(off + 1 - b, 8).eq(beat.data.word_select(b % nbytes, 8))
        # The frame's verdict inputs, the cycle after its last beat (when buf and etype hold it).
        fin, fin_cap, fin_eth, fin_long = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [fin.eq(self.i.valid & beat.last), fin_cap.eq(take), fin_eth.eq(reaches(E)),
                     fin_long.eq(reaches(MGMT_FRAME))]
        ours = fin & fin_eth & (etype == MGMT_ETHER_TYPE)
        op = _field(buf, "op")
        request = ours & fin_cap & fin_long & ((op == Op.WRITE) | (op == Op.READ))

        # -- counters --
        inc = {name: Signal(name=f"inc_{name}") for name in MgmtStats.members}
        for name, strobe in inc.items():
            counter = getattr(self.stats, name)
            m.d.sync += counter.eq(counter + strobe)
        m.d.comb += [inc["busy"].eq(ours & ~fin_cap), inc["malformed"].eq(ours & fin_cap & ~fin_long),
                     inc["bad_op"].eq(ours & fin_cap & fin_long & ~request)]

        # -- the response, from the request and registers --
        floor, status, rdata, rtag = Signal(64), Signal(2), Signal(32), Signal(64)
        m.d.comb += self.floor.eq(floor)
        src_off, src_len = ETHERNET.span("src")
        dst = Cat(*be_bytes(be_get(buf, src_off, src_len), 6))
        eth = Cat(dst, *be_bytes(self.mac, 6), *be_bytes(MGMT_ETHER_TYPE, 2))
        header = header_value(MGMT, {"op": op | RESPONSE, "status": status, "seq": _field(buf, "seq"),
                                     "addr": _field(buf, "addr"), "data": rdata, "floor": floor, "tag": rtag})
        response = Cat(eth, *be_bytes(header, MGMT.size))
        request_tag = _field(buf, "tag")
        seq, addr, wdata = _field(buf, "seq"), _field(buf, "addr"), _field(buf, "data")
        hashing_response = Signal()
        m.d.comb += hasher.header.eq(Mux(hashing_response, response[8 * E:8 * (E + MGMT_TAGGED)],
                                         buf[8 * E:8 * (E + MGMT_TAGGED)]))

        # At least one bit: where a response is one beat (W = 512), range(1) would make it zero bits wide,
        # which the Verilog back end writes as [-1:0] and Verilator refuses (ASCRANGE).
        bus, n = self.bus, Signal(range(max(beats, 2)))
        m.d.comb += bus.wstrb.eq(0xF)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += can_capture.eq(~request)
                with m.If(request):
                    m.d.comb += hasher.start.eq(1)
                    m.next = "TAG"
            with m.State("TAG"):
                with m.If(hasher.done):
                    with m.If(hasher.tag != request_tag):
                        m.d.comb += inc["bad_tag"].eq(1)
                        m.next = "IDLE"
                    with m.Elif(seq <= floor):
                        m.d.comb += inc["replayed"].eq(1)
                        m.d.sync += [status.eq(Status.REPLAYED), rdata.eq(wdata)]
                        m.next = "RESPOND"
                    with m.Else():
                        m.d.comb += inc["accepted"].eq(1)
                        m.d.sync += [floor.eq(seq), status.eq(Status.OK), rdata.eq(wdata)]
                        with m.If(addr[self._addr_width:] != 0):
                            m.d.sync += [status.eq(Status.SLVERR), rdata.eq(Mux(op == Op.READ, 0, wdata))]
                            m.next = "RESPOND"
                        with m.Elif(op == Op.WRITE):
                            m.next = "WRITE"
                        with m.Else():
                            m.next = "READ"
            with m.State("WRITE"):
                m.d.comb += [bus.awaddr.eq(addr), bus.wdata.eq(wdata), bus.awvalid.eq(1), bus.wvalid.eq(1)]
                with m.If(bus.awready & bus.wready):
                    m.next = "WRITE_RESP"
                with m.Elif(bus.awready):
                    m.next = "WRITE_DATA"
                with m.Elif(bus.wready):
                    m.next = "WRITE_ADDR"
            with m.State("WRITE_ADDR"):
                m.d.comb += [bus.awaddr.eq(addr), bus.awvalid.eq(1)]
                with m.If(bus.awready):
                    m.next = "WRITE_RESP"
            with m.State("WRITE_DATA"):
                m.d.comb += [bus.wdata.eq(wdata), bus.wvalid.eq(1)]
                with m.If(bus.wready):
                    m.next = "WRITE_RESP"
            with m.State("WRITE_RESP"):
                m.d.comb += bus.bready.eq(1)
                with m.If(bus.bvalid):
                    with m.If(bus.bresp != 0):
                        m.d.sync += status.eq(Status.SLVERR)
                    m.next = "RESPOND"
            with m.State("READ"):
                m.d.comb += [bus.araddr.eq(addr), bus.arvalid.eq(1)]
                with m.If(bus.arready):
                    m.next = "READ_RESP"
            with m.State("READ_RESP"):
                m.d.comb += bus.rready.eq(1)
                with m.If(bus.rvalid):
                    m.d.sync += [rdata.eq(Mux(bus.rresp == 0, bus.rdata, 0)),
                                 status.eq(Mux(bus.rresp == 0, Status.OK, Status.SLVERR))]
                    m.next = "RESPOND"
            with m.State("RESPOND"):
                m.d.comb += [hashing_response.eq(1), hasher.start.eq(1)]
                m.next = "RESPONSE_TAG"
            with m.State("RESPONSE_TAG"):
                m.d.comb += hashing_response.eq(1)
                with m.If(hasher.done):
                    m.d.sync += [rtag.eq(hasher.tag), n.eq(0)]
                    m.next = "SEND"
            with m.State("SEND"):
                padded = Cat(response, Const(0, beats * width - 8 * MGMT_FRAME))
                tail = MGMT_FRAME - (beats - 1) * nbytes
                m.d.comb += [self.o.valid.eq(1), self.o.p.data.eq(padded.word_select(n, width)),
                             self.o.p.last.eq(n == beats - 1),
                             self.o.p.keep.eq(Mux(n == beats - 1, (1 << tail) - 1, (1 << nbytes) - 1))]
                with m.If(self.o.ready):
                    m.d.sync += n.eq(n + 1)
                    with m.If(n == beats - 1):
                        m.next = "IDLE"
        return m
