"""Topologies for the cost model: nodes, directed links with alpha and beta, and fixed routes.

Spec grammar (:func:`parse`)::

    ring:N                      bidirectional ring of N ranks (= torus:N)
    torus:AxBx...               torus of any number of dimensions, A*B*... ranks
    clos:LEAVES x HOSTS:OVERSUB two-tier Clos: LEAVES leaf switches with HOSTS hosts each and
                                HOSTS/OVERSUB uplinks, one to each spine switch
    multirail:SERVERS x GPUS    servers with a scale-up switch (NVSwitch-like) joining their
                                GPUs, and one NIC per GPU on rail switch g (rail-optimized)

Routes are deterministic, so a step's link loads are exact:

* torus: dimension order (dimension 0 first), the shorter way round each
  ring, the + direction on a tie (distance exactly half the ring);
* Clos: host -> leaf -> spine -> leaf -> host, with the spine pinned by the
  *destination*: spine ``(destination's index under its leaf) mod spines``
  (no ECMP hashing, so incast on a spine link shows up);
* multirail: inside a server over the scale-up switch; between servers on
  the destination GPU's rail, first moving to the source server's GPU on
  that rail over scale-up if needed (PXN-style).

Ranks are nodes ``0 .. hosts-1``; switch nodes follow.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np

__all__ = ["Topology", "StepCost", "parse", "ring", "torus", "clos", "multirail", "GRAMMAR"]

GRAMMAR = """topology specs:
  ring:N                       bidirectional ring of N ranks
  torus:AxB[xC...]             torus, any number of dimensions (e.g. torus:8x8, torus:4x4x4)
  clos:LEAVESxHOSTS:OVERSUB    two-tier Clos, e.g. clos:4x8:2 (4 leaves of 8 hosts, 4 uplinks each)
  multirail:SERVERSxGPUS       servers of GPUs on a scale-up switch, one NIC per GPU on its rail"""

#: default link parameters: a 400 Gb/s NIC or torus link, a 450 GB/s scale-up link
NIC_BANDWIDTH = 50e9
NIC_ALPHA = 0.5e-6
SCALEUP_BANDWIDTH = 450e9
SCALEUP_ALPHA = 0.25e-6
ENDPOINT_ALPHA = 1.0e-6


#: From this many hosts on, a torus step is costed by the compiled kernel (:mod:`.torus`), below it
#: by the same algorithm in numpy (:meth:`Topology._torus_step_cost`). The kernel takes 0.4x the
#: CPU time of numpy per step, but loading numba and the kernel costs a process 0.25 s of CPU:
#: a 4,096-rank Swing-bw point went from 0.10 to 0.34 s and a 16,384-rank one from 0.61 to
#: 0.70 s, while a 65,536-rank one saves about 1 s.
COMPILED_TORUS_HOSTS = 32768


@functools.cache
def _torus_kernel():
    """:func:`.torus.step_cost`, imported on the first step of a torus of
    :data:`COMPILED_TORUS_HOSTS` hosts or more: numba's import and loading the kernel from its cache
    (or compiling it, seconds the first time on a machine) stay out of ``import inagg.host.schedules``,
    the smaller tori and the other topologies."""
    from inagg.host.schedules import torus

    return torus.step_cost


@dataclasses.dataclass
class StepCost:
    """One step's congestion (:meth:`Topology.step_cost`): per transfer the sum of its links' alpha
    and its busiest link's beta x load; the busiest link's beta x load over all links, and the
    same over first links only (the load each node puts on its own ports)."""

    alpha_path: np.ndarray
    wait: np.ndarray
    byte_term: float
    ideal_term: float


@dataclasses.dataclass
class Topology:
    """Directed links and a route function.

    ``link_alpha`` is the latency a message pays per link it crosses,
    ``link_beta`` the seconds per byte; ``endpoint_alpha`` the fixed cost of
    one step at the end points (software, NIC doorbell).
    """

    spec: str
    kind: str
    nhosts: int
    nnodes: int
    link_src: np.ndarray
    link_dst: np.ndarray
    link_alpha: np.ndarray
    link_beta: np.ndarray
    endpoint_alpha: float = ENDPOINT_ALPHA
    dims: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()
    _lines: tuple | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def nlinks(self) -> int:
        return len(self.link_src)

    # ------------------------------------------------------------- routes
    def route(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Links of every ``src[i] -> dst[i]`` path as CSR ``(ptr, links)``, in path order."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError("src and dst must be 1-D arrays of equal length")
        for label, a in (("source", src), ("destination", dst)):
            if len(a) and (a.min() < 0 or a.max() >= self.nnodes):
                raise ValueError(f"{label} node out of range 0..{self.nnodes - 1}")
        if (src == dst).any():
            raise ValueError("a route needs two different nodes")
        if self.kind == "torus":
            return self._route_torus(src, dst)
        if self.kind == "clos":
            return self._route_clos(src, dst)
        return self._route_multirail(src, dst)

    def step_cost(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> "StepCost":
        """Congestion of one step whose transfers ``src[i] -> dst[i]`` carry ``nbytes[i]`` each.

        A link's load is the bytes of every transfer that crosses it. On a
        torus the routes are runs along ring lines, so the loads come from
        difference arrays and each run's busiest link from a sparse table
        (work proportional to transfers + links, whatever the path lengths;
        compiled from :data:`COMPILED_TORUS_HOSTS` hosts on); elsewhere from
        the routes themselves (:meth:`route`).
        """
        if self.kind == "torus" and self.nhosts >= COMPILED_TORUS_HOSTS:
            # compiled (torus.py), on contiguous arrays of its one type
            c = _torus_kernel()(*(np.ascontiguousarray(x, dtype=t) for x, t in (
                (src, np.int64), (dst, np.int64), (nbytes, np.float64), (self.dims, np.int64),
                (self.link_alpha, np.float64), (self.link_beta, np.float64))))
            return StepCost(*c)
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        nbytes = np.asarray(nbytes, dtype=float)
        if self.kind == "torus":
            return self._torus_step_cost(src, dst, nbytes)
        ptr, links = self.route(src, dst)
        lens = np.diff(ptr)
        who = np.repeat(np.arange(len(src)), lens)
        load = np.bincount(links, weights=nbytes[who], minlength=self.nlinks) * self.link_beta
        wait = np.zeros(len(src))
        np.maximum.at(wait, who, load[links])
        first = links[ptr[:-1]]
        ideal = np.bincount(first, weights=nbytes, minlength=self.nlinks) * self.link_beta
        return StepCost(np.bincount(who, weights=self.link_alpha[links], minlength=len(src)), wait,
                        float(load.max()), float(ideal.max()))

    def _torus_lines(self) -> dict:
        """Per dimension and direction: link beta as an ``(outer, size, inner)`` array (the dimension in
        the middle) and the link alphas' prefix sums over two turns of each ring line. Kept between
        calls (a schedule costs one step per call) against a copy of the link arrays, so changed link
        parameters are never stale."""
        cached = self._lines
        if cached is not None and np.array_equal(cached[0], self.link_alpha) and np.array_equal(
                cached[1], self.link_beta):
            return cached[2]
        dims, D, p = self.dims, len(self.dims), self.nhosts
        beta = self.link_beta.reshape(p, D, 2)
        alpha = self.link_alpha.reshape(p, D, 2)
        lines = {}
        for d in range(D):
            shape = (math.prod(dims[:d]), dims[d], math.prod(dims[d + 1:]))
            for neg in (0, 1):
                a = alpha[:, d, neg].reshape(shape)
                prefix = np.zeros((shape[0], 2 * shape[1] + 1, shape[2]))
                np.cumsum(np.concatenate([a, a], axis=1), axis=1, out=prefix[:, 1:])
                lines[d, neg] = (shape, beta[:, d, neg].reshape(shape).copy(), prefix)
        self._lines = (self.link_alpha.copy(), self.link_beta.copy(), lines)
        return lines

    def _torus_step_cost(self, src, dst, nbytes):
        dims, D = self.dims, len(self.dims)
        lines = self._torus_lines()
        cs = np.unravel_index(src, dims)
        cd = np.unravel_index(dst, dims)
        cur = list(cs)
        alpha_path = np.zeros(len(src))
        wait = np.zeros(len(src))
        byte_term = 0.0
        first = np.full(len(src), -1, dtype=np.int64)
        for d in range(D):
            size = dims[d]
            delta = (cd[d] - cs[d]) % size
            plus = delta <= size // 2  # a tie (exactly half way) goes the + way
            hops = np.where(plus, delta, size - delta)
            moving = hops > 0
            start = np.ravel_multi_index(tuple(cur), dims)
            todo = (first < 0) & moving
            first[todo] = (start[todo] * D + d) * 2 + (~plus[todo])
            for neg in (0, 1):
                (outer, _, inner), beta, prefix = lines[d, neg]
                t = np.flatnonzero(moving & (~plus if neg else plus))
                if not len(t):
                    continue
                h, w = hops[t], nbytes[t]
                # the run's links leave nodes a, a+1, ..., a+h-1 along the line (mod size)
                a = (cs[d][t] - h + 1) % size if neg else cs[d][t]
                end = a + h  # < 2 size: the run on a line of two turns needs no wrap-around case
                # flat index of the line's node at coordinate 0 in an (outer, size, inner) array
                base = start[t] - cur[d][t] * inner
                o = base // (size * inner)
                # difference array along the two turns of every line, then fold the second turn back
                base2 = base + o * (size * inner)
                diff = np.bincount(np.concatenate([base2 + a * inner, base2 + end * inner]),
                                   weights=np.concatenate([w, -w]), minlength=outer * 2 * size * inner)
                turns = np.cumsum(diff.reshape(outer, 2 * size, inner), axis=1)
                load = turns[:, :size]
                load += turns[:, size:]
                load *= beta
                byte_term = max(byte_term, float(load.max()))
                # sparse table: level j holds the max over 2^j consecutive links, so any run is two lookups
                nlev = int(h.max()).bit_length()
                table = np.empty((nlev, outer, size, inner))
                table[0] = load
                for lev in range(1, nlev):
                    half = 1 << (lev - 1)
                    prev, cur_lev = table[lev - 1], table[lev]
                    np.maximum(prev[:, :size - half], prev[:, half:], out=cur_lev[:, :size - half])
                    np.maximum(prev[:, size - half:], prev[:, :half], out=cur_lev[:, size - half:])
                j = np.frexp(h)[1] - 1  # floor(log2(h)), exact for integers
                flat = table.reshape(-1)
                lev_base = base + j * (outer * size * inner)
                busiest = np.maximum(flat[lev_base + a * inner], flat[lev_base + ((end - (1 << j)) % size) * inner])
                wait[t] = np.maximum(wait[t], busiest)
                pflat = prefix.reshape(-1)
                # prefix is (outer, 2 size + 1, inner)
                pbase = base + o * ((size + 1) * inner)
                alpha_path[t] += pflat[pbase + end * inner] - pflat[pbase + a * inner]
            cur[d] = cd[d]
        ideal = np.bincount(first, weights=nbytes, minlength=self.nlinks) * self.link_beta
        return StepCost(alpha_path, wait, byte_term, float(ideal.max()))

    def _route_torus(self, src, dst):
        dims = self.dims
        D = len(dims)
        cs = np.stack(np.unravel_index(src, dims), axis=1)
        cd = np.stack(np.unravel_index(dst, dims), axis=1)
        cur = cs.copy()
        pieces_t, pieces_order, pieces_link = [], [], []
        offset = np.zeros(len(src), dtype=np.int64)
        for d in range(D):
            size = dims[d]
            delta = (cd[:, d] - cs[:, d]) % size
            plus = delta <= size // 2  # a tie (exactly half way) goes the + way
            hops = np.where(plus, delta, size - delta)
            sign = np.where(plus, 1, -1)
            t = np.repeat(np.arange(len(src)), hops)
            j = np.arange(int(hops.sum())) - np.repeat(np.cumsum(hops) - hops, hops)
            coords = cur[t].copy()
            coords[:, d] = (cs[t, d] + sign[t] * j) % size
            node = np.ravel_multi_index(tuple(coords.T), dims)
            link = (node * D + d) * 2 + (sign[t] < 0)
            pieces_t.append(t)
            pieces_order.append(offset[t] + j)
            pieces_link.append(link)
            offset += hops
            cur[:, d] = cd[:, d]
        return _csr(len(src), np.concatenate(pieces_t), np.concatenate(pieces_order), np.concatenate(pieces_link))

    def _route_clos(self, src, dst):
        L, H, U = self.shape
        N = L * H
        # link ids: host up [0, N), host down [N, 2N), leaf->spine [2N, 2N+L*U), spine->leaf after
        up = lambda h: h
        down = lambda h: N + h
        l2s = lambda l, u: 2 * N + l * U + u
        s2l = lambda u, l: 2 * N + L * U + u * L + l
        paths = []
        for a, b in zip(src.tolist(), dst.tolist()):
            paths.append(self._clos_path(a, b, L, H, U, up, down, l2s, s2l))
        return _csr_lists(paths)

    def _clos_path(self, a, b, L, H, U, up, down, l2s, s2l):
        N = L * H
        def where(x):
            if x < N:
                return "h", x // H
            if x < N + L:
                return "l", x - N
            return "s", x - N - L
        ka, pa = where(a)
        kb, pb = where(b)
        path = []
        # climb from a
        if ka == "h":
            path.append(up(a))
            la = pa
        else:
            la = pa if ka == "l" else None
        if kb == "h":
            lb = pb
        else:
            lb = pb if kb == "l" else None
        if ka == "s":
            spine = pa
        elif kb == "s":
            spine = pb
        else:
            spine = (b % H) % U if kb == "h" else 0
        if not (la is not None and la == lb):  # otherwise turn around at the shared leaf
            if la is not None:
                path.append(l2s(la, spine))
            if lb is not None:
                path.append(s2l(spine, lb))
        if kb == "h":
            path.append(down(b))
        return path

    def _route_multirail(self, src, dst):
        S, G = self.shape
        n = S * G
        # link ids: gpu->nvs [0,n), nvs->gpu [n,2n), nic up [2n,3n), nic down [3n,4n); the GPU and rail
        # ends (all of a collective's traffic) vectorized, one path of up to 4 links per row, -1 padded
        path = np.full((len(src), 4), -1, dtype=np.int64)
        rail = n + S
        ga, gb = src % G, np.where(dst >= rail, dst - rail, dst % G)
        gpu_a, gpu_b = src < n, dst < n
        to_gpu = gpu_a & gpu_b
        up_rail = gpu_a & (dst >= rail)
        down_rail = (src >= rail) & gpu_b
        ga = np.where(src >= rail, src - rail, ga)
        same_server = to_gpu & (src // G == dst // G)
        same_rail = (to_gpu | up_rail | down_rail) & ~same_server & (ga == gb)
        relay_up = (to_gpu | up_rail) & ~same_server & ~same_rail
        relay_down = down_rail & ~same_rail
        relay = (src // G) * G + gb  # the source server's GPU on the destination's rail
        path[same_server, 0], path[same_server, 1] = src[same_server], n + dst[same_server]
        m = same_rail & gpu_a
        path[m, 0] = 2 * n + src[m]
        m = same_rail & gpu_a & gpu_b
        path[m, 1] = 3 * n + dst[m]
        m = same_rail & ~gpu_a
        path[m, 0] = 3 * n + dst[m]
        m = relay_up
        path[m, 0], path[m, 1], path[m, 2] = src[m], n + relay[m], 2 * n + relay[m]
        m = relay_up & gpu_b
        path[m, 3] = 3 * n + dst[m]
        m = relay_down
        down_relay = (dst[m] // G) * G + ga[m]  # the destination server's GPU on the source's rail
        path[m, 0], path[m, 1], path[m, 2] = 3 * n + down_relay, down_relay, n + dst[m]
        rest = np.flatnonzero(~(same_server | same_rail | relay_up | relay_down))
        ptr = np.zeros(len(src) + 1, dtype=np.int64)
        lens = (path >= 0).sum(axis=1)
        other = [_multirail_path(int(src[i]), int(dst[i]), S, G) for i in rest]
        lens[rest] = [len(p) for p in other]
        np.cumsum(lens, out=ptr[1:])
        flat = np.empty(int(ptr[-1]), dtype=np.int64)
        mask = path >= 0
        mask[rest] = False
        flat_rows = np.repeat(np.arange(len(src)), mask.sum(axis=1))
        pos = ptr[flat_rows] + (np.cumsum(mask, axis=1) - 1)[mask]
        flat[pos] = path[mask]
        for i, p in zip(rest, other):
            flat[ptr[i]:ptr[i + 1]] = p
        return ptr, flat

    def switch_node(self, role: tuple) -> int:
        """Topology node of an in-network-aggregation switch role (see :func:`inagg.host.schedules.ina.rail_trees`)."""
        if self.kind == "multirail":
            S, G = self.shape
            if role[0] != "rail":
                raise ValueError(f"a multirail topology has one switch per rail, not a {role[0]} tier")
            return S * G + S + int(role[1])
        if self.kind == "clos":
            L, H, U = self.shape
            if role[0] == "leaf":
                return L * H + int(role[2])
            if role[0] == "spine":
                return L * H + L + int(role[1]) % U
            return L * H  # a single-switch tree sits on leaf 0 (only when there is one leaf)
        raise ValueError(f"a {self.kind} has no switches to aggregate in")


def _multirail_path(a, b, S, G):
    n = S * G
    g2s = lambda x: x
    s2g = lambda x: n + x
    nic_up = lambda x: 2 * n + x
    nic_down = lambda x: 3 * n + x
    def loc(x):
        if x < n:
            return "g", x // G, x % G
        if x < n + S:
            return "nvs", x - n, None
        return "rail", None, x - n - S
    ka, sa, ga = loc(a)
    kb, sb, gb = loc(b)
    if ka == "g" and kb == "g":
        if sa == sb:
            return [g2s(a), s2g(b)]
        if ga == gb:
            return [nic_up(a), nic_down(b)]
        relay = sa * G + gb
        return [g2s(a), s2g(relay), nic_up(relay), nic_down(b)]
    if ka == "g" and kb == "rail":
        if ga == gb:
            return [nic_up(a)]
        relay = sa * G + gb
        return [g2s(a), s2g(relay), nic_up(relay)]
    if ka == "rail" and kb == "g":
        if ga == gb:
            return [nic_down(b)]
        relay = sb * G + ga
        return [nic_down(relay), g2s(relay), s2g(b)]
    if ka == "g" and kb == "nvs" and sa == sb:
        return [g2s(a)]
    if ka == "nvs" and kb == "g" and sa == sb:
        return [s2g(b)]
    raise ValueError(f"no route from node {a} to node {b} in a multirail topology")


def _csr(n, t, order, link):
    idx = np.lexsort((order, t))
    counts = np.bincount(t, minlength=n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, link[idx].astype(np.int64)


def _csr_lists(paths):
    lens = np.array([len(p) for p in paths], dtype=np.int64)
    ptr = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum(lens, out=ptr[1:])
    flat = np.array([x for p in paths for x in p], dtype=np.int64)
    return ptr, flat


def _positive_int(text: str, what: str, spec: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"topology {spec!r}: {what} must be an integer, not {text!r}") from None
    if v < 1:
        raise ValueError(f"topology {spec!r}: {what} must be positive, not {v}")
    return v


def torus(*dims: int, bandwidth: float = NIC_BANDWIDTH, alpha: float = NIC_ALPHA,
          endpoint_alpha: float = ENDPOINT_ALPHA, spec: str | None = None) -> Topology:
    """A torus (a ring for one dimension): two links per node and dimension."""
    dims = tuple(int(d) for d in dims)
    if not dims or any(d < 1 for d in dims):
        raise ValueError(f"torus dimensions must be positive, not {dims}")
    p = math.prod(dims)
    D = len(dims)
    node = np.repeat(np.arange(p), 2 * D)
    d = np.tile(np.repeat(np.arange(D), 2), p)
    neg = np.tile([0, 1], p * D)
    coords = np.stack(np.unravel_index(node, dims), axis=1)
    sizes = np.array(dims)[d]
    coords[np.arange(len(node)), d] = (coords[np.arange(len(node)), d] + np.where(neg, -1, 1)) % sizes
    dst = np.ravel_multi_index(tuple(coords.T), dims)
    nl = len(node)
    return Topology(spec or ("ring:%d" % p if D == 1 else "torus:" + "x".join(map(str, dims))), "torus", p, p,
                    node, dst, np.full(nl, alpha), np.full(nl, 1.0 / bandwidth), endpoint_alpha, dims, dims)


def ring(n: int, **kw) -> Topology:
    return torus(n, **kw)


def clos(leaves: int, hosts: int, oversub: float = 1.0, *, bandwidth: float = NIC_BANDWIDTH,
         alpha: float = NIC_ALPHA, endpoint_alpha: float = ENDPOINT_ALPHA, spec: str | None = None) -> Topology:
    """Two-tier Clos; each leaf has ``hosts / oversub`` uplinks, one per spine."""
    if leaves < 1 or hosts < 1:
        raise ValueError(f"a Clos needs positive leaves and hosts, not {leaves} x {hosts}")
    if oversub <= 0:
        raise ValueError(f"oversubscription must be positive, not {oversub}")
    u = hosts / oversub
    if abs(u - round(u)) > 1e-9 or round(u) < 1:
        raise ValueError(f"{hosts} hosts per leaf at oversubscription {oversub} is not a whole number of uplinks")
    U = int(round(u))
    N = leaves * hosts
    hs = np.arange(N)
    leaf_of = hs // hosts
    lu_l = np.repeat(np.arange(leaves), U)
    lu_u = np.tile(np.arange(U), leaves)
    ul_u = np.repeat(np.arange(U), leaves)
    ul_l = np.tile(np.arange(leaves), U)
    src = np.concatenate([hs, N + leaf_of, N + lu_l, N + leaves + ul_u])
    dst = np.concatenate([N + leaf_of, hs, N + leaves + lu_u, N + ul_l])
    nl = len(src)
    return Topology(spec or f"clos:{leaves}x{hosts}:{oversub:g}", "clos", N, N + leaves + U, src, dst,
                    np.full(nl, alpha), np.full(nl, 1.0 / bandwidth), endpoint_alpha, (), (leaves, hosts, U))


def multirail(servers: int, gpus: int, *, nic_bandwidth: float = NIC_BANDWIDTH, nic_alpha: float = NIC_ALPHA,
              scaleup_bandwidth: float = SCALEUP_BANDWIDTH, scaleup_alpha: float = SCALEUP_ALPHA,
              endpoint_alpha: float = ENDPOINT_ALPHA, spec: str | None = None) -> Topology:
    """Servers of ``gpus`` GPUs on a scale-up switch, GPU g's NIC on rail switch g."""
    if servers < 1 or gpus < 1:
        raise ValueError(f"multirail needs positive servers and GPUs, not {servers} x {gpus}")
    n = servers * gpus
    g = np.arange(n)
    nvs = n + g // gpus
    rail = n + servers + g % gpus
    src = np.concatenate([g, nvs, g, rail])
    dst = np.concatenate([nvs, g, rail, g])
    alpha = np.concatenate([np.full(2 * n, scaleup_alpha), np.full(2 * n, nic_alpha)])
    beta = np.concatenate([np.full(2 * n, 1.0 / scaleup_bandwidth), np.full(2 * n, 1.0 / nic_bandwidth)])
    return Topology(spec or f"multirail:{servers}x{gpus}", "multirail", n, n + servers + gpus, src, dst, alpha,
                    beta, endpoint_alpha, (), (servers, gpus))


_SPEC = re.compile(r"^\s*(?P<kind>[a-z]+)\s*:\s*(?P<body>.+?)\s*$")


def parse(spec: str, **params) -> Topology:
    """Make a topology from a spec string (grammar in the module docstring).

    ``params`` (``bandwidth``, ``alpha``, ``endpoint_alpha``; for multirail
    ``nic_bandwidth``, ``scaleup_bandwidth``, ...) override the defaults.
    """
    if not isinstance(spec, str):
        raise TypeError(f"a topology spec must be a string, not {spec!r}")
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"bad topology spec {spec!r}\n{GRAMMAR}")
    kind, body = m["kind"], m["body"].replace(" ", "")
    if kind == "ring":
        return torus(_positive_int(body, "the number of ranks", spec), spec=spec, **params)
    if kind == "torus":
        dims = [_positive_int(x, "a dimension", spec) for x in body.split("x")]
        return torus(*dims, spec=spec, **params)
    if kind == "clos":
        shape, _, over = body.partition(":")
        parts = shape.split("x")
        if len(parts) != 2:
            raise ValueError(f"topology {spec!r}: expected clos:LEAVESxHOSTS:OVERSUB\n{GRAMMAR}")
        try:
            oversub = float(over) if over else 1.0
        except ValueError:
            raise ValueError(f"topology {spec!r}: oversubscription must be a number, not {over!r}") from None
        return clos(_positive_int(parts[0], "LEAVES", spec), _positive_int(parts[1], "HOSTS", spec), oversub,
                    spec=spec, **params)
    if kind == "multirail":
        parts = body.split("x")
        if len(parts) != 2:
            raise ValueError(f"topology {spec!r}: expected multirail:SERVERSxGPUS\n{GRAMMAR}")
        return multirail(_positive_int(parts[0], "SERVERS", spec), _positive_int(parts[1], "GPUS", spec),
                         spec=spec, **params)
    raise ValueError(f"unknown topology kind {kind!r} in {spec!r}\n{GRAMMAR}")
