"""MSCCL's XML algorithm format: export, a validator of the runtime's rules, and import back to the IR.

The MSCCL runtime (the msccl-executor NCCL fork, loaded through
``MSCCL_XML_FILES``) runs an algorithm written as::

    <algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
      <gpu id i_chunks o_chunks s_chunks>
        <tb id send recv chan>
          <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>

Every GPU runs its thread blocks (``tb``) concurrently; a thread block runs
its steps in order, talks to at most one send peer and one receive peer, on
one channel. The k-th send of thread block (g, send=p, chan=c) is received
by the k-th receive of the thread block (p, recv=g, chan=c). A step waits
for step ``deps`` of thread block ``depid`` of the same GPU when ``depid``
is not -1; that step must say ``hasdep="1"`` so it raises the flag. A step
carries one dependency; ``nop`` steps carry extra ones for the next step.
Step types, with what they do to the chunks ``[off, off + cnt)``:

=======  ==================================================================
``s``    send ``src``
``r``    receive into ``dst``
``rrc``  ``dst = src + received``
``rrs``  send ``src + received`` on (nothing stored)
``rcs``  receive into ``dst`` and send it on
``rrcs`` ``dst = src + received`` and send it on
``cpy``  ``dst = src`` (local)
``re``   ``dst += src`` (local)
``nop``  only waits for its dependency
=======  ==================================================================

Buffers are ``i``, ``o`` and ``s`` (input, output, scratch). In place, input
and output are the same memory as NCCL defines it: all-reduce ``i == o``,
all-gather ``i`` is rank r's block of ``o``, reduce-scatter ``o`` is rank
r's block of ``i``. The runtime cuts the user buffer into ``nchunksperloop``
chunks (a chunk is ``1/nchunksperloop`` of the largest buffer).

:func:`export` lowers a concrete :class:`~inagg.host.schedules.ir.Schedule`
(:func:`lower`), :func:`problems` lists what breaks the runtime's rules in a
file (:data:`LIMITS` are the runtime's compile-time limits), and
:func:`load` turns a file back into a schedule so that
:func:`~inagg.host.schedules.executor.check` proves what it computes.
Schedules with switch nodes (``ina``) have no MSCCL equivalent and are
refused.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import xml.etree.ElementTree as ET

import numpy as np

from inagg.host.schedules.ir import Buffer, Collective, Row, Schedule, ScheduleBuilder

__all__ = ["MscclError", "Limits", "LIMITS", "Program", "lower", "export", "parse", "problems", "validate",
           "to_schedule", "load", "dependencies"]


class MscclError(ValueError):
    """A schedule cannot be exported, or a file breaks MSCCL's rules (``problems`` lists them)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


@dataclasses.dataclass(frozen=True)
class Limits:
    """Compile-time limits of the MSCCL runtime (msccl-executor ``msccl_struct.h``).

    Some builds use ``max_steps=64``; pass ``Limits(max_steps=64)`` for those.
    """

    max_steps: int = 256          # MSCCL_MAX_NUM_STEPS: steps per thread block
    max_count: int = 72           # MSCCL_MAX_COUNT: cnt must stay below it
    max_channels: int = 32        # MAXCHANNELS
    tbs_per_channel: int = 32     # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL: send (recv) peers per channel
    max_offset: int = 32767       # offsets are int16
    max_dep_tb: int = 127         # dependentBid is int8


LIMITS = Limits()

TYPES = ("s", "r", "rrc", "rrs", "rcs", "rrcs", "cpy", "re", "nop")
_T = {t: i for i, t in enumerate(TYPES)}
_SENDS = np.array([t in ("s", "rrs", "rcs", "rrcs") for t in TYPES])
_RECVS = np.array([t in ("r", "rrc", "rrs", "rcs", "rrcs") for t in TYPES])
# operands the runtime touches in this GPU's own buffers
_LOCAL_SRC = np.array([t in ("s", "rrc", "rrs", "rrcs", "cpy", "re") for t in TYPES])
_LOCAL_DST = np.array([t in ("r", "rrc", "rcs", "rrcs", "cpy", "re") for t in TYPES])
_BUFS = ("i", "o", "s")
_COLLS = {"allreduce": Collective.ALLREDUCE, "reducescatter": Collective.REDUCE_SCATTER,
          "allgather": Collective.ALLGATHER, "alltoall": Collective.ALLTOALL}
_KNOWN_COLLS = ("allreduce", "reducescatter", "allgather", "alltoall", "alltoallv", "broadcast", "reduce",
                "send", "recv", "gather", "scatter")
_PROTOS = ("Simple", "LL", "LL128")
_ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
               "minBytes", "maxBytes")
_STEP_FIELDS = ("gpu", "tb", "s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")


@dataclasses.dataclass
class Program:
    """An MSCCL algorithm as tables (one numpy column per attribute).

    ``algo`` holds the ``<algo>`` attributes; ``gpus`` the columns ``id,
    i_chunks, o_chunks, s_chunks``; ``tbs`` the columns ``gpu, id, send,
    recv, chan``; ``steps`` the columns of :data:`_STEP_FIELDS` (``type``,
    ``srcbuf`` and ``dstbuf`` as indices into :data:`TYPES` and ``i, o, s``),
    in file order.
    """

    algo: dict
    gpus: dict[str, np.ndarray]
    tbs: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]

    def to_xml(self) -> str:
        """The file text (``ET.indent``-ed, one element per line)."""
        root = ET.Element("algo", {k: str(self.algo[k]) for k in _ALGO_ATTRS})
        g, t, st = self.gpus, self.tbs, self.steps
        tb_order = np.lexsort((t["id"], t["gpu"]))
        step_order = np.lexsort((st["s"], st["tb"], st["gpu"]))
        # steps of thread block (gpu, id) are the slice between these cuts
        keys = st["gpu"][step_order] * (int(t["id"].max(initial=0)) + 1) + st["tb"][step_order]
        tkeys = t["gpu"][tb_order] * (int(t["id"].max(initial=0)) + 1) + t["id"][tb_order]
        lo = np.searchsorted(keys, tkeys, side="left")
        hi = np.searchsorted(keys, tkeys, side="right")
        gpu_el = {}
        for i in np.argsort(g["id"], kind="stable"):
            gpu_el[int(g["id"][i])] = ET.SubElement(root, "gpu", {
                "id": str(int(g["id"][i])), "i_chunks": str(int(g["i_chunks"][i])),
                "o_chunks": str(int(g["o_chunks"][i])), "s_chunks": str(int(g["s_chunks"][i]))})
        cols = {k: st[k][step_order].tolist() for k in _STEP_FIELDS}
        for j, i in enumerate(tb_order):
            tb_el = ET.SubElement(gpu_el[int(t["gpu"][i])], "tb", {
                "id": str(int(t["id"][i])), "send": str(int(t["send"][i])), "recv": str(int(t["recv"][i])),
                "chan": str(int(t["chan"][i]))})
            for k in range(lo[j], hi[j]):
                ET.SubElement(tb_el, "step", {
                    "s": str(cols["s"][k]), "type": TYPES[cols["type"][k]],
                    "srcbuf": _BUFS[cols["srcbuf"][k]], "srcoff": str(cols["srcoff"][k]),
                    "dstbuf": _BUFS[cols["dstbuf"][k]], "dstoff": str(cols["dstoff"][k]),
                    "cnt": str(cols["cnt"][k]), "depid": str(cols["depid"][k]), "deps": str(cols["deps"][k]),
                    "hasdep": str(cols["hasdep"][k])})
        ET.indent(root, space="  ")
        return ET.tostring(root, encoding="unicode") + "\n"


# ------------------------------------------------------------------ export
def _segments(lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For CSR lengths: the segment of every flat entry and its position inside the segment."""
    seg = np.repeat(np.arange(len(lens)), lens)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return seg, np.arange(int(lens.sum())) - starts[seg]


def _msccl_collective(s: Schedule) -> str:
    coll = s.collective
    if coll is Collective.ALLTOALLV:
        k = s.counts.flat[0]
        if k < 1 or (s.counts != k).any():
            raise MscclError(f"{s.name}: MSCCL's XML has no per-pair send counts; only an all-to-allv with "
                             f"equal counts (an all-to-all) can be exported")
        return "alltoall"
    names = {Collective.ALLREDUCE: "allreduce", Collective.REDUCE_SCATTER: "reducescatter",
             Collective.ALLGATHER: "allgather", Collective.ALLTOALL: "alltoall"}
    if coll not in names:
        raise MscclError(f"{s.name}: {coll.value} cannot be exported to MSCCL "
                         f"(exportable: allreduce, reduce_scatter, allgather, alltoall)")
    return names[coll]


def dependencies(gpu, order, tb, reads, writes) -> tuple[np.ndarray, np.ndarray]:
    """The cross-thread-block dependencies MSCCL needs: ``(op, op it waits for)`` pairs.

    ``gpu``, ``order`` (program order on the GPU) and ``tb`` are per op;
    ``reads`` and ``writes`` are ``(op, buffer, chunk)`` arrays of the
    chunks each op reads and writes locally. An op waits for the last
    writer of every chunk it reads and, for every chunk it writes, for the
    readers since the last write (or that write, if there were none) --
    read-after-write, write-after-read and write-after-write. Several waits
    on one thread block keep only its latest step, and a wait that an
    earlier op of the same thread block already made is dropped.
    """
    gpu, order, tb = (np.asarray(a, dtype=np.int64) for a in (gpu, order, tb))
    op = np.concatenate([reads[0], writes[0]])
    buf = np.concatenate([reads[1], writes[1]])
    chunk = np.concatenate([reads[2], writes[2]])
    is_w = np.concatenate([np.zeros(len(reads[0]), bool), np.ones(len(writes[0]), bool)])
    # per slot (gpu, buffer, chunk) in program order; an op's read comes before its own write
    srt = np.lexsort((is_w, order[op], chunk, buf, gpu[op]))
    op, buf, chunk, is_w = op[srt], buf[srt], chunk[srt], is_w[srt]
    n = len(op)
    if not n:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    idx = np.arange(n)
    new_slot = np.ones(n, bool)
    new_slot[1:] = (gpu[op][1:] != gpu[op][:-1]) | (buf[1:] != buf[:-1]) | (chunk[1:] != chunk[:-1])
    slot_start = np.maximum.accumulate(np.where(new_slot, idx, 0))
    last_w = np.maximum.accumulate(np.where(is_w, idx, -1))
    prev_w = np.concatenate([[-1], last_w[:-1]])
    prev_w = np.where(prev_w >= slot_start, prev_w, -1)  # the last write strictly before, in this slot
    xs, ys = [], []
    has_w = prev_w >= 0
    rd = ~is_w & has_w
    xs.append(op[rd])
    ys.append(op[prev_w[rd]])
    lo = np.maximum(prev_w + 1, slot_start)
    nreaders = np.where(is_w, idx - lo, 0)
    wr_alone = is_w & (nreaders == 0) & has_w
    xs.append(op[wr_alone])
    ys.append(op[prev_w[wr_alone]])
    wr = np.flatnonzero(nreaders > 0)
    seg, pos = _segments(nreaders[wr])
    xs.append(op[wr[seg]])
    ys.append(op[lo[wr][seg] + pos])
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    keep = tb[x] != tb[y]
    x, y = x[keep], y[keep]
    # per (op, thread block waited for): the latest step; then drop what the thread block already waited for
    srt = np.lexsort((order[y], order[x], tb[y], tb[x]))
    x, y = x[srt], y[srt]
    last = np.ones(len(x), bool)
    last[:-1] = (x[1:] != x[:-1]) | (tb[y][1:] != tb[y][:-1])
    x, y = x[last], y[last]
    grp = np.ones(len(x), bool)
    grp[1:] = (tb[x][1:] != tb[x][:-1]) | (tb[y][1:] != tb[y][:-1])
    oy = order[y]
    big = int(order.max()) + 2 if len(order) else 2
    # running max of the waited-for order inside each (tb, tb waited for) group, offset so groups do not mix
    gid = np.cumsum(grp) - 1
    run = np.maximum.accumulate(gid * big + oy)
    prev = np.concatenate([[-1], run[:-1]])
    fresh = grp | (oy + gid * big > prev)
    return x[fresh], y[fresh]


def lower(schedule: Schedule, *, proto: str = "Simple", name: str | None = None,
          limits: Limits = LIMITS) -> Program:
    """The MSCCL program of a concrete schedule (see the module docstring for the format).

    Every row becomes one step per run of consecutive chunks (at most
    ``limits.max_count - 1`` each): a transfer a send on its source and a
    receive (``r``, or ``rrc`` for a receive-reduce) on its destination, a
    copy ``cpy`` and a reduce ``re``. Each GPU gets one thread block per
    (send peer, channel), one per (receive peer, channel) and one for its
    local steps; a thread block lists its steps in the schedule's order
    (step, then the phases of :mod:`inagg.host.schedules.ir`), sends sorted
    like their receives so the k-th send meets the k-th receive. Waits
    between thread blocks come from :func:`dependencies`.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"lower needs a Schedule, not {type(schedule).__name__}")
    s = schedule
    if s.nswitches:
        raise MscclError(f"{s.name}: the schedule has {s.nswitches} switch node(s) that reduce in the network; "
                         f"MSCCL programs run on GPUs only, so in-network schedules cannot be exported")
    if not s.concrete:
        raise MscclError(f"{s.name}: an abstract schedule (chunk counts only) cannot be exported")
    if proto not in _PROTOS:
        raise MscclError(f"proto must be one of {', '.join(_PROTOS)}, not {proto!r}")
    coll = _msccl_collective(s)
    n = s.nranks
    if s.nchannels > limits.max_channels:
        raise MscclError(f"{s.name}: {s.nchannels} channels, the runtime allows {limits.max_channels}")
    cap = limits.max_count - 1

    # runs of consecutive chunks on both sides, cut at `cap`
    row, _ = _segments(s.count)
    si = s.src_idx.astype(np.int64)
    di = s.dst_idx.astype(np.int64)
    brk = np.ones(len(row), bool)
    brk[1:] = (row[1:] != row[:-1]) | (si[1:] != si[:-1] + 1) | (di[1:] != di[:-1] + 1)
    first = np.flatnonzero(brk)
    in_run = np.arange(len(row)) - first[np.cumsum(brk) - 1]
    brk |= in_run % cap == 0
    start = np.flatnonzero(brk)
    rrow = row[start]
    cnt = np.diff(np.append(start, len(row)))
    soff, doff = si[start], di[start]
    kind = s.kind[rrow]
    xfer = kind <= Row.TRANSFER_REDUCE

    # ops: one per run, plus the receive of every transfer run
    runs = np.arange(len(start))
    xr = runs[xfer]
    o_run = np.concatenate([runs, xr])
    is_recv = np.concatenate([np.zeros(len(runs), bool), np.ones(len(xr), bool)])
    k = kind[o_run]
    typ = np.where(~is_recv & (k <= Row.TRANSFER_REDUCE), _T["s"],
                   np.where(is_recv & (k == Row.TRANSFER), _T["r"],
                            np.where(is_recv, _T["rrc"], np.where(k == Row.COPY, _T["cpy"], _T["re"]))))
    src_node = s.src[rrow][o_run].astype(np.int64)
    dst_node = s.dst[rrow][o_run].astype(np.int64)
    gpu = np.where(is_recv, dst_node, src_node)
    peer = np.where(typ == _T["s"], dst_node, np.where(is_recv, src_node, -1))
    role = np.where(typ == _T["s"], 1, np.where(is_recv, 2, 0))
    chan = np.where(role > 0, s.channel[rrow][o_run], 0).astype(np.int64)
    # phase in the step: send, receive, receive-reduce, copy, reduce; sends sort like their receives
    phase = np.select([role == 1, typ == _T["r"], typ == _T["rrc"], typ == _T["cpy"]], [0, 1, 2, 3], 4)
    rphase = np.where(role == 1, np.where(k == Row.TRANSFER, 1, 2), 0)
    step = s.step[rrow][o_run].astype(np.int64)
    order_idx = np.lexsort((o_run, rphase, phase, step, gpu))
    order = np.empty(len(order_idx), np.int64)
    order[order_idx] = np.arange(len(order_idx))

    # operands: the local side of each op, and the remote side as MSCCL tools write it
    sbuf_ir = s.src_buf[rrow][o_run].astype(np.int64)
    dbuf_ir = s.dst_buf[rrow][o_run].astype(np.int64)
    so, do = soff[o_run], doff[o_run]
    c = cnt[o_run]
    src_b, src_o = sbuf_ir.copy(), so.copy()
    dst_b, dst_o = dbuf_ir.copy(), do.copy()
    rrc = typ == _T["rrc"]
    src_b[rrc], src_o[rrc] = dbuf_ir[rrc], do[rrc]  # the runtime reads dst = src + received locally

    # thread blocks: local first, then sends and receives by peer and channel
    tb_key = ((gpu * 3 + role) * (n + 1) + (peer + 1)) * (limits.max_channels + 1) + chan
    ukeys, tb = np.unique(tb_key, return_inverse=True)
    tb_gpu = ukeys // ((limits.max_channels + 1) * (n + 1) * 3)
    tb_first = np.searchsorted(tb_gpu, np.arange(n))
    tb_local = np.arange(len(ukeys)) - tb_first[tb_gpu]
    rest = ukeys % ((limits.max_channels + 1) * (n + 1) * 3)
    tb_role = rest // ((limits.max_channels + 1) * (n + 1))
    tb_peer = (rest // (limits.max_channels + 1)) % (n + 1) - 1
    tb_chan = rest % (limits.max_channels + 1)

    # dependencies between thread blocks, from the chunks each op touches
    reads_op = np.flatnonzero(_LOCAL_SRC[typ] & (typ != _T["rrc"]))
    writes_op = np.flatnonzero(_LOCAL_DST[typ])
    rseg, rpos = _segments(c[reads_op])
    wseg, wpos = _segments(c[writes_op])
    reads = (reads_op[rseg], src_b[reads_op][rseg], src_o[reads_op][rseg] + rpos)
    writes = (writes_op[wseg], dst_b[writes_op][wseg], dst_o[writes_op][wseg] + wpos)
    wx, wy = dependencies(gpu, order, tb, reads, writes)

    # place the steps: an op with d waits takes d-1 nops before it
    ndeps = np.bincount(wx, minlength=len(typ))
    extra = np.maximum(ndeps - 1, 0)
    by_tb = np.lexsort((order, tb))
    tb_sorted = tb[by_tb]
    tb_start = np.searchsorted(tb_sorted, np.arange(len(ukeys)))
    shifted = np.cumsum(extra[by_tb] + 1)
    base = np.concatenate([[0], shifted])[tb_start]
    slot = np.empty(len(typ), np.int64)
    slot[by_tb] = shifted - 1 - base[tb_sorted]
    # the op keeps its last wait, the nops before it take the others
    srt = np.lexsort((order[wy], wx))
    wx, wy = wx[srt], wy[srt]
    k_of = np.arange(len(wx)) - np.searchsorted(wx, wx)
    on_op = k_of == ndeps[wx] - 1
    depid = np.full(len(typ), -1, np.int64)
    deps = np.full(len(typ), -1, np.int64)
    depid[wx[on_op]] = tb_local[tb[wy[on_op]]]
    deps[wx[on_op]] = slot[wy[on_op]]
    hasdep = np.zeros(len(typ), np.int64)
    hasdep[wy] = 1
    nx, ny = wx[~on_op], wy[~on_op]
    nop_slot = slot[nx] - extra[nx] + k_of[~on_op]

    steps = {
        "gpu": np.concatenate([gpu, gpu[nx]]),
        "tb": np.concatenate([tb_local[tb], tb_local[tb[nx]]]),
        "s": np.concatenate([slot, nop_slot]),
        "type": np.concatenate([typ, np.full(len(nx), _T["nop"])]),
        "srcbuf": np.concatenate([src_b, np.zeros(len(nx), np.int64)]),
        "srcoff": np.concatenate([src_o, np.full(len(nx), -1)]),
        "dstbuf": np.concatenate([dst_b, np.ones(len(nx), np.int64)]),
        "dstoff": np.concatenate([dst_o, np.full(len(nx), -1)]),
        "cnt": np.concatenate([c, np.zeros(len(nx), np.int64)]),
        "depid": np.concatenate([depid, tb_local[tb[ny]]]),
        "deps": np.concatenate([deps, slot[ny]]),
        "hasdep": np.concatenate([hasdep, np.zeros(len(nx), np.int64)]),
    }
    in_chunks, out_chunks = s.in_chunks, s.out_chunks
    if s.inplace and s.collective is Collective.REDUCE_SCATTER:
        # in place, NCCL's reduce-scatter output is rank r's block of the input: the whole buffer is `i`
        for b in ("srcbuf", "dstbuf"):
            steps[b] = np.where(steps[b] == Buffer.OUTPUT, Buffer.INPUT, steps[b])
        in_chunks, out_chunks = out_chunks, 0
    tbs = {"gpu": tb_gpu, "id": tb_local, "send": np.where(tb_role == 1, tb_peer, -1),
           "recv": np.where(tb_role == 2, tb_peer, -1), "chan": tb_chan}
    gpus = {"id": np.arange(n), "i_chunks": np.full(n, in_chunks), "o_chunks": np.full(n, out_chunks),
            "s_chunks": np.full(n, s.scratch_chunks)}
    algo = {"name": name or s.name, "proto": proto, "nchannels": int(tb_chan.max(initial=0)) + 1,
            "nchunksperloop": s.size_chunks, "ngpus": n, "coll": coll, "inplace": int(s.inplace),
            "outofplace": int(not s.inplace), "minBytes": 0, "maxBytes": 0}
    return Program(algo, gpus, tbs, steps)


def export(schedule: Schedule, path: str | os.PathLike | None = None, *, proto: str = "Simple",
           name: str | None = None, limits: Limits = LIMITS) -> str:
    """The MSCCL XML of ``schedule`` (written to ``path`` when given).

    Raises :class:`MscclError` when the schedule has no MSCCL form (switch
    nodes, abstract, a collective MSCCL cannot name) or when the program
    breaks the runtime's :data:`LIMITS` (too many steps per thread block,
    peers per channel, ...), with the first problems found.
    """
    prog = lower(schedule, proto=proto, name=name, limits=limits)
    found = _problems(prog, limits)
    if found:
        raise MscclError(f"{schedule.name}: the MSCCL program breaks the runtime's rules: "
                         + "; ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else ""),
                         found)
    text = prog.to_xml()
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return text


# ------------------------------------------------------------------ parse
def _read(source) -> str:
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("<")):
        with open(source, encoding="utf-8") as f:
            return f.read()
    if not isinstance(source, str):
        raise TypeError(f"an MSCCL source must be XML text or a path, not {type(source).__name__}")
    return source


def _int(el: ET.Element, attr: str, where: str) -> int:
    v = el.get(attr)
    if v is None:
        raise MscclError(f"{where}: attribute {attr} is missing")
    try:
        return int(v)
    except ValueError:
        raise MscclError(f"{where}: attribute {attr} must be an integer, not {v!r}") from None


def parse(source) -> Program:
    """Read an MSCCL XML file (a path or the text) into a :class:`Program`.

    Raises :class:`MscclError` for what the runtime's parser rejects before
    it looks at the algorithm: bad XML, a root that is not ``<algo>``, a
    missing or non-integer attribute, an unknown step type or buffer.
    """
    text = _read(source)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise MscclError(f"not well-formed XML: {e}") from None
    if root.tag != "algo":
        raise MscclError(f"the root element must be <algo>, not <{root.tag}>")
    algo = {}
    for a in _ALGO_ATTRS:
        if root.get(a) is None:
            raise MscclError(f"algo: attribute {a} is missing")
        algo[a] = root.get(a) if a in ("name", "proto", "coll") else _int(root, a, "algo")
    gpus = {k: [] for k in ("id", "i_chunks", "o_chunks", "s_chunks")}
    tbs = {k: [] for k in ("gpu", "id", "send", "recv", "chan")}
    steps = {k: [] for k in _STEP_FIELDS}
    for g_el in root.iter("gpu"):
        gid = _int(g_el, "id", "gpu")
        for k in ("i_chunks", "o_chunks", "s_chunks"):
            gpus[k].append(_int(g_el, k, f"gpu {gid}"))
        gpus["id"].append(gid)
        for t_el in g_el.iter("tb"):
            tid = _int(t_el, "id", f"gpu {gid} tb")
            where = f"gpu {gid} tb {tid}"
            tbs["gpu"].append(gid)
            tbs["id"].append(tid)
            for k in ("send", "recv", "chan"):
                tbs[k].append(_int(t_el, k, where))
            for st_el in t_el.iter("step"):
                s = _int(st_el, "s", f"{where} step")
                w = f"{where} step {s}"
                typ = st_el.get("type")
                if typ not in _T:
                    raise MscclError(f"{w}: unknown step type {typ!r} (known: {', '.join(TYPES)})")
                steps["gpu"].append(gid)
                steps["tb"].append(tid)
                steps["s"].append(s)
                steps["type"].append(_T[typ])
                for b in ("srcbuf", "dstbuf"):
                    v = st_el.get(b)
                    if v not in _BUFS:
                        raise MscclError(f"{w}: {b} must be i, o or s, not {v!r}")
                    steps[b].append(_BUFS.index(v))
                for k in ("srcoff", "dstoff", "cnt", "depid", "deps", "hasdep"):
                    steps[k].append(_int(st_el, k, w))
    def columns(d):
        return {k: np.asarray(v, dtype=np.int64) for k, v in d.items()}

    return Program(algo, columns(gpus), columns(tbs), columns(steps))


# --------------------------------------------------------------- validate
def _where(st, i) -> str:
    return f"gpu {int(st['gpu'][i])} tb {int(st['tb'][i])} step {int(st['s'][i])}"


def _graph(prog: Program):
    """Steps sorted by (gpu, tb, s), and the happens-before edges between them.

    Returns ``(order, src, dst, sends, recvs, problems)``: edges are a
    thread block's steps in order, every dependency, and every send to the
    receive it meets (``sends[i]`` meets ``recvs[i]``, as positions in
    ``order``); ``problems`` are the send/receive mismatches.
    """
    st, t = prog.steps, prog.tbs
    order = np.lexsort((st["s"], st["tb"], st["gpu"]))
    g, tb, typ = st["gpu"][order], st["tb"][order], st["type"][order]
    width = int(max(t["id"].max(initial=0), st["tb"].max(initial=0))) + 1
    key = g * width + tb
    src, dst = [], []
    same = np.flatnonzero(key[1:] == key[:-1])
    src.append(same)
    dst.append(same + 1)
    # dependencies: node of (gpu, depid, deps)
    has = st["depid"][order] >= 0
    dk = g[has] * width + st["depid"][order][has]
    lo = np.searchsorted(key, dk, side="left")
    target = lo + st["deps"][order][has]
    src.append(target)
    dst.append(np.flatnonzero(has))
    # send -> receive, k-th to k-th on (sender, receiver, channel)
    tk = t["gpu"] * width + t["id"]
    tb_send = np.full(int(max(key.max(initial=0), tk.max(initial=0))) + 1, -1)
    tb_recv = tb_send.copy()
    tb_chan = tb_send.copy()
    tb_send[tk], tb_recv[tk], tb_chan[tk] = t["send"], t["recv"], t["chan"]
    found = []
    ngpus = int(prog.algo["ngpus"])
    nch = int(prog.algo["nchannels"])
    sends = np.flatnonzero(_SENDS[typ])
    recvs = np.flatnonzero(_RECVS[typ])
    conn_s = (g[sends] * ngpus + tb_send[key[sends]]) * (nch + 1) + tb_chan[key[sends]]
    conn_r = (tb_recv[key[recvs]] * ngpus + g[recvs]) * (nch + 1) + tb_chan[key[recvs]]
    so = np.lexsort((sends, conn_s))
    ro = np.lexsort((recvs, conn_r))
    cs, cr = conn_s[so], conn_r[ro]
    ks = np.arange(len(cs)) - np.searchsorted(cs, cs)
    kr = np.arange(len(cr)) - np.searchsorted(cr, cr)
    all_conn = np.unique(np.concatenate([cs, cr]))
    ns = np.searchsorted(cs, all_conn, side="right") - np.searchsorted(cs, all_conn)
    nr = np.searchsorted(cr, all_conn, side="right") - np.searchsorted(cr, all_conn)
    for c in all_conn[ns != nr]:
        a, rest = divmod(int(c), nch + 1)
        sender, receiver = divmod(a, ngpus)
        found.append(f"gpu {sender} sends {int(ns[all_conn == c][0])} time(s) to gpu {receiver} on channel "
                     f"{rest} but gpu {receiver} receives {int(nr[all_conn == c][0])} time(s) from it")
    # pair the k-th send with the k-th receive where both exist
    pair_key_s = cs * (len(order) + 1) + ks
    pair_key_r = cr * (len(order) + 1) + kr
    _, i_s, i_r = np.intersect1d(pair_key_s, pair_key_r, return_indices=True)
    ms, mr = sends[so][i_s], recvs[ro][i_r]
    bad = st["cnt"][order][ms] != st["cnt"][order][mr]
    for a, b in zip(ms[bad][:5], mr[bad][:5]):
        found.append(f"{_where(st, order[a])} sends {int(st['cnt'][order][a])} chunk(s) but the receive it meets, "
                     f"{_where(st, order[b])}, takes {int(st['cnt'][order][b])}")
    src.append(ms)
    dst.append(mr)
    return order, np.concatenate(src), np.concatenate(dst), ms, mr, found


def _levels(nnodes: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Longest-path level of every node (layered Kahn), or ``(levels, nodes on a cycle)``.

    A node enters the frontier in the round after its last predecessor, so
    the round is its level; each round touches only the frontier's edges.
    """
    order = np.argsort(src, kind="stable")
    targets = dst[order]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=nnodes))])
    indeg = np.bincount(dst, minlength=nnodes)
    level = np.full(nnodes, -1, np.int64)
    frontier = np.flatnonzero(indeg == 0)
    rnd = 0
    while len(frontier):
        level[frontier] = rnd
        seg, pos = _segments(ptr[frontier + 1] - ptr[frontier])
        hit = targets[ptr[frontier][seg] + pos]
        np.subtract.at(indeg, hit, 1)
        frontier = np.unique(hit[indeg[hit] == 0])
        rnd += 1
    if (level >= 0).all():
        return level, None
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(src)), (src, dst)), shape=(nnodes, nnodes))
    _, comp = connected_components(graph, directed=True, connection="strong")
    sizes = np.bincount(comp)
    return level, np.flatnonzero(sizes[comp] > 1)


def _chunk_rules(prog: Program) -> list[str]:
    """nchunksperloop and buffer sizes against what the collective needs."""
    a, g = prog.algo, prog.gpus
    C, n, coll = int(a["nchunksperloop"]), int(a["ngpus"]), a["coll"]
    found = []
    if coll in ("allgather", "reducescatter", "alltoall") and C % max(n, 1):
        found.append(f"nchunksperloop {C} of {coll} must be a multiple of ngpus {n}")
        return found
    k = C // max(n, 1)
    need = {("allreduce", 0): (C, C), ("reducescatter", 0): (C, k), ("allgather", 0): (k, C),
            ("alltoall", 0): (C, C), ("reducescatter", 1): (C, 0), ("allgather", 1): (0, C)}
    inplace = int(a["inplace"])
    if coll == "allreduce" and inplace:
        small = np.maximum(g["i_chunks"], g["o_chunks"]) < C
        for i in np.flatnonzero(small)[:3]:
            found.append(f"gpu {int(g['id'][i])}: in-place allreduce needs i_chunks or o_chunks >= {C}")
        return found
    if (coll, inplace) not in need:
        return found
    ni, no = need[coll, inplace]
    for i in np.flatnonzero((g["i_chunks"] < ni) | (g["o_chunks"] < no))[:3]:
        found.append(f"gpu {int(g['id'][i])}: {coll} with nchunksperloop {C} needs i_chunks >= {ni} and "
                     f"o_chunks >= {no}, not {int(g['i_chunks'][i])} and {int(g['o_chunks'][i])}")
    return found


def _problems(prog: Program, limits: Limits) -> list[str]:
    a, g, t, st = prog.algo, prog.gpus, prog.tbs, prog.steps
    found: list[str] = []
    if a["proto"] not in _PROTOS:
        found.append(f"algo: proto must be one of {', '.join(_PROTOS)}, not {a['proto']!r}")
    if a["coll"] not in _KNOWN_COLLS:
        found.append(f"algo: unknown collective {a['coll']!r}")
    for k in ("inplace", "outofplace"):
        if a[k] not in (0, 1):
            found.append(f"algo: {k} must be 0 or 1, not {a[k]}")
    n, nch = int(a["ngpus"]), int(a["nchannels"])
    if n < 1 or not 1 <= nch <= limits.max_channels or int(a["nchunksperloop"]) < 1:
        found.append(f"algo: ngpus ({n}), nchunksperloop ({a['nchunksperloop']}) must be positive and "
                     f"nchannels ({nch}) in 1..{limits.max_channels}")
        return found
    ids = np.sort(g["id"])
    if not np.array_equal(ids, np.arange(n)):
        found.append(f"gpu ids must be 0..{n - 1}, each once, not {ids.tolist()[:8]}")
        return found
    for k in ("i_chunks", "o_chunks", "s_chunks"):
        for i in np.flatnonzero(g[k] < 0)[:3]:
            found.append(f"gpu {int(g['id'][i])}: {k} must not be negative, not {int(g[k][i])}")
    found += _chunk_rules(prog)

    # thread blocks: ids 0..m-1 per gpu, peers, channels, one per (peer, channel)
    torder = np.lexsort((t["id"], t["gpu"]))
    tg, tid = t["gpu"][torder], t["id"][torder]
    first = np.searchsorted(tg, tg)
    for i in np.flatnonzero(tid != np.arange(len(tid)) - first)[:3]:
        found.append(f"gpu {int(tg[i])}: thread block ids must be 0, 1, 2, ... without gaps or repeats "
                     f"(found id {int(tid[i])} at position {int(i - first[i])})")
    if len(found):
        return found
    for label in ("send", "recv"):
        bad = (t[label] < -1) | (t[label] >= n) | (t[label] == t["gpu"])
        for i in np.flatnonzero(bad)[:3]:
            found.append(f"gpu {int(t['gpu'][i])} tb {int(t['id'][i])}: {label} peer {int(t[label][i])} must be "
                         f"-1 or another gpu in 0..{n - 1}")
    for i in np.flatnonzero((t["chan"] < 0) | (t["chan"] >= nch))[:3]:
        found.append(f"gpu {int(t['gpu'][i])} tb {int(t['id'][i])}: channel {int(t['chan'][i])} is not in "
                     f"0..{nch - 1} (nchannels {nch})")
    for i in np.flatnonzero(t["id"] > limits.max_channels * limits.tbs_per_channel - 1)[:1]:
        found.append(f"gpu {int(t['gpu'][i])}: thread block {int(t['id'][i])} exceeds the runtime's "
                     f"{limits.max_channels * limits.tbs_per_channel} thread blocks")
    if found:
        return found
    for label in ("send", "recv"):
        m = t[label] >= 0
        key = (t["gpu"][m] * n + t[label][m]) * nch + t["chan"][m]
        u, cnt = np.unique(key, return_counts=True)
        for kk in u[cnt > 1][:3]:
            gg, rest = divmod(int(kk), n * nch)
            found.append(f"gpu {gg}: more than one thread block {label}s {'to' if label == 'send' else 'from'} "
                         f"gpu {rest // nch} on channel {rest % nch}")
        per_ch = t["gpu"][m] * nch + t["chan"][m]
        u, cnt = np.unique(per_ch, return_counts=True)
        for kk in u[cnt > limits.tbs_per_channel][:3]:
            found.append(f"gpu {int(kk) // nch}: {int(cnt[u == kk][0])} {label} peers on channel {int(kk) % nch}, "
                         f"the runtime allows {limits.tbs_per_channel}")
    if found:
        return found

    # steps
    if not len(st["s"]):
        return found
    width = int(t["id"].max()) + 1
    tkey = t["gpu"] * width + t["id"]
    skey = st["gpu"] * width + st["tb"]
    pos = np.searchsorted(np.sort(tkey), skey)
    known = np.isin(skey, tkey)
    for i in np.flatnonzero(~known)[:3]:
        found.append(f"{_where(st, i)}: its thread block does not exist")
    if found:
        return found
    tsort = np.argsort(tkey)
    tb_row = tsort[pos]
    order = np.lexsort((st["s"], skey))
    ks = skey[order]
    sidx = np.arange(len(ks)) - np.searchsorted(ks, ks)
    for i in order[np.flatnonzero(st["s"][order] != sidx)][:3]:
        found.append(f"{_where(st, i)}: step numbers of a thread block must be 0, 1, 2, ... in order")
    nsteps = np.bincount(np.searchsorted(np.sort(tkey), skey), minlength=len(tkey))
    for i in np.flatnonzero(nsteps > limits.max_steps)[:3]:
        j = np.argsort(tkey)[i]
        found.append(f"gpu {int(t['gpu'][j])} tb {int(t['id'][j])}: {int(nsteps[i])} steps, the runtime allows "
                     f"{limits.max_steps}")
    if found:
        return found
    typ, cntc = st["type"], st["cnt"]
    real = typ != _T["nop"]
    for i in np.flatnonzero(real & ((cntc < 1) | (cntc >= limits.max_count)))[:3]:
        found.append(f"{_where(st, i)}: cnt {int(cntc[i])} must be in 1..{limits.max_count - 1}")
    for label, need, peer in (("send", _SENDS, "send"), ("receive", _RECVS, "recv")):
        bad = need[typ] & (t[peer][tb_row] < 0)
        for i in np.flatnonzero(bad)[:3]:
            found.append(f"{_where(st, i)}: a {TYPES[typ[i]]} step needs a {label} peer, but its thread block "
                         f"has {peer}=-1")
    sizes = np.stack([g["i_chunks"], g["o_chunks"], g["s_chunks"]], axis=1)[np.argsort(g["id"])]
    for label, local, b, off in (("source", _LOCAL_SRC, st["srcbuf"], st["srcoff"]),
                                 ("destination", _LOCAL_DST, st["dstbuf"], st["dstoff"])):
        m = local[typ]
        size = sizes[st["gpu"], b]
        bad = m & ((off < 0) | (off + cntc > size) | (off > limits.max_offset))
        for i in np.flatnonzero(bad)[:3]:
            found.append(f"{_where(st, i)}: {label} chunks {int(off[i])}..{int(off[i] + cntc[i] - 1)} are outside "
                         f"buffer {_BUFS[b[i]]} ({int(size[i])} chunks)")
    dep = st["depid"] >= 0
    for i in np.flatnonzero(~dep & (st["deps"] != -1) | (st["depid"] < -1))[:3]:
        found.append(f"{_where(st, i)}: depid {int(st['depid'][i])} and deps {int(st['deps'][i])} must both be "
                     f"-1 or name a step")
    for i in np.flatnonzero((st["hasdep"] != 0) & (st["hasdep"] != 1))[:3]:
        found.append(f"{_where(st, i)}: hasdep must be 0 or 1, not {int(st['hasdep'][i])}")
    if found:
        return found
    # dependencies name an existing step of another thread block of the same gpu, which raises its flag
    dk = st["gpu"][dep] * width + st["depid"][dep]
    di = np.flatnonzero(dep)
    exists = np.isin(dk, tkey)
    steps_of = np.zeros(len(dk), np.int64)
    steps_of[exists] = nsteps[np.searchsorted(np.sort(tkey), dk[exists])]
    ok = exists & (st["deps"][dep] >= 0) & (st["deps"][dep] < steps_of)
    for i in di[~ok][:3]:
        found.append(f"{_where(st, i)}: depends on gpu {int(st['gpu'][i])} tb {int(st['depid'][i])} step "
                     f"{int(st['deps'][i])}, which does not exist")
    for i in di[st["depid"][dep] == st["tb"][dep]][:3]:
        found.append(f"{_where(st, i)}: depends on its own thread block (its steps run in order anyway)")
    for i in di[st["depid"][dep] > limits.max_dep_tb][:3]:
        found.append(f"{_where(st, i)}: depends on thread block {int(st['depid'][i])}; the runtime stores "
                     f"at most {limits.max_dep_tb}")
    if found:
        return found
    tgt = order[np.searchsorted(ks, dk) + st["deps"][dep]]
    for i, j in zip(di[st["hasdep"][tgt] != 1][:3], tgt[st["hasdep"][tgt] != 1][:3]):
        found.append(f"{_where(st, i)}: waits for {_where(st, j)}, which has hasdep=0 and never signals")
    # a run of nops hands its waits to the next real step, which must wait itself
    o_typ = typ[order]
    o_dep = st["depid"][order] >= 0
    nop_before = np.zeros(len(order), bool)
    nop_before[1:] = (o_typ[:-1] == _T["nop"]) & (ks[1:] == ks[:-1])
    for i in order[np.flatnonzero(nop_before & (o_typ != _T["nop"]) & ~o_dep)][:3]:
        found.append(f"{_where(st, i)}: follows nop steps but has no dependency of its own; the runtime "
                     f"rejects such a chain")
    last_nop = (o_typ == _T["nop"]) & np.append(ks[1:] != ks[:-1], True)
    for i in order[np.flatnonzero(last_nop)][:3]:
        found.append(f"{_where(st, i)}: a nop at the end of a thread block waits for nothing (its dependency "
                     f"is attached to the next step)")
    if found:
        return found
    gorder, src, dst, _, _, match = _graph(prog)
    found += match
    _, cyc = _levels(len(gorder), src, dst)
    if cyc is not None:
        i = gorder[cyc[0]]
        found.append(f"deadlock: the waits, step orders and send/receive pairs form a cycle through {_where(st, i)}")
    return found


def problems(source, limits: Limits = LIMITS) -> list[str]:
    """Everything in an MSCCL file (path, text or :class:`Program`) that breaks the runtime's rules.

    Checked: the ``<algo>`` attributes; gpu ids 0..ngpus-1; chunk counts
    against the collective; thread block ids 0, 1, 2, ... per GPU, their
    peers and channels, at most one thread block per (peer, channel) and
    direction, at most ``tbs_per_channel`` peers per channel; step numbers
    0, 1, 2, ... and at most ``max_steps`` per thread block; step types
    against the thread block's peers; counts and local buffer bounds;
    dependencies on existing steps of other thread blocks that set
    ``hasdep``; nop chains; as many receives as sends (with equal counts)
    on every (sender, receiver, channel); no cycle of waits (deadlock). An
    empty list means the file is valid. Parse errors raise :class:`MscclError`.
    """
    prog = source if isinstance(source, Program) else parse(source)
    return _problems(prog, limits)


def validate(source, limits: Limits = LIMITS) -> Program:
    """Parse and check a file; raise :class:`MscclError` listing its problems, or return the program."""
    prog = source if isinstance(source, Program) else parse(source)
    found = _problems(prog, limits)
    if found:
        raise MscclError(f"invalid MSCCL algorithm {prog.algo.get('name')!r}: " + "; ".join(found[:3])
                         + (f" (and {len(found) - 3} more)" if len(found) > 3 else ""), found)
    return prog


# ----------------------------------------------------------------- import
def to_schedule(prog: Program, limits: Limits = LIMITS) -> Schedule:
    """The IR schedule that computes what ``prog`` computes (``prog`` is validated first).

    Each step gets the level of its longest chain of predecessors (thread
    block order, waits, send before receive); a step at level L acts in IR
    steps 3L (local copies and reduces, and sends that capture their data)
    and 3L + 1 (receives). Every send copies what it sends into a private
    scratch slot, as the runtime's connection buffers do, so a receive gets
    the data as it was when it was sent even if the sender has overwritten
    it since. Steps at one level are concurrent: a file whose concurrent
    steps touch the same chunk is racy, and the IR rejects two overwrites
    of one chunk in one step.
    """
    validate(prog, limits)
    a, g, st = prog.algo, prog.gpus, prog.steps
    coll_name = a["coll"]
    if coll_name not in _COLLS:
        raise MscclError(f"collective {coll_name!r} cannot be imported (supported: {', '.join(_COLLS)}); "
                         f"broadcast and reduce files name no root")
    coll = _COLLS[coll_name]
    n, C = int(a["ngpus"]), int(a["nchunksperloop"])
    inplace = bool(a["inplace"])
    if inplace and coll is Collective.ALLTOALL:
        raise MscclError("an in-place alltoall cannot be imported: the IR's all-to-all reads a separate input")
    order, src, dst, ms, mr, _ = _graph(prog)
    level, _ = _levels(len(order), src, dst)
    typ = st["type"][order]
    gpu = st["gpu"][order]
    cnt = st["cnt"][order]
    k = C // n

    def ir_buf(b, off):
        """Map MSCCL (buffer, offset) of every step to the IR's (in place, everything lives in OUTPUT)."""
        if not inplace:
            return b, off
        shift = np.zeros_like(off)
        if coll is Collective.ALLGATHER:
            shift = np.where(b == Buffer.INPUT, gpu * k, 0)
        elif coll is Collective.REDUCE_SCATTER:
            shift = np.where(b == Buffer.OUTPUT, gpu * k, 0)
        return np.where(b == Buffer.SCRATCH, Buffer.SCRATCH, Buffer.OUTPUT), off + shift

    sb, so = ir_buf(st["srcbuf"][order], st["srcoff"][order])
    db, do = ir_buf(st["dstbuf"][order], st["dstoff"][order])
    # private capture slots after the file's scratch
    sbase = int(g["s_chunks"].max())
    sends = _SENDS[typ]
    cap = np.zeros(len(order), np.int64)
    gs = gpu[sends]
    srt = np.lexsort((np.flatnonzero(sends), gs))
    c_sorted = cnt[sends][srt]
    csum = np.cumsum(c_sorted) - c_sorted
    gfirst = np.searchsorted(gs[srt], gs[srt])
    cap_local = csum - csum[gfirst]
    cap[np.flatnonzero(sends)[srt]] = sbase + cap_local
    cap_total = int((cap_local + c_sorted).max()) if len(c_sorted) else 0
    partner = np.full(len(order), -1)  # the send each receive meets
    partner[mr] = ms

    b = ScheduleBuilder(a["name"], coll, n)
    S = Buffer.SCRATCH

    def rows(kind, mask, step, src_node, dst_node, s_buf, s_off, d_buf, d_off):
        i = np.flatnonzero(mask)
        if not len(i):
            return
        seg, pos = _segments(cnt[i])
        b.add_rows(kind, step[i], src_node[i], dst_node[i], cnt[i], s_off[i][seg] + pos, d_off[i][seg] + pos,
                   src_buf=s_buf[i], dst_buf=d_buf[i])

    T = {t: typ == _T[t] for t in TYPES}
    L0, L1 = 3 * level, 3 * level + 1
    p = np.where(partner >= 0, partner, 0)
    peer_gpu, peer_cap = gpu[p], cap[p]
    Sarr = np.full(len(order), S)
    differ = (sb != db) | (so != do)
    # level L: captures of plain sends and of rrs (its data is src + received), local copies and reduces
    rows(Row.COPY, T["s"] | T["rrs"], L0, gpu, gpu, sb, so, Sarr, cap)
    rows(Row.COPY, (T["rrc"] | T["rrcs"]) & differ, L0, gpu, gpu, sb, so, db, do)
    rows(Row.COPY, T["cpy"], L0, gpu, gpu, sb, so, db, do)
    rows(Row.REDUCE, T["re"], L0, gpu, gpu, sb, so, db, do)
    # level L + 1/3: receives from the sender's capture slot; rcs/rrcs capture what they forward
    rows(Row.TRANSFER, T["r"] | T["rcs"], L1, peer_gpu, gpu, Sarr, peer_cap, db, do)
    rows(Row.TRANSFER_REDUCE, T["rrc"] | T["rrcs"], L1, peer_gpu, gpu, Sarr, peer_cap, db, do)
    rows(Row.TRANSFER_REDUCE, T["rrs"], L1, peer_gpu, gpu, Sarr, peer_cap, Sarr, cap)
    rows(Row.COPY, T["rcs"] | T["rrcs"], L1, gpu, gpu, db, do, Sarr, cap)
    if inplace:
        in_chunks, out_chunks = 0, max(C, int(np.maximum(g["i_chunks"], g["o_chunks"]).max()))
    else:
        in_chunks, out_chunks = int(g["i_chunks"].max()), int(g["o_chunks"].max())
    meta = {"msccl": {key: a[key] for key in ("proto", "nchannels", "minBytes", "maxBytes")}}
    try:
        return b.build(size_chunks=C, in_chunks=in_chunks, out_chunks=out_chunks,
                       scratch_chunks=sbase + cap_total, inplace=inplace, meta=meta)
    except ValueError as e:
        racy = " (concurrent steps write the same chunks: the file is racy)" if "both overwrite" in str(e) else ""
        raise MscclError(f"{a['name']}: {e}{racy}") from e


def load(source, limits: Limits = LIMITS) -> Schedule:
    """Read, validate and import an MSCCL file: ``check(load(path))`` proves what it computes."""
    return to_schedule(parse(source), limits)


def main(argv: list[str] | None = None) -> int:
    """``python -m inagg.host.schedules.msccl FILE...``: validate files and run them through the executor."""
    from inagg.host.schedules.executor import ScheduleError, check

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m inagg.host.schedules.msccl FILE.xml...", file=sys.stderr)
        return 2
    rc = 0
    for path in argv:
        try:
            s = load(path)
            check(s)
        except (MscclError, ScheduleError, OSError) as e:
            print(f"{path}: {e}")
            for p in getattr(e, "problems", [])[3:]:
                print(f"  {p}")
            rc = 1
            continue
        print(f"{path}: valid; computes {s.collective.value} on {s.nranks} GPUs")
    return rc


if __name__ == "__main__":
    sys.exit(main())
