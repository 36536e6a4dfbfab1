"""The demo's work: set up the switch and the workers, run, check, summarize (see :mod:`inagg.host.demo`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter as Tally
from dataclasses import dataclass
from functools import partial

import numpy as np

from inagg.models import quant, wire
from inagg.models.backend import DEFAULT_BACKEND, Backend, MissingTool, load_backend
from inagg.models.job import Mode
from inagg.models.protocol import Counter
from inagg.models.tree import TreeCounter

from inagg.host.controller import Controller, TreeController, plan, plan_tree_jobs
from inagg.host.link import Faults
from inagg.host.memnet import MemoryNetwork, RankMux, TreeNetwork
from inagg.host.rc_worker import RC_MODES, RcWorker
from inagg.host.worker import AllReduce, Timing, Worker, agreement_chunks

__all__ = ["DemoConfig", "MEMORY_TIMING", "RtlUnavailable", "run_demo", "result_bound", "format_summary",
           "pcap_writer", "repairs"]


@dataclass(frozen=True)
class DemoConfig:
    """Everything ``inagg demo`` varies; validated on construction."""

    workers: int = 4
    size: int = 16 << 20
    jobs: int = 1
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    net: str = "memory"
    switch: str | None = None
    window: int = 128
    chunk_bytes: int = 1024
    seed: int = 0
    pcap: str | None = None
    width: int = 512
    waves: str | None = None
    compare: bool = False
    tree: str | None = None
    collective: str = "allreduce"
    root: int = 0
    mode: str = "uc"
    mgmt_key: bytes | None = None
    board_port: int = 0
    switch_mac: str | None = None
    switch_ip: str | None = None

    @property
    def iface(self) -> str | None:
        """The interface of ``--net iface:NAME``, else None."""
        kind, _, name = self.net.partition(":")
        return name if kind == "iface" else None

    def __post_init__(self) -> None:
        modes = {m.value: m for m in Mode if m is Mode.UC or m in RC_MODES}
        if self.mode not in modes:
            raise ValueError(f"mode must be one of {', '.join(modes)}, not {self.mode!r}")
        if self.iface is not None:
            self._check_remote()
        elif self.switch == "remote":
            raise ValueError("--switch remote is the board at the far end of an interface: it needs --net iface:NAME")
        elif self.mgmt_key is not None:
            raise ValueError("--mgmt-key-file configures a board: it needs --net iface:NAME --switch remote")
        elif self.switch_mac is not None or self.switch_ip is not None:
            raise ValueError("--switch-mac and --switch-ip are the board's addresses: they need --net iface:NAME "
                             "--switch remote")
        if self.switch is None:
            # The fast switch runs UC jobs on one switch; the RC modes, trees and the other
            # collectives run on the reference model switch.
            reference = modes[self.mode] is not Mode.UC or self.tree is not None or self.collective != "allreduce"
            object.__setattr__(self, "switch", "model" if reference else DEFAULT_BACKEND)
        mode = modes[self.mode]
        if mode is not Mode.UC and self.switch == "rtl":
            self._check_rtl_mode(mode)
        elif mode is not Mode.UC and (self.switch != "model" or self.net != "memory" and self.tree is None):
            raise ValueError(f"mode {self.mode} runs on the model switch, over the memory network or with --tree "
                             "in namespaces, and modes II and III on the RTL switch")
        if not isinstance(self.size, int) or self.size < 0 or self.size % 4:
            raise ValueError(f"size must be a non-negative multiple of 4 bytes, not {self.size!r}")
        if self.net not in ("memory", "netns") and self.iface is None:
            raise ValueError(f"net must be 'memory', 'netns' or 'iface:NAME', not {self.net!r}")
        if self.switch not in ("fast", "model", "rtl", "remote"):
            raise ValueError(f"switch must be 'fast', 'model', 'rtl' or 'remote', not {self.switch!r}")
        if self.switch == "rtl":
            if self.width not in (64, 256, 512):
                raise ValueError(f"width must be 64, 256 or 512, not {self.width!r}")
            if self.waves is not None and not str(self.waves).lower().endswith((".fst", ".vcd")):
                raise ValueError(f"a waveform file ends in .fst or .vcd, not {self.waves!r}")
        elif self.waves is not None or self.compare:
            raise ValueError("--waves and --compare need the RTL switch (--switch rtl)")
        if self.collective != "allreduce" and self.tree is None:
            object.__setattr__(self, "tree", str(self.workers))  # one switch is the tree of one level
        # plan() or tree_plan(), and Faults(), validate the rest with their own messages.
        if self.tree is not None:
            ranks = self.tree_plan().tree.ranks
            if self.switch != "model":
                raise ValueError("--tree and --collective run on model switches")
            if self.net == "netns" and self.pcap is not None:
                raise ValueError("--pcap captures one switch's ports in namespaces, not a tree's")
            if self.workers != ranks:
                raise ValueError(f"tree {self.tree} has {ranks} ranks, not {self.workers} workers")
        else:
            self.plan()
        self.faults()

    def _check_rtl_mode(self, mode: Mode) -> None:
        """An RC mode on the RTL switch: Modes II and III, over the memory network (``docs/host.md``)."""
        if mode is Mode.TERMINATED:
            raise ValueError("mode I runs on the model switch only: the RTL has no Mode I (it runs uc, II and III)")
        if mode is Mode.AUGMENTED and self.net != "memory":
            # Its hop timers count the simulator's cycles, which the workers' real clock in namespaces does not keep.
            raise ValueError(f"mode III runs on the RTL switch over the memory network only, not --net {self.net}")

    def _check_remote(self) -> None:
        """``--net iface:NAME``: the switch is the board at the far end of the cable, running UC AllReduce jobs."""
        if not self.iface:
            raise ValueError("--net iface:NAME names the interface cabled to the board, e.g. iface:eth1")
        if self.switch is None:
            object.__setattr__(self, "switch", "remote")
        if self.switch != "remote":
            raise ValueError(f"--net {self.net} reaches the board at the far end of the cable: --switch remote, "
                             f"not {self.switch}")
        if self.mode != "uc" or self.tree is not None or self.collective != "allreduce":
            raise ValueError("--switch remote runs UC AllReduce jobs on one switch (the board's gateware)")
        if self.faults() != Faults() or self.pcap is not None:
            raise ValueError("--loss, --dup, --reorder, --corrupt and --pcap act at a software switch; the board's "
                             "link has only its own faults")
        if not isinstance(self.board_port, int) or not 0 <= self.board_port < 256:
            raise ValueError(f"board port must be an integer in 0..255, not {self.board_port!r}")
        mac, ip = _board_addresses(self.switch_mac, self.switch_ip)
        object.__setattr__(self, "switch_mac", mac)
        object.__setattr__(self, "switch_ip", ip)

    def plan(self):
        p = plan([self.workers] * self.jobs, window=self.window, chunk_bytes=self.chunk_bytes)
        mode = Mode(self.mode)
        switch = dataclasses.replace(p.switch, **{k: v for k, v in (("mac", self.switch_mac), ("ip", self.switch_ip))
                                                  if v is not None})
        if any(w.ip == switch.ip for j in p.jobs for w in j.workers):
            raise ValueError(f"switch IP {switch.ip} is a worker's address in this plan (workers take "
                             f"{p.jobs[0].workers[0].ip} and up)")
        return dataclasses.replace(p, switch=switch, jobs=tuple(dataclasses.replace(j, mode=mode) for j in p.jobs))

    def tree_plan(self):
        """The tree's plan: ``jobs`` jobs at once, each over every rank (:func:`plan_tree_jobs`)."""
        return plan_tree_jobs(self.tree, self.jobs, window=self.window, chunk_bytes=self.chunk_bytes,
                              collective=self.collective, root=self.root, mode=Mode(self.mode))

    def chunks(self, lanes: int) -> int:
        """The chunks of one worker's all-reduce at ``lanes`` lanes a chunk: its agreement round's and its data's."""
        return agreement_chunks(lanes) + -(-(self.size // 4) // lanes)

    def faults(self) -> Faults:
        return Faults(loss=self.loss, dup=self.dup, reorder=self.reorder, corrupt=self.corrupt)


def _board_addresses(mac: str | None, ip: str | None) -> tuple[str | None, str | None]:
    """``--switch-mac`` and ``--switch-ip`` written as the switch writes them (None stays None); ``ValueError``
    unless each is a unicast address the workers' frames can be sent to."""
    import ipaddress

    if mac is not None:
        try:
            raw = wire.mac_bytes(mac)
        except (ValueError, TypeError):
            raise ValueError(f"switch MAC must be six hex bytes joined by ':' (02:00:00:00:00:fe), not {mac!r}") from None
        if raw[0] & 1 or raw == bytes(6):
            raise ValueError(f"switch MAC must be a unicast address (the first byte even, not all zeros), not {mac}")
        mac = raw.hex(":")
    if ip is not None:
        try:
            addr = ipaddress.IPv4Address(ip)
        except (ValueError, TypeError):
            raise ValueError(f"switch IP must be an IPv4 address (10.0.0.254), not {ip!r}") from None
        if addr.is_multicast or addr.is_unspecified or addr == ipaddress.IPv4Address("255.255.255.255"):
            raise ValueError(f"switch IP must be a unicast address, not {ip}")
        ip = str(addr)
    return mac, ip


def result_bound(ref: np.ndarray, abs_sum: np.ndarray, exponent: int, workers: int) -> np.ndarray:
    """Per-element bound on ``|result - ref|`` for a float32 all-reduce result (``docs/host.md``).

    ``ref`` is the float64 sum of the workers' float32 data, ``abs_sum`` the
    float64 sum of their magnitudes. Terms: the quantization grid
    (:func:`inagg.models.quant.error_bound`), the final rounding to float32
    (half an ulp, relative 2**-24, and 2**-150 below the normal range), and the
    rounding of the float64 reference itself.
    """
    eb = quant.error_bound(exponent, workers)
    return eb + 2.0**-24 * (np.abs(ref) + eb) + 2.0**-149 + workers * 2.0**-53 * abs_sum


def _tensors(cfg: DemoConfig, job: int) -> list[np.ndarray]:
    n = cfg.size // 4
    return [np.random.default_rng([cfg.seed, job, r]).standard_normal(n, np.float32) for r in range(cfg.workers)]


@contextlib.contextmanager
def pcap_writer(path: str | None):
    """A context that yields ``capture(time, frame)`` writing a pcap file at ``path`` (None: yields None)."""
    if path is None:
        yield None
        return
    from scapy.utils import RawPcapWriter

    w = RawPcapWriter(path, linktype=1, nano=True, sync=False)  # 1: DLT_EN10MB
    try:
        w.write_header(None)  # a capture with no frame is still a valid pcap file
        yield lambda t, frame: w.write_packet(frame, sec=int(t), usec=round((t % 1) * 1e9))
    finally:
        w.close()


@contextlib.contextmanager
def _progress_bar(enabled: bool, total: int):
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("all-reduce"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("all-reduce", total=total)
        yield lambda done: bar.update(task, completed=done)


@dataclass
class _Outcome:
    """What one worker brings back: its sum, its scale exponent, its protocol counters."""

    result: np.ndarray
    exponent: int
    stats: Tally


@dataclass
class _Moved:
    to_switch: int
    to_hosts: int
    wall_time: float
    link: dict


# The memory network's timing (1 us per hop, no jitter): the first timeout, before any round trip is
# measured, is about 100 round trips; the estimated one has a floor of 1.5 round trips (docs/protocol.md 3.1).
MEMORY_TIMING = Timing(timeout=200e-6, max_timeout=20e-3, tries=30, min_timeout=3e-6)


class RtlUnavailable(RuntimeError):
    """The RTL switch cannot be simulated here (a tool is missing); the message says what to install."""


def run_demo(cfg: DemoConfig, *, progress: bool = False) -> dict:
    """Run the demo described by ``cfg``; returns the summary (``summary["ok"]``: every sum within its bound)."""
    if cfg.tree is not None:
        return _run_tree(cfg, progress)
    p = cfg.plan()
    data = {job.job: _tensors(cfg, j) for j, job in enumerate(p.jobs)}
    try:
        backend = None if cfg.switch == "remote" else load_backend(cfg.switch)
    except ImportError as e:
        raise RtlUnavailable(f"the RTL switch cannot be simulated here: {e}") from e
    rtl = None
    if cfg.iface is not None:
        outcomes, counters, moved, board = _run_iface(cfg, p, data, progress)
    elif backend.run is not None:
        outcomes, counters, moved, rtl = _run_inside(backend, cfg, p, data, progress)
    else:
        run = _run_netns if cfg.net == "netns" else _run_memory
        outcomes, counters, moved = run(backend, cfg, p, data, progress)
    summary = _summarize(cfg, _groups(p), data, outcomes, counters, moved)
    if cfg.iface is not None:
        summary["board"] = board
    if rtl is not None:
        summary["rtl"] = rtl
        summary["ok"] = summary["ok"] and rtl.get("compare", {}).get("differences", 0) == 0
    return summary


def _run_inside(backend: Backend, cfg, p, data, progress):
    """The workers run inside the backend, on its clock (the RTL simulator's)."""
    inputs = {w.port: data[job.job][r] for job in p.jobs for r, w in enumerate(job.workers)}
    lanes = p.switch.lanes
    # Every worker's chunks: the memory transport counts the results the workers took, netns the results sent.
    total = len(inputs) * cfg.chunks(lanes)
    try:
        with _progress_bar(progress, total) as bar:
            tick = None if bar is None else (lambda done: bar(min(done, total)))
            out = backend.run(p, inputs, width=cfg.width, net=cfg.net, faults=cfg.faults(), seed=cfg.seed,
                          compare=cfg.compare, waves=cfg.waves, pcap=cfg.pcap, progress=tick)
    except (MissingTool, ImportError) as e:
        raise RtlUnavailable(f"the RTL switch cannot be simulated here: {e}") from e
    outcomes = {port: _Outcome(out.results[port], out.exponents[port], out.stats[port]) for port in out.results}
    rtl = {
        "width": cfg.width, "cycles": out.cycles, "clock_mhz": 1e3 / out.clock_ns,
        "simulated_time_s": out.cycles * out.clock_ns * 1e-9, "wall_time_s": out.wall_time,
        "cpu_time_s": out.cpu_time, "python_time_s": out.python_time, "wakes": out.wakes,
        "packets_per_s": out.to_switch / out.wall_time if out.wall_time else 0.0,
        "cycles_per_s": out.cycles / out.wall_time if out.wall_time else 0.0,
        "bridge_drops": dict(out.bridge),
    }
    if cfg.compare:
        rtl["compare"] = {"frames_compared": out.frames_compared, "differences": out.difference_count,
                          "first": [str(d) for d in out.differences]}
    if cfg.waves is not None:
        rtl["waves"] = cfg.waves
    return outcomes, out.counters, _Moved(out.to_switch, out.to_hosts, out.wall_time, out.link), rtl


def _run_memory(backend: Backend, cfg, p, data, progress):
    switch = backend.open(p.switch)
    timing = MEMORY_TIMING
    ops = {}
    for job in p.jobs:
        kind = RcWorker if job.mode in RC_MODES else Worker
        for r, w in enumerate(job.workers):
            ops[w.port] = AllReduce(kind(p.switch, job, r, timing=timing), data[job.job][r])
    lanes = p.switch.lanes
    total = len(ops) * cfg.chunks(lanes)
    with Controller(switch, p), pcap_writer(cfg.pcap) as capture, _progress_bar(progress, total) as bar:
        net = MemoryNetwork(switch, faults=cfg.faults(), seed=cfg.seed, capture=capture)
        tick = None if bar is None else (lambda now: bar(sum(op.worker.stats["results"] for op in ops.values())))
        stats = net.run(ops, progress=tick)
        counters = dict(switch.counters)
    outcomes = {port: _Outcome(op.result(), op.exponent, op.worker.stats) for port, op in ops.items()}
    return outcomes, counters, _Moved(stats.to_switch, stats.to_hosts, stats.wall_time, stats.link)


def _groups(p) -> dict[int, list[int]]:
    """The outcome keys (switch ports) of each job's workers, in rank order."""
    return {job.job: [w.port for w in job.workers] for job in p.jobs}


def _run_tree(cfg: DemoConfig, progress: bool) -> dict:
    """The jobs on a tree of model switches, over the memory network or in namespaces; outcomes keyed by
    (job, rank).

    Every job spans every rank: rank ``r`` runs one operation per job behind a :class:`RankMux`.
    """
    from inagg.host.collectives import tree_operations

    tp = cfg.tree_plan()
    jobs = [job.job for job in tp.plans[0].jobs]
    data = {job: _tensors(cfg, j) for j, job in enumerate(jobs)}
    if cfg.net == "netns":
        per_rank = tree_operations(tp, [data[job] for job in jobs], timing=_NETNS_TIMING)
        muxes, switches, lost, moved = _run_tree_netns(cfg, tp, per_rank)
    else:
        per_rank = tree_operations(tp, [data[job] for job in jobs], timing=MEMORY_TIMING)
        muxes, switches, lost, moved = _run_tree_memory(cfg, tp, per_rank, progress)
    counters, tree = Tally(), Tally()
    for sw in switches:
        counters.update(sw.counters)
        tree.update(sw.tree_counters)
    # ops[job][r]: the plan lists a switch's jobs in the same order everywhere, so a rank's j-th op is job j's.
    ops: dict[int, dict[int, object]] = {job: {} for job in jobs}
    for r, mux in muxes.items():
        for job, op in zip(jobs, mux.ops.values()):
            ops[job][r] = op
    exact = all(_exact(cfg, data[job], list(ops[job].values())) for job in jobs)
    if cfg.collective == "allreduce":
        outcomes = {(job, r): _Outcome(op.result(), op.exponent, op.worker.stats)
                    for job in jobs for r, op in ops[job].items()}
        summary = _summarize(cfg, {job: [(job, r) for r in ops[job]] for job in jobs}, data, outcomes, counters,
                             moved)
        summary.update(ok=summary["ok"] and exact, exact=exact)
    else:
        outcomes = {(job, r): _Outcome(np.zeros(0, np.float32), 0, op.worker.stats)
                    for job in jobs for r, op in ops[job].items()}
        summary = _summarize(cfg, {}, data, outcomes, counters, moved)
        summary.update(ok=exact, exact=exact, exponents={})
    summary["collective"] = cfg.collective
    summary["tree"] = {"spec": tp.tree.spec, "switches": len(switches),
                       "counters": {c.name: tree[c] for c in TreeCounter},
                       "misaddressed": sum(m.dropped for m in muxes.values()),
                       "repairs": repairs(tp.tree, [sw.resent for sw in switches], lost, muxes)}
    return summary


def _run_tree_memory(cfg: DemoConfig, tp, per_rank: dict, progress: bool):
    """The tree over the memory network: (each rank's mux, the switches, lost frames per hop, what moved)."""
    from inagg.models.switch import ModelSwitch

    switches = [ModelSwitch(q.switch) for q in tp.plans]
    muxes = {r: RankMux(rank_ops) for r, rank_ops in per_rank.items()}
    every = [op for mux in muxes.values() for op in mux.ops.values()]
    total = len(every) * cfg.chunks(tp.plans[0].switch.lanes)
    with TreeController(switches, tp), pcap_writer(cfg.pcap) as capture, _progress_bar(progress, total) as bar:
        net = TreeNetwork(tp.tree, switches, faults=cfg.faults(), seed=cfg.seed, capture=capture)
        tick = None if bar is None else (lambda now: bar(sum(op.worker.stats["results"] for op in every)))
        stats = net.run(muxes, progress=tick)
    lost = {hop: link.stats["lost"] for hop, link in net.links.items()}
    return muxes, switches, lost, _Moved(stats.to_switch, stats.to_hosts, stats.wall_time, stats.link)


def _run_tree_netns(cfg: DemoConfig, tp, per_rank: dict):
    """The tree in Linux namespaces (:class:`~inagg.host.netns.TreeTopology`): a process per switch and per
    rank, a veth pair per hop; each hop's faults applied by its upper switch, both ways, as
    :class:`~inagg.host.memnet.TreeNetwork` applies them once per hop. Returns what :func:`_run_tree_memory`
    does: the ranks' muxes and the switches, as they ended, from their processes."""
    import multiprocessing as mp
    import time

    from inagg.host import netns

    netns.require_root()
    ctx = mp.get_context("fork")  # the children inherit the plan and the ranks' operations
    switch_conns, rank_conns = [], []
    with netns.TreeTopology(tp) as topo, _children() as procs:
        stop = ctx.Event()
        for s in range(len(tp.plans)):
            parent, child = ctx.Pipe()
            switch_conns.append(parent)
            procs.append(ctx.Process(target=_tree_switch_proc, name=f"inagg-switch{s}",
                                     args=(topo, s, cfg.faults(), cfg.seed, stop, child)))
            procs[-1].start()
        for conn in switch_conns:
            _reply(conn)  # ready
        go = ctx.Event()
        for r, rank_ops in per_rank.items():
            parent, child = ctx.Pipe()
            rank_conns.append(parent)
            procs.append(ctx.Process(target=_tree_rank_proc, name=f"inagg-rank{r}",
                                     args=(topo.rank_ns(r), topo.rank_if, RankMux(rank_ops), go, stop, child)))
            procs[-1].start()
        for conn in rank_conns:
            _reply(conn)  # ready
        start = time.perf_counter()
        go.set()
        muxes = {r: _reply(conn) for r, conn in zip(per_rank, rank_conns)}
        wall = time.perf_counter() - start
        stop.set()
        ends = [_reply(conn) for conn in switch_conns]
    switches = [sw for sw, _ in ends]
    lost = {(s, p): stats.get("lost", 0) for s, (_, per_port) in enumerate(ends) for p, stats in per_port.items()}
    link = sum((Tally(stats) for _, per_port in ends for stats in per_port.values()), Tally())
    moved = _Moved(sum(sw.counters[Counter.RX_FRAMES] for sw in switches),
                   sum(sum(op.worker.stats["results"] for op in mux.ops.values()) for mux in muxes.values()),
                   wall, dict(link))
    return muxes, switches, lost, moved


@contextlib.contextmanager
def _children():
    """A list for the child processes a run starts: each is joined on the way out, and after an error or
    Ctrl-C first terminated."""
    procs: list = []
    try:
        yield procs
    except BaseException:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        for proc in procs:
            proc.join()


def _reply(conn):
    """A child process's answer: its value, or the exception it sent, raised here."""
    kind, value = conn.recv()
    if kind == "error":
        raise value
    return value


def _tree_switch_proc(topo, s: int, faults: Faults, seed: int, stop, conn) -> None:
    """Switch ``s`` of the tree in its namespace until ``stop``; sends back the switch and its ports' fault
    counts. The ports to its children cross a link of ``faults`` each (seeded by the hop, as in
    TreeNetwork); its uplink none (the parent's port applies that hop's)."""
    from inagg.host import netns
    from inagg.host.link import LossyLink
    from inagg.models.switch import ModelSwitch

    try:
        netns.enter(topo.switch_ns(s))
        p = topo.plan.plans[s]
        switch = ModelSwitch(p.switch, hop_timeout=_NETNS_HOP_TIMEOUT)
        Controller(switch, p).configure()
        node = topo.plan.tree.switches[s]
        ports = {q: netns.PacketPort(topo.switch_if(q)) for q in range(node.ports)}
        links = {q: LossyLink(faults, [seed, s, q]) for q in range(len(node.children))}
        conn.send(("ok", "ready"))
        netns.serve_switch(switch, ports, links=links, stop=stop.is_set)
        conn.send(("ok", (switch, {q: dict(link.stats) for q, link in links.items()})))
    except Exception as e:  # the parent raises it
        conn.send(("error", e))


def _tree_rank_proc(ns: str, ifname: str, mux: RankMux, go, stop, conn) -> None:
    """A rank in its namespace: runs its operations (one per job), sends them back when done, and answers
    frames (re-ACKs, duplicate results) until ``stop``, as a finished rank does on the memory network."""
    import time

    from inagg.host import netns
    from inagg.host.api import drive

    try:
        netns.enter(ns)
        port = netns.PacketPort(ifname)
        conn.send(("ok", "ready"))
        go.wait()
        drive(mux, port)
        conn.send(("ok", mux))
        while not stop.is_set():
            frame = port.recv(0.05)
            for f in mux.receive(time.monotonic(), frame) if frame is not None else ():
                port.send(f)
    except Exception as e:  # the parent raises it
        conn.send(("error", e))


def repairs(tree, resent, lost, ranks) -> list[dict]:
    """Where a tree's losses were repaired: per hop, what its link lost and the frames sent again across it.

    ``resent`` is each switch's :attr:`~inagg.models.switch.ModelSwitch.resent`
    (in tree order), ``lost`` the frames lost per hop (keyed by the hop's
    upper (switch, port)), ``ranks`` each rank's
    :class:`~inagg.host.memnet.RankMux`. A frame sent again is **end to end**
    when a rank's own timer sent it (every resend of a UC worker), when a
    rank's Go-Back-N followed a NAK its responder sent and its switch
    reflected (Mode II), or when a switch passed a rank's resend on (a
    result again to a child, ``TX_RESENDS``; a partial again to the parent,
    ``UP_RESENDS`` in UC and Mode II). It is **on the hop** when an end of
    the hop resent it by itself (Modes I and III, ``HOP_RESENDS``): a switch
    after its child's or parent's NAK or on its own timer, or a rank after
    its switch's NAK; in Mode I also on its own timer (its RC peer is its
    switch, so its timer is the hop's). Each hop's row adds what both of its
    ends sent on it.
    """
    e2e_rank, hop_rank = Tally(), Tally()
    for r, mux in ranks.items():
        for op in mux.ops.values():
            w = op.worker
            timed = w.stats["resent"]
            # RcWorker counts its timer's resends; its requester every resend, after a NAK too.
            naked = w.requester.stats["resent"] - timed if isinstance(w, RcWorker) else 0
            (hop_rank if w.job.mode is Mode.TERMINATED else e2e_rank)[r] += timed
            (hop_rank if w.job.mode in (Mode.TERMINATED, Mode.AUGMENTED) else e2e_rank)[r] += naked
    rows = []
    for s in tree.switches:
        for p, child in enumerate(s.children):
            up = resent[s.index]
            e2e = up[p, Counter.TX_RESENDS]
            hop = up[p, Counter.HOP_RESENDS]
            if child.switch:
                below = resent[child.index]
                uplink = tree.switches[child.index].uplink_port
                e2e += below[uplink, TreeCounter.UP_RESENDS]
                hop += below[uplink, Counter.HOP_RESENDS]
            else:
                e2e += e2e_rank[child.index]
                hop += hop_rank[child.index]
            lower = f"s{child.index}" if child.switch else f"rank {child.index}"
            rows.append({"hop": f"s{s.index}:{p} - {lower}", "lost": lost[s.index, p],
                         "repaired_end_to_end": e2e, "repaired_on_hop": hop})
    return rows


def _exact(cfg: DemoConfig, data: list[np.ndarray], ops: list) -> bool:
    """True when every rank (``ops`` in rank order) holds, bit for bit, what numpy says ``cfg.collective``
    gives it."""
    from inagg.host.collectives import exponent, reference

    want = reference(cfg.collective, data, root=cfg.root, exponent=exponent(ops[0]))
    return all(op.done and _same(op.result(), w) for op, w in zip(ops, want))


def _same(got: np.ndarray | None, want: np.ndarray | None) -> bool:
    if got is None or want is None:
        return got is want
    return got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


# Real time in namespaces: a Python switch queues a window of every worker, so a round trip takes tens of ms.
# On a tree, Mode III's hop timer is shorter than the ranks' ACK timeout: the hop repairs a loss first.
_NETNS_TIMING = Timing(timeout=0.3, max_timeout=2.0, tries=20)
_NETNS_HOP_TIMEOUT = 0.25


def _run_netns(backend: Backend, cfg, p, data, progress):
    import multiprocessing as mp

    from inagg.host import netns

    netns.require_root()
    # fork: the children inherit the tensors instead of receiving them pickled.
    ctx = mp.get_context("fork")
    with netns.Topology(p) as topo, _children() as procs:
        stop = ctx.Event()
        completed = ctx.Value("q", 0, lock=False)  # chunks the switch completed, for the progress bar
        sw_conn, child = ctx.Pipe()
        procs.append(ctx.Process(target=_switch_proc, name="inagg-switch",
                                 args=(backend, topo, p, cfg.faults(), cfg.seed, cfg.pcap, stop, completed,
                                       child)))
        procs[0].start()
        if sw_conn.recv() != "ready":
            raise RuntimeError("the switch process did not start")
        workers = {w.port: (topo.worker_ns(w.port), partial(netns.PacketPort, topo.worker_if), p.switch, job, r,
                            data[job.job][r], _NETNS_TIMING)
                   for job in p.jobs for r, w in enumerate(job.workers)}
        outcomes, wall = _run_workers(ctx, procs, workers, progress, len(p.jobs) * cfg.chunks(p.switch.lanes),
                                      lambda _: completed.value)
        stop.set()
        counters, link = sw_conn.recv()
    moved = _Moved(counters[Counter.RX_FRAMES], counters[Counter.TX_RESULTS], wall, link)
    return outcomes, counters, moved


def _switch_proc(backend, topo, p, faults, seed, pcap, stop, completed, conn):
    from inagg.host import netns

    netns.enter(topo.switch_ns)
    switch = backend.open(p.switch)
    Controller(switch, p).configure()
    ports = {port: netns.PacketPort(topo.switch_if(port)) for port in topo.ports}
    conn.send("ready")
    with pcap_writer(pcap) as capture:
        def done() -> bool:
            completed.value = switch.counters[Counter.COMPLETED]
            return stop.is_set()

        link = netns.serve_switch(switch, ports, faults=faults, seed=seed, stop=done, capture=capture)
    conn.send((dict(switch.counters), link))


def _run_iface(cfg, p, data, progress):
    """The workers as processes on interface ``cfg.iface``, the switch the board at the far end of its cable:
    configured by management frames first when ``cfg.mgmt_key`` is given (and its counters read before and
    after), else assumed to hold the plan's jobs already. Returns what :func:`_run_netns` does and the
    ``board`` part of the summary."""
    import multiprocessing as mp

    from inagg.host.iface import Interface

    nic = Interface(cfg.iface)
    bound = nic.bind(p, port=cfg.board_port)
    ctx = mp.get_context("fork")  # the children inherit the tensors and the interface
    with _remote_board(cfg, nic, bound) as counters, _children() as procs:
        before = counters()
        # Keyed by the worker's port in p, which tells the ranks apart (_groups).
        workers = {w.port: (None, partial(nic.port, there.qpn), bound.switch, on_nic, r, data[job.job][r],
                            _NETNS_TIMING)
                   for job, on_nic in zip(p.jobs, bound.jobs)
                   for r, (w, there) in enumerate(zip(job.workers, on_nic.workers))}
        outcomes, wall = _run_workers(ctx, procs, workers, progress, len(workers) * cfg.chunks(p.switch.lanes),
                                      lambda done: sum(o.stats["results"] for o in done.values()))
        after = counters()
    board = {"interface": nic.name, "mac": nic.mac, "port": cfg.board_port, "switch_mac": bound.switch.mac,
             "switch_ip": bound.switch.ip, "configured": "by management frames" if cfg.mgmt_key else "assumed"}
    host = Tally()
    for o in outcomes.values():
        host.update(o.stats)
    if after is None:
        moved = _Moved(host["sent"] + host["resent"], host["results"], wall, {})
        return outcomes, Tally(), moved, board
    # The board's counters are 32-bit and run on across jobs: the run's are the differences.
    run = Tally({c: (after[0][c] - before[0][c]) % (1 << 32) for c in after[0]})
    board["mac_counters"] = None if after[1] is None else {
        name: (after[1][name] - before[1][name]) % (1 << 32) for name in after[1]}
    return outcomes, run, _Moved(run[Counter.RX_FRAMES], run[Counter.TX_RESULTS], wall, {}), board


@contextlib.contextmanager
def _remote_board(cfg, nic, p):
    """Configure ``p`` on the board by management frames from ``nic`` (when ``cfg.mgmt_key`` is given) and tear
    it down on the way out; yields a function that reads the board's counters (None without a key): the
    switch's, and those of the MAC on the cabled port (None when the board has no MAC there)."""
    import sys
    import time

    from inagg.host.controller import mac_counters, management_target
    from inagg.host.mgmt import MgmtBus, MgmtError, MgmtSession, MgmtTimeout
    from inagg.models.regmap import ID_VALUE, MAC_PORTS, RegMap

    if cfg.mgmt_key is None:
        print(f"inagg demo: no --mgmt-key-file: assuming the board at {p.switch.mac} ({p.switch.ip}) behind "
              f"{nic.name} holds the jobs of this plan already (jobs {', '.join(str(j.job) for j in p.jobs)}, "
              f"workers at port {cfg.board_port}, MAC {nic.mac}); its counters are not read", file=sys.stderr)
        yield lambda: None
        return
    port = nic.mgmt_port()
    try:
        # Numbered from the clock: above every number an earlier run used (docs/security.md).
        session = MgmtSession(cfg.mgmt_key, board=p.switch.mac, host=nic.mac, seq=time.time_ns(),
                              timeout=_MGMT_TIMEOUT, tries=_MGMT_TRIES)
        bus = MgmtBus(session, port.send, port.recv)
        if (ident := bus.read(RegMap.switch("ID"))) != ID_VALUE:
            raise MgmtError(f"the board behind {nic.name} answers ID 0x{ident:08X}, not inagg's 0x{ID_VALUE:08X}")
        try:
            RegMap.check_geometry(bus.read(RegMap.switch("GEOMETRY")), p.switch, p.jobs)
        except ValueError as e:
            raise MgmtError(f"the board behind {nic.name} cannot run this plan: {e}") from None
        regmap = RegMap.from_jobs(bus.read(RegMap.switch("JOBS")))

        def mac():
            if cfg.board_port >= MAC_PORTS:  # no MAC counter addresses for the port
                return None
            try:
                return mac_counters(bus, cfg.board_port)
            except MgmtTimeout:
                raise
            except MgmtError:  # SLVERR: no MAC on that port (a switch served in software, a build without MACs)
                return None

        with Controller(management_target(bus, regmap, p.switch), p):
            yield lambda: ({c: bus.read(regmap.counter(c)) for c in Counter}, mac())
    finally:
        port.close()


# A management round trip crosses the cable and the bridge in microseconds; a software board takes longer.
_MGMT_TIMEOUT = 0.2
_MGMT_TRIES = 5


def _run_workers(ctx, procs, workers, progress, total, done):
    """Start a :func:`_worker_proc` for each entry of ``workers`` (its arguments up to ``go``, keyed by the
    worker's port) among ``procs``, release them together once every one is ready, and return their outcomes
    by key and the seconds from that release to the last outcome. The progress bar shows ``done(outcomes so
    far)`` of ``total`` chunks."""
    import time

    conns = {}
    go = ctx.Event()  # released when every worker has its socket: no start-up skew hits the timers
    for port, args in workers.items():
        parent, child = ctx.Pipe()
        conns[port] = parent
        procs.append(ctx.Process(target=_worker_proc, name=f"inagg-worker{port}", args=(*args, go, child)))
        procs[-1].start()
    for conn in conns.values():
        _reply(conn)  # ready
    start = time.perf_counter()
    go.set()
    outcomes = {}
    with _progress_bar(progress, total) as bar:
        for port, conn in conns.items():
            while bar is not None and not conn.poll(0.1):
                bar(done(outcomes))
            outcomes[port] = _reply(conn)
    return outcomes, time.perf_counter() - start


def _worker_proc(ns, open_port, switch_spec, job, rank, data, timing, go, conn):
    """A worker: in namespace ``ns`` (None: this one) on the port ``open_port()`` gives, once ``go`` is set."""
    from inagg.host import netns
    from inagg.host.api import Group, allreduce

    try:
        if ns is not None:
            netns.enter(ns)
        port = open_port()
        group = Group(switch_spec, job, rank, port, timing=timing)
        conn.send(("ready", None))
        go.wait()
        op_result = allreduce(data, group)
        exponent = group.last_exponent
        conn.send(("ok", _Outcome(op_result, exponent, group.worker.stats)))
    except Exception as e:  # the parent raises it
        conn.send(("error", e))


def _summarize(cfg, groups, data, outcomes, counters, moved) -> dict:
    ok = True
    max_err, worst_ratio, bound_at_max = 0.0, 0.0, 0.0
    exponents = {}
    for job, keys in groups.items():
        ref = np.zeros(cfg.size // 4)
        abs_sum = np.zeros(cfg.size // 4)
        for d in data[job]:
            ref += d
            abs_sum += np.abs(d)
        first = outcomes[keys[0]]
        exponents[job] = first.exponent
        bound = result_bound(ref, abs_sum, first.exponent, len(keys))
        for key in keys:
            out = outcomes[key].result
            if not np.array_equal(out.view(np.uint32), first.result.view(np.uint32)):
                ok = False  # every worker of a job must hold the same sum, bit for bit
            err = np.abs(out - ref)
            if err.size:
                i = int(np.argmax(err / bound))
                worst_ratio = max(worst_ratio, float(err[i] / bound[i]))
                if err[i] >= max_err:
                    max_err, bound_at_max = float(err[i]), float(bound[i])
                ok &= bool((err <= bound).all())
    host = Tally()
    for o in outcomes.values():
        host.update(o.stats)
    host_drops = {k.name: v for k, v in host.items() if isinstance(k, Counter)}
    drops = {c.name: v for c, v in counters.items() if v and (c.name.startswith("DROP_") or c == Counter.EXC_REFUSED)}
    payload = cfg.size * len(outcomes)
    return {
        "ok": bool(ok and worst_ratio <= 1.0),
        "net": cfg.net, "switch": cfg.switch, "mode": cfg.mode, "workers": cfg.workers, "jobs": cfg.jobs,
        "size_bytes": cfg.size, "chunk_bytes": cfg.chunk_bytes, "window": cfg.window,
        "faults": {"loss": cfg.loss, "dup": cfg.dup, "reorder": cfg.reorder, "corrupt": cfg.corrupt},
        "seed": cfg.seed,
        "exponents": exponents,
        "max_error": max_err,
        "bound_at_max_error": bound_at_max,
        "worst_error_to_bound": worst_ratio,
        "wall_time_s": moved.wall_time,
        "goodput_gbit_s": payload * 8 / moved.wall_time / 1e9 if moved.wall_time else 0.0,
        "switch_frames_per_s": moved.to_switch / moved.wall_time if moved.wall_time else 0.0,
        "packets": {
            "contributions_sent": host["sent"],
            "retransmissions": host["resent"],
            "results_placed": host["results"],
            "duplicate_results": host["duplicate"],
            "unexpected_results": host["unexpected"],
            "fp32_results": host["fp32_results"],
            "frames_to_switch": moved.to_switch,
            "frames_to_hosts": moved.to_hosts,
        },
        "switch_counters": {c.name: v for c, v in counters.items()},
        "promoted_chunks": counters[Counter.PROMOTED],
        "drops": {"switch": drops, "hosts": host_drops, "link": moved.link},
    }


def format_summary(s: dict) -> None:
    """Print the summary as a table (rich)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="inagg demo", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    f = s["faults"]
    where = f"tree {s['tree']['spec']} of {s['tree']['switches']} switches" if "tree" in s else f"{s['switch']} switch"
    t.add_row("setup", f"{s['jobs']} job(s) x {s['workers']} workers, {s['size_bytes'] / 2**20:.2f} MiB float32 per "
                       f"worker, {s['net']} network, {where}, mode {s['mode']}, window {s['window']}, "
                       f"{s['chunk_bytes']} B chunks")
    t.add_row("faults", ", ".join(f"{k} {v:g}" for k, v in f.items()) + f", seed {s['seed']}")
    if "board" in s:
        b = s["board"]
        t.add_row("board", f"{b['switch_mac']} ({b['switch_ip']}) on port {b['port']}, reached from {b['interface']} "
                           f"({b['mac']}); jobs configured {b['configured']}")
        if "mac_counters" in b:
            macs = b["mac_counters"]
            t.add_row("board MAC", f"port {b['port']}: no MAC counters (the board has no MAC there)" if macs is None
                      else f"port {b['port']}: " + ", ".join(f"{k} {v}" for k, v in macs.items()))
    verdict = "[green]PASS[/green]" if s["ok"] else "[red]FAIL[/red]"
    if s.get("collective", "allreduce") != "allreduce":
        t.add_row("collective", f"{s['collective']}: every rank's result bit for bit as numpy's: {verdict}")
    else:
        t.add_row("max error", f"{s['max_error']:.3g} (bound there {s['bound_at_max_error']:.3g}; worst error/bound "
                               f"{s['worst_error_to_bound']:.3f}) {verdict}")
        t.add_row("scale", ", ".join(f"job {j}: 2**{e}" for j, e in s["exponents"].items()))
    g = s["goodput_gbit_s"]
    rate = f"{g:.2f} Gb/s" if g >= 1 else f"{g * 1000:.1f} Mb/s"
    t.add_row("time", f"{s['wall_time_s']:.2f} s, goodput {rate} (tensor bytes of all workers / wall time), "
                      f"{s['switch_frames_per_s']:,.0f} frames/s into the switch")
    pk = s["packets"]
    t.add_row("packets", f"{pk['contributions_sent']} contributions sent ({pk['retransmissions']} retransmissions), "
                         f"{pk['results_placed']} results placed, {pk['duplicate_results']} duplicate and "
                         f"{pk['unexpected_results']} unexpected results ignored")
    t.add_row("promoted", f"{s['promoted_chunks']} chunks ({pk['fp32_results']} FP32 results)")
    d = s["drops"]
    for row, where in (("drops (switch)", "switch"), ("drops (hosts)", "hosts"), ("link faults", "link")):
        t.add_row(row, ", ".join(f"{k} {v}" for k, v in sorted(d[where].items())) or "none")
    if "tree" in s:
        counts = {**s["tree"]["counters"], "misaddressed (no QP of the rank)": s["tree"]["misaddressed"]}
        t.add_row("tree", ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none")
    tables = [t]
    if "tree" in s:
        tables.append(_repairs_table(s["tree"]["repairs"]))
    if "rtl" in s:
        r = s["rtl"]
        t.add_row("rtl", f"{r['width']}-bit beats, {r['cycles']:,} cycles simulated ({r['simulated_time_s'] * 1e3:.3f} ms "
                         f"at {r['clock_mhz']:.0f} MHz) in {r['wall_time_s']:.2f} s: {r['packets_per_s']:,.0f} packets/s, "
                         f"{r['cycles_per_s']:,.0f} cycles/s")
        t.add_row("bridge drops", ", ".join(f"{k} {v}" for k, v in sorted(r["bridge_drops"].items())) or "none")
        if "compare" in r:
            c = r["compare"]
            verdict = "[green]identical[/green]" if not c["differences"] else f"[red]{c['differences']} differences[/red]"
            t.add_row("compare", f"{c['frames_compared']:,} frames the switch sent (results, ACKs) and every counter "
                                 f"against the model: {verdict}")
            for line in c["first"]:
                t.add_row("", line)
        if "waves" in r:
            t.add_row("waves", r["waves"])
    Console().print(*tables)


def _repairs_table(rows: list[dict]):
    """The table of :func:`repairs`, one row per hop and their total."""
    from rich.table import Table

    t = Table(title="where losses were repaired (frames sent again)", title_justify="left")
    t.add_column("hop")
    keys = ("lost", "repaired_end_to_end", "repaired_on_hop")
    for name in ("lost", "end to end", "on the hop"):
        t.add_column(name, justify="right")
    for row in rows:
        t.add_row(row["hop"], *(str(row[k]) for k in keys))
    t.add_row("total", *(str(sum(row[k] for row in rows)) for k in keys), style="bold")
    return t
