"""The controller plans disjoint job regions and unique addresses, and configures the model switch."""

import dataclasses

import pytest

from inagg.host.controller import Controller, plan
from inagg.models.job import ExceptionSpec, Mode
from inagg.models.switch import ModelSwitch


def test_plan_gives_disjoint_regions_and_unique_addresses():
    p = plan([4, 2, 3], window=8)
    assert p.switch.slots == 64 and p.switch.ports == 9
    regions = [(j.slot_base, j.slot_base + j.slots) for j in p.jobs]
    assert regions == [(0, 16), (16, 32), (32, 48)]
    workers = [w for j in p.jobs for w in j.workers]
    for attr in ("port", "mac", "ip", "qpn", "rkey"):
        assert len({getattr(w, attr) for w in workers}) == 9
    assert len({j.rkey for j in p.jobs}) == 3 and [j.window for j in p.jobs] == [8, 8, 8]


def test_controller_configures_and_tears_down():
    p = plan([2, 2])
    sw = ModelSwitch(p.switch)
    with Controller(sw, p):
        assert sorted(sw.jobs) == [1, 2]
    assert sw.jobs == {}


@pytest.mark.parametrize("args, kw, match", [
    ([[]], {}, "plan needs at least one job"),
    ([[0]], {}, "a job has 1..64 workers, not 0"),
    ([[65]], {}, "a job has 1..64 workers, not 65"),
    ([[2]], dict(window=6), "window must be a power of two >= 1, not 6"),
    ([[2, 2, 2]], dict(window=2**14), "3 job\\(s\\) with window 16384 need 131072 slots, more than the 65536 a plan may use"),
    ([[2, 2]], dict(first_job=1023), r"jobs 1023..1024 do not fit the 1024 job numbers"),
    ([[64] * 4], {}, r"256 workers do not fit one /24 beside the switch \(at most 253\)"),
    ([[2]], dict(chunk_bytes=100), r"chunk_bytes must be one of \(256, 512, 1024, 2048, 4096\), not 100"),
])
def test_plan_is_validated(args, kw, match):
    with pytest.raises(ValueError, match=match):
        plan(*args, **kw)


def test_register_target_writes_the_rtl_register_map():
    from inagg.host.controller import RegisterTarget, register_writes
    from inagg.models.regmap import RegMap

    p = plan([2, 3], window=4)
    rm = RegMap(jobs=4, workers=4)
    log = []
    with Controller(RegisterTarget(lambda a, v: log.append((a, v)), rm, p.switch), p):
        assert log == register_writes(p, rm)
        assert log[-1] == (rm.job(2, "CTRL"), 1 | 3 << 8)
        assert (rm.switch("IP"), 0x0A0000FE) in log
        n = len(log)
    assert log[n:] == [(rm.switch("TEARDOWN"), 2), (rm.switch("TEARDOWN"), 1)]


@pytest.mark.parametrize("worker_rkeys", [False, True])
def test_register_target_writes_each_workers_key_and_port(worker_rkeys):
    """Issue 21: every worker's CONTRIB_RKEY (its own, else the job's) and the PORT its contributions must come
    in on, before the job's CTRL."""
    from inagg.host.controller import RegisterTarget
    from inagg.models.regmap import RegMap

    p = plan([2, 3], window=4, worker_rkeys=worker_rkeys)
    rm = RegMap(jobs=4, workers=4)
    log = []
    Controller(RegisterTarget(lambda a, v: log.append((a, v)), rm, p.switch), p).configure()
    at = {a: i for i, (a, _) in enumerate(log)}
    keys = []
    for job in p.jobs:
        for w, ws in enumerate(job.workers):
            keys.append(dict(log)[rm.worker(job.job, w, "CONTRIB_RKEY")])
            assert dict(log)[rm.worker(job.job, w, "PORT")] == ws.port
            assert at[rm.worker(job.job, w, "CONTRIB_RKEY")] < at[rm.job(job.job, "CTRL")]
    assert keys == [j.contrib_rkey(w) for j in p.jobs for w in range(len(j.workers))]
    assert len(set(keys)) == (5 if worker_rkeys else 2)


def test_register_target_waits_for_the_teardown_and_reports_a_refusal():
    from inagg.host.controller import RegisterTarget
    from inagg.models.regmap import TEARDOWN_BUSY, TEARDOWN_REFUSED, RegMap

    p = plan([2])
    rm = RegMap(jobs=2, workers=2)
    reads = iter([rm.ctrl(p.jobs[0]), TEARDOWN_BUSY, TEARDOWN_BUSY, 0, TEARDOWN_BUSY, TEARDOWN_REFUSED])
    seen = []
    target = RegisterTarget(lambda a, v: None, rm, p.switch, read=lambda a: seen.append(a) or next(reads))
    target.add_job(p.jobs[0])
    assert seen == [rm.job(1, "CTRL")]  # read back: the switch took the job
    seen.clear()
    target.remove_job(1)
    assert seen == [rm.switch("TEARDOWN")] * 3
    with pytest.raises(RuntimeError, match=r"refused to tear job 1 down \(TEARDOWN 0x00000002\)"):
        target.remove_job(1)


def test_register_target_refuses_a_job_the_geometry_cannot_hold_before_writing():
    from inagg.host.controller import RegisterTarget
    from inagg.models.regmap import RegMap

    p = plan([3])
    log = []
    with pytest.raises(ValueError, match="job 1 has 3 workers, the switch at most 2"):
        Controller(RegisterTarget(lambda a, v: log.append((a, v)), RegMap(jobs=2, workers=2), p.switch), p).configure()
    assert log == []


def test_plan_tree_configures_every_switch_from_one_description():
    from inagg.host.controller import TreeController, plan_tree
    from inagg.models.job import Collective
    from inagg.models.protocol import switch_qpn

    p = plan_tree("2x4", window=4, collective="broadcast", root=5)
    root, a, b = (q.jobs[0] for q in p.plans)
    assert p.collective is Collective.BROADCAST and [q.switch.ports for q in p.plans] == [2, 5, 5]
    assert root.parent is None and root.subswitches == {0, 1} and (root.root, a.root, b.root) == (1, None, 1)
    for i, child in enumerate((a, b)):
        up, me = child.parent, root.workers[i]
        assert (up.port, up.mac, up.ip) == (4, p.plans[0].switch.mac, p.plans[0].switch.ip)
        assert (up.qpn, up.rkey) == (switch_qpn(root.job, i), root.rkey)
        assert (up.result_qpn, up.result_rkey, up.result_va) == (me.qpn, me.rkey, me.result_va)
        assert (me.mac, me.ip) == (p.plans[i + 1].switch.mac, p.plans[i + 1].switch.ip)
    assert p.rank(5) == (2, 1) and b.workers[1].ip == p.tree.rank_ip(5)
    switches = [ModelSwitch(q.switch) for q in p.plans]
    with TreeController(switches, p):
        assert all(list(s.jobs) == [1] for s in switches)
    assert all(not s.jobs for s in switches)


@pytest.mark.parametrize("kw, match", [
    (dict(window=3), "window must be a power of two >= 1, not 3"),
    (dict(job=1024), r"job must be an integer in 0..1023, not 1024"),
    (dict(collective="gather"), "'gather' is not a valid Collective"),
    (dict(collective="reduce", root=8), r"root must be a rank in 0..7, not 8"),
])
def test_plan_tree_is_validated(kw, match):
    from inagg.host.controller import plan_tree

    with pytest.raises(ValueError, match=match):
        plan_tree("2x4", **kw)


def test_tree_controller_needs_one_target_per_switch():
    from inagg.host.controller import TreeController, plan_tree

    with pytest.raises(ValueError, match="the tree has 3 switches, not 1"):
        TreeController([ModelSwitch()], plan_tree("2x2"))


def test_register_target_refuses_a_mode_ii_job_on_an_installed_jobs_slots_before_writing():
    """Issue 18: the target remembers what it installed; a Mode II job on those slots waits for their teardown."""
    from inagg.host.controller import RegisterTarget
    from inagg.models.regmap import RegMap

    p = plan([2, 2], window=2)
    uc, other = p.jobs
    ii = dataclasses.replace(other, mode=Mode.TRANSLATED, slot_base=uc.slot_base)
    log = []
    spec = dataclasses.replace(p.switch, exception=ExceptionSpec(table=4))
    target = RegisterTarget(lambda a, v: log.append((a, v)), RegMap(jobs=4, workers=2), spec)
    target.add_job(uc)
    log.clear()
    with pytest.raises(ValueError, match=rf"^job {ii.job}'s slots 0\.\.3 overlap job {uc.job}'s 0\.\.3 and one of "
                                         "them is a Mode II or III job"):
        target.add_job(ii)
    assert log == []
    target.remove_job(uc.job)
    target.add_job(ii)
    assert log[-1] == (RegMap(jobs=4, workers=2).job(ii.job, "CTRL"), RegMap.ctrl(ii))
