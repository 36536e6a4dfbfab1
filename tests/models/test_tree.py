"""The tree description: parsing, numbering, ports and addresses, and the tree fields of a job."""

import pytest

from inagg.models.job import Collective, JobSpec, Uplink, WorkerSpec, check_job
from inagg.models.tree import MAX_DEPTH, Tree


def test_2x4_numbers_switches_breadth_first_and_ranks_left_to_right():
    t = Tree.parse("2x4")
    assert (t.spec, t.ranks, t.depth, len(t.switches)) == ("2x4", 8, 2, 3)
    root, a, b = t.switches
    assert root.parent is None and root.uplink_port is None and root.ports == 2
    assert [(c.switch, c.index) for c in root.children] == [(True, 1), (True, 2)]
    assert (a.parent, a.position, a.uplink_port, a.ports) == (0, 0, 4, 5)
    assert [c.index for c in b.children] == [4, 5, 6, 7] and not any(c.switch for c in b.children)
    assert [t.leaf_of(r) for r in (0, 3, 4, 7)] == [(1, 0), (1, 3), (2, 0), (2, 3)]
    assert [root.child_towards(r) for r in (0, 5)] == [0, 1] and a.child_towards(5) is None


def test_depth_3_and_a_single_switch():
    t = Tree.parse(" 2X2x2 ")
    assert t.spec == "2x2x2" and len(t.switches) == 7 and t.ranks == 8
    assert [s.level for s in t.switches] == [0, 1, 1, 2, 2, 2, 2]
    assert t.switches[5].ranks == range(4, 6) and t.leaf_of(5) == (5, 1)
    one = Tree.parse("4")
    assert len(one.switches) == 1 and one.root.ports == 4 and one.leaf_of(3) == (0, 3)


def test_every_address_is_unique():
    t = Tree.parse("3x5x2")
    macs = [s.mac for s in t.switches] + [t.rank_mac(r) for r in range(t.ranks)]
    ips = [s.ip for s in t.switches] + [t.rank_ip(r) for r in range(t.ranks)]
    assert len(set(macs)) == len(macs) == len(set(ips)) == len(t.switches) + t.ranks


@pytest.mark.parametrize("spec, match", [
    ("", r"fan-outs are positive integers joined by 'x' \(e.g. '2x4'\), not ''"),
    ("2x", r"not ''"),
    ("2xa", r"not 'a'"),
    ("2x²", r"not '²'"),
    ("0", r"a switch has 1..64 children, not 0"),
    ("2x65", r"a switch has 1..64 children, not 65"),
    ("x".join(["2"] * (MAX_DEPTH + 1)), rf"depth {MAX_DEPTH + 1} exceeds {MAX_DEPTH}"),
    ("64x64x64", r"262144 ranks exceed 32768"),
])
def test_bad_specs_are_refused(spec, match):
    with pytest.raises(ValueError, match=match) as e:
        Tree.parse(spec)
    assert str(e.value).startswith(f"tree spec {spec!r}: ")


def test_leaf_of_refuses_a_missing_rank():
    with pytest.raises(ValueError, match=r"rank must be an integer in 0..7, not 8"):
        Tree.parse("2x4").leaf_of(8)


_W = tuple(WorkerSpec(port=i, mac=f"02:00:00:00:01:{i:02x}", ip=f"10.0.0.{i + 1}", qpn=i, rkey=i, result_va=0)
           for i in range(2))
_UP = Uplink(port=2, mac="02:00:00:00:00:fe", ip="10.0.0.254", qpn=0xA50040, rkey=1, result_qpn=5, result_rkey=6,
             result_va=0)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(parent="up"), TypeError, "parent must be an Uplink or None, not str"),
    (dict(subswitches={2}), ValueError, r"subswitches must be worker indices in 0..1, not 2"),
    (dict(collective="reduce"), TypeError, "collective must be a Collective, not 'reduce'"),
    (dict(root=0), ValueError, "allreduce has no root, but root is 0"),
    (dict(collective=Collective.REDUCE), ValueError, "reduce needs the root rank below the top switch"),
    (dict(collective=Collective.BROADCAST, root=2), ValueError, r"root must be a worker index in 0..1, not 2"),
])
def test_tree_fields_of_a_job_are_validated(kw, exc, match):
    with pytest.raises(exc, match=match):
        JobSpec(job=1, rkey=1, slot_base=0, slots=4, workers=_W, **kw)


def test_a_rooted_job_below_its_root_has_no_root_child():
    j = JobSpec(job=1, rkey=1, slot_base=0, slots=4, workers=_W, parent=_UP, collective=Collective.REDUCE)
    assert j.root is None and j.subswitches == frozenset()


@pytest.mark.parametrize("port, ports, match", [
    (2, 2, "uplink port 2 does not exist: the switch has 2 ports"),
    (1, 3, "uplink port 1 is a worker's port too"),
])
def test_check_job_checks_the_uplink_port(port, ports, match):
    import dataclasses

    j = JobSpec(job=1, rkey=1, slot_base=0, slots=4, workers=_W, parent=dataclasses.replace(_UP, port=port))
    with pytest.raises(ValueError, match=match):
        check_job(j, ports=ports, slots=4, exception=None)


def test_peer_names_the_far_end_of_every_port():
    t = Tree.parse("2x3")
    assert t.peer(0, 1) == (t.switches[0].children[1], 3)
    assert t.peer(2, 3) == (t.switches[1].children[0].__class__(True, 0), 1)
    assert t.peer(2, 0) == (t.switches[2].children[0], None) and t.switches[2].children[0].index == 3
    with pytest.raises(ValueError, match=r"switch 0 has no port 2: it uses ports 0..1"):
        t.peer(0, 2)


def test_ranks_default_to_the_workers_and_cannot_be_fewer():
    assert JobSpec(job=1, rkey=1, slot_base=0, slots=4, workers=_W).ranks == 2
    assert JobSpec(job=1, rkey=1, slot_base=0, slots=4, workers=_W, ranks=8).ranks == 8
    with pytest.raises(ValueError, match="ranks must be an integer >= the job's 2 workers, not 1"):
        JobSpec(job=1, rkey=1, slot_base=0, slots=4, workers=_W, ranks=1)
