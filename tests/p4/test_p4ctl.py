"""The P4 control plane: generated entries against the job description and the model switch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inagg.host.p4ctl import bfrt, bmv2
from inagg.host.p4ctl.layout import mcast_group_id, plan, psn_index
from inagg.host.p4ctl.vectors import switch_for
from inagg.models import wire
from inagg.models.job import ExceptionSpec, JobSpec, SwitchSpec, WorkerSpec
from inagg.models.p4profile import TNA, V1MODEL, P4ProfileSwitch
from inagg.models.protocol import split_qpn


def jobs_and_spec(target):
    spec, jobs = switch_for(target)
    return spec, list(jobs)


@pytest.mark.parametrize("target", [V1MODEL, TNA], ids=lambda t: t.name)
def test_plan_matches_job_description_and_model(target):
    spec, jobs = jobs_and_spec(target)
    p = plan(target, spec, jobs)
    model = P4ProfileSwitch(target, spec)
    for j in jobs:
        model.add_job(j)  # the model accepts exactly what the plan accepts
    assert len(p.workers) == len(p.results) == sum(len(j.workers) for j in jobs)
    by_job = {j.job: j for j in jobs}
    for w in p.workers:
        job = by_job[w.job]
        assert split_qpn(w.qpn) == (w.job, w.worker)
        assert (w.rkey, w.slot_base, w.slot_mask + 1, w.nworkers) == (job.contrib_rkey(w.worker), job.slot_base, job.slots, len(job.workers))
        assert w.port == job.workers[w.worker].port and w.full == (1 << len(job.workers)) - 1
    for r in p.results:
        ws = by_job[r.job].workers[r.worker]
        assert r.mac.to_bytes(6, "big") == wire.mac_bytes(ws.mac) and r.ip.to_bytes(4, "big") == wire.ip_bytes(ws.ip)
        assert (r.qpn, r.rkey, r.result_va) == (ws.qpn, ws.rkey, ws.result_va)
    assert [g.group for g in p.groups] == [mcast_group_id(j.job) for j in sorted(jobs, key=lambda j: j.job)]
    for g, j in zip(p.groups, sorted(jobs, key=lambda j: j.job)):
        assert g.nodes == tuple((i, w.port) for i, w in enumerate(j.workers))
    assert dict(p.psns) == {psn_index(target, j.job, i): w.result_psn for j in jobs for i, w in enumerate(j.workers)}


@pytest.mark.parametrize("target", [V1MODEL, TNA], ids=lambda t: t.name)
def test_per_worker_r_keys_go_into_the_workers_table(target):
    """Issue 21: both programs' ``workers`` entries carry an R_Key per QPN, so the plan writes each worker's own
    contribution R_Key; the profile model checks it. The entry's port binds the QPN to it: on another port the
    QPN names no worker (check 14)."""
    import dataclasses

    import numpy as np

    from inagg.models.protocol import Counter
    from inagg.testbench.traffic import contribution

    spec, jobs = jobs_and_spec(target)
    job = jobs[0]
    job = dataclasses.replace(job, workers=tuple(dataclasses.replace(w, contrib_rkey=0x7100_0000 + i)
                                                 for i, w in enumerate(job.workers)))
    p = plan(target, spec, [job])
    assert [w.rkey for w in p.workers] == [0x7100_0000 + i for i in range(len(job.workers))]
    if target is V1MODEL:
        assert f"0x{job.qpn(1):06x} => {job.job} 1 0x71000001 " in "\n".join(bmv2.commands(p))
    else:
        assert "rkey=0x71000001," in bfrt.script(p)
    model = P4ProfileSwitch(target, spec)
    model.add_job(job)
    lanes = np.ones(spec.lanes, np.int32)
    port = job.workers[0].port
    for key in (job.contrib_rkey(1), job.rkey):
        model.receive(port, contribution(spec, job, 0, 0, lanes, rkey=key))
    assert model.counters[Counter.DROP_BAD_RKEY] == 2
    model.receive((port + 1) % spec.ports, contribution(spec, job, 0, 0, lanes))
    assert model.counters[Counter.RX_CONTRIB] == 0 and model.counters[Counter.DROP_UNKNOWN_QPN] == 1


def test_bmv2_commands():
    spec, jobs = jobs_and_spec(V1MODEL)
    cmds = bmv2.commands(plan(V1MODEL, spec, jobs))
    assert cmds[:len(bmv2.SLOT_REGISTERS)] == [f"register_reset {r}" for r in bmv2.SLOT_REGISTERS]
    assert "table_set_default InaggIngress.switch_config InaggIngress.set_switch 0xffff 0x0200000000fe 0x0a0000fe" in cmds
    j = jobs[0]
    w = j.workers[1]
    assert (f"table_add InaggIngress.workers InaggIngress.set_worker 0x{j.qpn(1):06x} => "
            f"{j.job} 1 0x{j.rkey:08x} {j.slot_base} {j.slots - 1} {len(j.workers)} {w.port}") in cmds
    rewrite = [c for c in cmds if c.startswith(f"table_add InaggEgress.results InaggEgress.rewrite {j.job} 1 =>")]
    assert rewrite == [f"table_add InaggEgress.results InaggEgress.rewrite {j.job} 1 => 0x{wire.mac_bytes(w.mac).hex()} "
                       f"0x{wire.ip_bytes(w.ip).hex()} 0x{w.qpn:06x} 0x{w.rkey:08x} 0x{w.result_va:016x}"]
    # Node handles count up from 0 and every node joins its job's group.
    nodes = [c for c in cmds if c.startswith(("mc_mgrp_create", "mc_node_create", "mc_node_associate"))]
    assert nodes[:3] == ["mc_mgrp_create 2", f"mc_node_create 0 {j.workers[0].port}", "mc_node_associate 2 0"]
    assert sum(c.startswith("mc_node_associate") for c in cmds) == sum(len(x.workers) for x in jobs)
    assert f"register_write InaggEgress.result_psn {j.job * 64 + 1} {w.result_psn}" in cmds


def test_bmv2_commands_reset_registers_the_v1model_program_declares():
    source = (Path(__file__).resolve().parents[2] / "p4" / "v1model" / "inagg.p4").read_text()
    for reg in bmv2.SLOT_REGISTERS:
        control, name = reg.split(".")
        assert control == "InaggIngress" and re.search(rf"register<bit<\d+>>\(INAGG_SLOTS[^;]*\) {name};", source), reg


def test_bfrt_script_is_python_with_every_entry():
    spec, jobs = jobs_and_spec(TNA)
    text = bfrt.script(plan(TNA, spec, jobs))
    compile(text, "bfrt_setup.py", "exec")
    j = jobs[1]
    assert f"ing.workers.add_with_set_worker(hdr_bth_dqpn=0x{j.qpn(0):06x}, job={j.job}, worker=0," in text
    assert len(re.findall(r"egr\.results\.add_with_rewrite\(", text)) == sum(len(x.workers) for x in jobs)
    assert f"egr.result_psn.mod(REGISTER_INDEX={j.job * 32 + 1}, f1={j.workers[1].result_psn})" in text
    assert "bfrt.pre.mgid.add(MGID=3, MULTICAST_NODE_ID=[4, 5]," in text
    assert text.count("ing.lane_0x") == 32


def test_plan_refusals_have_exact_messages():
    spec = SwitchSpec(slots=8, chunk_bytes=256)

    def job(n=2, base=0, slots=4, va=1 << 20, num=1, port=0):
        return JobSpec(job=num, rkey=1, slot_base=base, slots=slots, workers=tuple(
            WorkerSpec(port=port, mac="02:00:00:00:00:01", ip="10.0.0.1", qpn=i, rkey=2, result_va=va)
            for i in range(n)))

    with pytest.raises(ValueError, match="job 1's slot region overlaps job 2's and the P4 programs have no exception path"):
        plan(V1MODEL, spec, [job(), job(num=2, base=0, slots=2)])
    with pytest.raises(ValueError, match="job 1 is given twice"):
        plan(V1MODEL, spec, [job(), job(base=4)])
    with pytest.raises(ValueError, match=r"job 1's slots 8\.\.11 exceed the switch's 8 slots"):
        plan(V1MODEL, spec, [job(base=8)])
    with pytest.raises(ValueError, match="worker port 5 does not exist: the switch has 4 ports"):
        plan(V1MODEL, spec, [job(port=5)])
    with pytest.raises(ValueError, match="job 1 worker 0: result_va 0x100 must be a multiple of the ring size 1024 on tna"):
        plan(TNA, spec, [job(va=0x100)])
    with pytest.raises(ValueError, match="the tna program takes at most 32 workers per job, not 40"):
        plan(TNA, spec, [job(n=40)])
    with pytest.raises(ValueError, match="no exception path"):
        plan(TNA, SwitchSpec(chunk_bytes=256, exception=ExceptionSpec()), [])
    with pytest.raises(TypeError, match="target must be a P4Target, not str"):
        plan("v1model", spec, [])
    p = plan(V1MODEL, spec, [job()])
    with pytest.raises(ValueError, match="bfrt_python scripts are for the tna program, not v1model"):
        bfrt.script(p)
    with pytest.raises(ValueError, match="simple_switch_CLI commands are for the v1model program, not tna"):
        bmv2.commands(plan(TNA, spec, [job()]))
    with pytest.raises(ValueError, match="program must be a Python identifier"):
        bfrt.script(plan(TNA, spec, [job()]), program="in agg")


TNA_SOURCE = (Path(__file__).resolve().parents[2] / "p4" / "tna" / "inagg.p4").read_text()


def _control(name: str) -> str:
    start = TNA_SOURCE.index(f"control {name}(")
    end = TNA_SOURCE.find("\ncontrol ", start + 1)
    return TNA_SOURCE[start:end if end > 0 else None]


def test_bfrt_script_names_what_the_tna_program_declares():
    # No BF Runtime here to load the script: check every table, action, key and parameter it names against the source.
    spec, jobs = jobs_and_spec(TNA)
    text = bfrt.script(plan(TNA, spec, jobs))
    controls = {"ing": _control("InaggIngress"), "egr": _control("InaggEgress")}
    calls = re.findall(r"^(ing|egr)\.(\w+)\.(?:add|set_default)_with_(\w+)\((.*)\)$", text, re.M)
    assert {(c, t, a) for c, t, a, _ in calls} == {("ing", "switch_config", "set_switch"), ("ing", "workers", "set_worker"),
                                                  ("egr", "switch_addr", "set_switch"), ("egr", "results", "rewrite")}
    for block, table, action, args in calls:
        src = controls[block]
        m = re.search(rf"table {table} \{{(.*?)\n    \}}", src, re.S)
        assert m, f"no table {table} in the {block} control"
        body = m.group(1)
        assert re.search(rf"\b{action}\b", body), f"{table} has no action {action}"
        params = re.search(rf"action {action}\(([^)]*)\)", src).group(1)
        declared = [p.split()[-1] for p in params.split(",")]
        names = [kv.split("=")[0] for kv in args.split(", ")]
        keys = re.search(r"key = \{(.*?)\}", body)
        key_fields = [k.split(":")[0].strip().replace(".", "_") for k in keys.group(1).split(";") if k.strip()] if keys else []
        assert names == key_fields + declared, f"{block}.{table}.{action}"
    for reg in [*bfrt.SLOT_REGISTERS, "InaggEgress.result_psn"]:
        control, name = reg.split(".")
        assert re.search(rf"Register<[^;]*> *\([^;]*\) {name};", _control(control)), reg
    assert "Register<bit<32>, bit<32>>(2 * INAGG_SLOTS) lane_##i;" in TNA_SOURCE  # ing.lane_0x00 .. lane_0x1f
