"""MSCCL XML: export of every generator, the validator's rules, and XML -> IR -> executor round trips."""

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from inagg.host.schedules import Collective, ScheduleError, check, generate
from inagg.host.schedules import alltoall as F
from inagg.host.schedules import msccl as M
from inagg.host.schedules import cli
from inagg.host.schedules.registry import ALGORITHMS

# (algorithm, collective) pairs whose steps map onto MSCCL: every registered one except the
# in-network schedules (switch nodes) and all-to-allv (the XML has no count matrix; the equal-count
# all-to-all of the same generators is exported), so a new generator is covered as it is registered
EXPORTABLE = [(a, c.value) for a, (colls, _) in ALGORITHMS.items() for c in colls
              if a != "ina" and c is not Collective.ALLTOALLV]


def test_every_generator_but_ina_is_exported():
    assert {a for a, _ in EXPORTABLE} == set(ALGORITHMS) - {"ina"}
    assert ("swing-bw", "allgather") in EXPORTABLE and ("trivance-bw", "reduce_scatter") in EXPORTABLE


def round_trip(schedule, **check_kw):
    text = M.export(schedule)
    assert M.problems(text) == []
    back = M.load(text)
    assert back.collective is (Collective.ALLTOALL if schedule.collective is Collective.ALLTOALLV
                               else schedule.collective)
    check(back, **check_kw)
    return text, back


@pytest.mark.parametrize("n", [2, 3, 5, 8, 9, 13])
@pytest.mark.parametrize("algo,coll", EXPORTABLE, ids=lambda x: str(x))
def test_every_generator_round_trips(algo, coll, n):
    opts = {"gpus_per_server": 1} if algo == "fast" else {}
    round_trip(generate(algo, n, collective=coll, **opts))


@settings(max_examples=40, deadline=None)
@given(pair=st.sampled_from(EXPORTABLE), n=st.integers(1, 16), elems=st.integers(1, 3),
       dtype=st.sampled_from([np.int32, np.float32, np.float64]), seed=st.integers(0, 5))
def test_round_trip_property(pair, n, elems, dtype, seed):
    algo, coll = pair
    round_trip(generate(algo, n, collective=coll), chunk_elems=elems, dtype=dtype, seed=seed)


def test_fast_on_servers_round_trips():
    s = F.fast(np.full((8, 8), 2), 4)  # 2 servers x 4 GPUs: relays through the rail GPUs' scratch
    _, back = round_trip(s)
    assert back.collective is Collective.ALLTOALL and back.size_chunks == 16


def test_long_runs_are_cut_at_the_count_limit():
    s = generate("ring", 4, chunks_per_block=100)
    text, _ = round_trip(s)
    cnt = M.parse(text).steps["cnt"]
    assert cnt.max() == M.LIMITS.max_count - 1 and (cnt[cnt > 0] >= 1).all()


def test_file_format():
    text = M.export(generate("ring", 3), proto="LL", name="ring3")
    root = ET.fromstring(text)
    assert root.tag == "algo"
    assert {k: root.get(k) for k in ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
                                    "outofplace", "minBytes", "maxBytes")} == {
        "name": "ring3", "proto": "LL", "nchannels": "2", "nchunksperloop": "6", "ngpus": "3",
        "coll": "allreduce", "inplace": "1", "outofplace": "0", "minBytes": "0", "maxBytes": "0"}
    g = root.find("gpu[@id='1']")
    assert (g.get("i_chunks"), g.get("o_chunks"), g.get("s_chunks")) == ("0", "6", "0")
    for tb in root.iter("tb"):
        assert [int(s.get("s")) for s in tb.iter("step")] == list(range(len(tb.findall("step"))))
    # in place, NCCL's reduce-scatter output is the rank's block of the input: the whole buffer is `i`
    rs = ET.fromstring(M.export(generate("ring", 3, collective="reduce_scatter")))
    assert {s.get("srcbuf") for s in rs.iter("step")} == {"i"}
    assert rs.find("gpu").get("i_chunks") == "6" and rs.find("gpu").get("o_chunks") == "0"


def test_export_refuses_what_msccl_cannot_express():
    with pytest.raises(M.MscclError, match="switch node.*in-network schedules cannot be exported"):
        M.export(generate("ina", 8, gpus_per_server=2))
    with pytest.raises(M.MscclError, match="abstract schedule"):
        M.export(generate("ring", 8, abstract=True))
    with pytest.raises(M.MscclError, match="only an all-to-allv with equal counts"):
        M.export(F.direct(np.array([[0, 1], [2, 0]])))
    with pytest.raises(M.MscclError, match="proto must be one of Simple, LL, LL128, not 'LL64'"):
        M.export(generate("ring", 3), proto="LL64")
    with pytest.raises(M.MscclError, match=r"tb 0: 398 steps, the runtime allows 256"):
        M.export(generate("ring", 200))
    with pytest.raises(TypeError, match="lower needs a Schedule"):
        M.lower("ring")


# ------------------------------------------------------------ hand-written files
def fused_ring(n: int) -> str:
    """A ring all-reduce as MSCCL tools write it: one thread block per GPU, fused rrs / rrcs / rcs steps,
    in place on the `i` buffer (o_chunks 0)."""
    lines = [f'<algo name="fring" proto="Simple" nchannels="1" nchunksperloop="{n}" ngpus="{n}" coll="allreduce" '
             f'inplace="1" outofplace="0" minBytes="0" maxBytes="0">']
    for r in range(n):
        ops = [("s", (r - 1) % n)] + [("rrs", (r - 1 - t) % n) for t in range(1, n - 1)] + [("rrcs", r)]
        ops += [("rcs", (r - g) % n) for g in range(1, n - 1)] + [("r", (r + 1) % n)]
        lines.append(f'<gpu id="{r}" i_chunks="{n}" o_chunks="0" s_chunks="0">')
        lines.append(f'<tb id="0" send="{(r + 1) % n}" recv="{(r - 1) % n}" chan="0">')
        for i, (t, c) in enumerate(ops):
            lines.append(f'<step s="{i}" type="{t}" srcbuf="i" srcoff="{c}" dstbuf="i" dstoff="{c}" cnt="1" '
                         f'depid="-1" deps="-1" hasdep="0"/>')
        lines.append("</tb></gpu>")
    return "\n".join(lines + ["</algo>"])


def gather_ring(n: int) -> str:
    """An in-place all-gather: each GPU sends its input block (`i` 0, which is `o` r), then forwards."""
    lines = [f'<algo name="gring" proto="LL" nchannels="1" nchunksperloop="{n}" ngpus="{n}" coll="allgather" '
             f'inplace="1" outofplace="0" minBytes="0" maxBytes="0">']
    for r in range(n):
        lines.append(f'<gpu id="{r}" i_chunks="1" o_chunks="{n}" s_chunks="0">'
                     f'<tb id="0" send="{(r + 1) % n}" recv="{(r - 1) % n}" chan="0">'
                     f'<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="{r}" cnt="1" depid="-1" '
                     f'deps="-1" hasdep="0"/>')
        for g in range(1, n):
            lines.append(f'<step s="{g}" type="{"rcs" if g < n - 1 else "r"}" srcbuf="o" srcoff="{(r - g) % n}" '
                         f'dstbuf="o" dstoff="{(r - g) % n}" cnt="1" depid="-1" deps="-1" hasdep="0"/>')
        lines.append("</tb></gpu>")
    return "\n".join(lines + ["</algo>"])


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_hand_written_fused_and_aliased_files(n):
    check(M.load(fused_ring(n)))
    check(M.load(gather_ring(n)))


def test_a_file_without_its_waits_is_caught_by_the_executor():
    prog = M.parse(M.export(generate("ring", 4)))
    st_ = prog.steps
    st_["depid"][:] = -1
    st_["deps"][:] = -1
    st_["hasdep"][:] = 0
    assert M.problems(prog) == []  # legal, but racy: the runtime would run it
    with pytest.raises(ScheduleError, match="ring .allreduce, 4 ranks.: rank"):
        check(M.to_schedule(prog))


def test_the_wrong_reduce_order_is_caught():
    text = fused_ring(3).replace('type="rrcs"', 'type="rcs"', 1)  # gpu 0 forgets to add its own block
    with pytest.raises(ScheduleError, match="fring"):
        check(M.load(text))


# ------------------------------------------------------------------ validator
def edit(text: str, fn) -> str:
    root = ET.fromstring(text)
    fn(root)
    return ET.tostring(root, encoding="unicode")


def step(root, g, tb, s):
    return root.find(f"gpu[@id='{g}']/tb[@id='{tb}']/step[@s='{s}']")


BASE = M.export(generate("ring", 3))


def one_problem(text, limits=M.LIMITS):
    found = M.problems(text, limits)
    assert found, "the validator accepted a broken file"
    return found[0]


def test_parse_errors():
    with pytest.raises(M.MscclError, match="not well-formed XML"):
        M.parse("<algo")
    with pytest.raises(M.MscclError, match="the root element must be <algo>, not <graph>"):
        M.parse("<graph/>")
    with pytest.raises(M.MscclError, match="algo: attribute nchunksperloop is missing"):
        M.parse(edit(BASE, lambda r: r.attrib.pop("nchunksperloop")))
    with pytest.raises(M.MscclError, match="gpu 0 tb 0 step 1: unknown step type 'x'"):
        M.parse(edit(BASE, lambda r: step(r, 0, 0, 1).set("type", "x")))
    with pytest.raises(M.MscclError, match="gpu 0 tb 0 step 1: srcbuf must be i, o or s, not 'q'"):
        M.parse(edit(BASE, lambda r: step(r, 0, 0, 1).set("srcbuf", "q")))
    with pytest.raises(M.MscclError, match="gpu 0 tb 0 step 1: attribute cnt must be an integer, not 'two'"):
        M.parse(edit(BASE, lambda r: step(r, 0, 0, 1).set("cnt", "two")))


def test_algo_and_gpu_rules():
    assert "proto must be one of" in one_problem(edit(BASE, lambda r: r.set("proto", "Fast")))
    assert "unknown collective 'gossip'" in one_problem(edit(BASE, lambda r: r.set("coll", "gossip")))
    assert "gpu ids must be 0..2" in one_problem(edit(BASE, lambda r: r.find("gpu[@id='2']").set("id", "5")))
    assert one_problem(edit(BASE, lambda r: r.set("nchunksperloop", "12"))) == (
        "gpu 0: in-place allreduce needs i_chunks or o_chunks >= 12")
    ag = M.export(generate("ring", 3, collective="allgather"))
    assert one_problem(edit(ag, lambda r: r.set("nchunksperloop", "7"))) == (
        "nchunksperloop 7 of allgather must be a multiple of ngpus 3")


def test_thread_block_rules():
    def gap(r):
        r.find("gpu[@id='0']/tb[@id='3']").set("id", "4")
    assert one_problem(edit(BASE, gap)).startswith("gpu 0: thread block ids must be 0, 1, 2, ...")
    assert one_problem(edit(BASE, lambda r: r.find("gpu[@id='0']/tb[@id='0']").set("send", "0"))) == (
        "gpu 0 tb 0: send peer 0 must be -1 or another gpu in 0..2")
    assert one_problem(edit(BASE, lambda r: r.find("gpu[@id='0']/tb[@id='0']").set("chan", "2"))) == (
        "gpu 0 tb 0: channel 2 is not in 0..1 (nchannels 2)")

    def twice(r):  # tb 1 sends to gpu 2 on channel 1; make tb 0 do so too
        r.find("gpu[@id='0']/tb[@id='0']").set("send", "2")
        r.find("gpu[@id='0']/tb[@id='0']").set("chan", "1")
    assert one_problem(edit(BASE, twice)) == "gpu 0: more than one thread block sends to gpu 2 on channel 1"
    assert one_problem(M.export(generate("rd", 4)), M.Limits(tbs_per_channel=1)) == (
        "gpu 0: 2 send peers on channel 0, the runtime allows 1")


def test_step_rules():
    assert one_problem(edit(BASE, lambda r: step(r, 0, 0, 1).set("s", "5"))).endswith(
        "step numbers of a thread block must be 0, 1, 2, ... in order")
    assert one_problem(BASE, M.Limits(max_steps=3)) == "gpu 0 tb 0: 4 steps, the runtime allows 3"
    assert one_problem(edit(BASE, lambda r: step(r, 0, 0, 0).set("cnt", "72"))) == (
        "gpu 0 tb 0 step 0: cnt 72 must be in 1..71")
    assert one_problem(edit(BASE, lambda r: step(r, 0, 2, 0).set("type", "rrs"))) == (
        "gpu 0 tb 2 step 0: a rrs step needs a send peer, but its thread block has send=-1")
    assert one_problem(edit(BASE, lambda r: step(r, 0, 0, 0).set("srcoff", "6"))) == (
        "gpu 0 tb 0 step 0: source chunks 6..6 are outside buffer o (6 chunks)")
    assert one_problem(edit(BASE, lambda r: step(r, 0, 3, 0).set("dstbuf", "s"))) == (
        "gpu 0 tb 3 step 0: destination chunks 2..2 are outside buffer s (0 chunks)")


def test_dependency_rules():
    assert one_problem(edit(BASE, lambda r: step(r, 0, 0, 1).set("deps", "9"))) == (
        "gpu 0 tb 0 step 1: depends on gpu 0 tb 3 step 9, which does not exist")
    assert one_problem(edit(BASE, lambda r: step(r, 0, 0, 1).set("depid", "0"))) == (
        "gpu 0 tb 0 step 1: depends on its own thread block (its steps run in order anyway)")
    assert one_problem(edit(BASE, lambda r: step(r, 0, 3, 0).set("hasdep", "0"))) == (
        "gpu 0 tb 0 step 1: waits for gpu 0 tb 3 step 0, which has hasdep=0 and never signals")
    assert one_problem(edit(BASE, lambda r: step(r, 0, 0, 1).set("depid", "-1"))) == (
        "gpu 0 tb 0 step 1: depid -1 and deps 0 must both be -1 or name a step")
    assert one_problem(BASE, M.Limits(max_dep_tb=2)) == (
        "gpu 0 tb 0 step 1: depends on thread block 3; the runtime stores at most 2")

    def nop_chain(r):  # step 1 becomes a nop whose wait step 2 must carry, but step 2 waits for nothing
        step(r, 0, 0, 1).set("type", "nop")
        step(r, 0, 0, 2).set("depid", "-1")
        step(r, 0, 0, 2).set("deps", "-1")
    assert "follows nop steps but has no dependency of its own" in one_problem(edit(BASE, nop_chain))

    def trailing_nop(r):
        step(r, 0, 0, 3).set("type", "nop")
    found = M.problems(edit(BASE, trailing_nop))
    assert "gpu 0 tb 0 step 3: a nop at the end of a thread block waits for nothing" in found[0]


def test_send_receive_matching_and_deadlock():
    def drop_recv(r):
        tb = r.find("gpu[@id='1']/tb[@id='3']")
        tb.remove(tb.find("step[@s='3']"))
    assert one_problem(edit(BASE, drop_recv)) == (
        "gpu 2 sends 4 time(s) to gpu 1 on channel 1 but gpu 1 receives 3 time(s) from it")

    def two_chunks(r):
        step(r, 0, 0, 0).set("cnt", "2")
    assert one_problem(edit(BASE, two_chunks)) == (
        "gpu 0 tb 0 step 0 sends 2 chunk(s) but the receive it meets, gpu 1 tb 2 step 0, takes 1")

    # both GPUs first wait for what the other sends only after its own receive: a cycle
    swap = ['<algo name="swap" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" '
            'inplace="1" outofplace="0" minBytes="0" maxBytes="0">']
    for g in (0, 1):
        p = 1 - g
        swap.append(f'<gpu id="{g}" i_chunks="0" o_chunks="2" s_chunks="0">'
                    f'<tb id="0" send="-1" recv="{p}" chan="0"><step s="0" type="rrc" srcbuf="o" srcoff="0" '
                    f'dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/></tb>'
                    f'<tb id="1" send="{p}" recv="-1" chan="0"><step s="0" type="s" srcbuf="o" srcoff="0" '
                    f'dstbuf="o" dstoff="0" cnt="1" depid="0" deps="0" hasdep="0"/></tb></gpu>')
    text = "".join(swap + ["</algo>"])
    assert one_problem(text).startswith("deadlock: the waits, step orders and send/receive pairs form a cycle")
    with pytest.raises(M.MscclError, match="invalid MSCCL algorithm 'swap': deadlock"):
        M.load(text)


def test_import_refusals():
    with pytest.raises(M.MscclError, match="collective 'broadcast' cannot be imported"):
        M.load(BASE.replace('coll="allreduce"', 'coll="broadcast"'))
    a2a = M.export(generate("bruck", 4, collective="alltoall"))
    with pytest.raises(M.MscclError, match="an in-place alltoall cannot be imported"):
        M.load(a2a.replace('inplace="0"', 'inplace="1"'))


def test_cli_export(capsys, tmp_path):
    out = tmp_path / "swing.xml"
    rc = cli.main(["schedule", "--algo", "swing-bw", "--topo", "torus:4x4", "--export-msccl", str(out), "--json"])
    assert rc == 0
    assert '"msccl"' in capsys.readouterr().out
    check(M.load(out))
    rc = cli.main(["schedule", "--algo", "ina", "--topo", "multirail:2x4", "--export-msccl", str(tmp_path / "x")])
    assert rc == 2 and "in-network schedules cannot be exported" in capsys.readouterr().err
    assert M.main([str(out)]) == 0 and "valid; computes allreduce on 16 GPUs" in capsys.readouterr().out
