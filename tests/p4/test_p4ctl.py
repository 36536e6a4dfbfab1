"""The P4 control plane: generated entries against the job description and the model switch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inagg.host.p4ctl import bfrt, bmv2
from inagg.host.p4ctl.layout import PER_JOB, mcast_group_id, plan, psn_index
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
    assert {(e.job, e.worker, e.index, e.psn) for e in p.psns} == {
        (j.job, i, psn_index(target, j.job, i), w.result_psn) for j in jobs for i, w in enumerate(j.workers)}
    assert [(r.job, r.indexes) for r in p.regions] == [(j.job, range(j.slot_base, j.slot_base + j.slots))
                                                      for j in sorted(jobs, key=lambda j: j.job)]


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
    assert "bfrt.pre.mgid.add(MGID=3, MULTICAST_NODE_ID=[65, 66]," in text  # node of (job 2, worker 0): 2 * 32 + 1
    assert [ln for ln in text.splitlines() if ln.endswith(".clear()")] == [f"pipe.{r}.clear()" for r in bfrt.SLOT_REGISTERS]


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
    assert set(_tna_registers()) == set(bfrt.SLOT_REGISTERS) | set(bfrt.WORKER_REGISTERS)


V1MODEL_SOURCE = (Path(__file__).resolve().parents[2] / "p4" / "v1model" / "inagg.p4").read_text()


def _tna_registers() -> dict[str, str]:
    """Every Register of the TNA program by control, with its size expression; INAGG_LANES_32 expands lane_##i."""
    decl = r"Register<[^;]*?>\s*\(([^;]*)\)\s*(\w+);"
    lane = re.search(r"#define INAGG_TNA_LANE_DECL\(i\) \\\n\s*" + decl.replace(r"(\w+)", r"lane_##i"), TNA_SOURCE)
    found = {}
    for control in ("InaggIngress", "InaggEgress"):
        body = _control(control)
        found.update({f"{control}.{n}": size for size, n in re.findall(decl, body)})
        if "INAGG_LANES_32(INAGG_TNA_LANE_DECL)" in body:
            found.update({f"{control}.lane_0x{i:02x}": lane.group(1) for i in range(32)})
    return found


def test_remove_wipes_every_register_of_the_tna_program_per_slot():
    # A register the program gains must be named in bfrt.SLOT_REGISTERS (wiped per slot) or WORKER_REGISTERS.
    regs = _tna_registers()
    assert set(regs) == set(bfrt.SLOT_REGISTERS) | set(bfrt.WORKER_REGISTERS)
    for name, (n, _) in bfrt.SLOT_REGISTERS.items():
        assert regs[name] == ("INAGG_SLOTS" if n == 1 else f"{n} * INAGG_SLOTS"), name
    assert {regs[r] for r in bfrt.WORKER_REGISTERS} == {"PSN_ENTRIES"}
    assert re.search(r"struct slot_key_t \{\s*bit<32> used;\s*bit<32> chunk;\s*\}", TNA_SOURCE)
    assert sorted(bfrt.SLOT_REGISTERS["InaggIngress.slot_key"][1]) == ["chunk", "used"]


def test_remove_wipes_every_register_of_the_v1model_program_per_slot():
    # The same from the source; tests/p4/test_bmv2.py compares with the registers the compiled JSON declares.
    found = {}
    for control in ("InaggIngress", "InaggEgress"):
        start = V1MODEL_SOURCE.index(f"control {control}(")
        body = V1MODEL_SOURCE[start:V1MODEL_SOURCE.find("\ncontrol ", start + 1)]
        found.update({f"{control}.{n}": size for size, n in re.findall(r"register<bit<\d+>>\(([^)]*)\) (\w+);", body)})
    spec = SwitchSpec(slots=16, chunk_bytes=256)
    per_slot = {"INAGG_SLOTS": 1, "INAGG_SLOTS * INAGG_LANES": spec.lanes}
    assert {r: per_slot[s] for r, s in found.items() if s in per_slot} == bmv2.slot_registers(spec)
    assert {r for r, s in found.items() if s not in per_slot} == set(bmv2.WORKER_REGISTERS)
    assert {found[r] for r in bmv2.WORKER_REGISTERS} == {"PSN_ENTRIES"}


def test_plan_fields_are_the_switchs_or_a_jobs():
    # Plan.only finds a job's entries by their job field; bmv2.Switch.remove and bfrt.remove_script undo each of
    # these fields: a new one must be added there too.
    assert PER_JOB == ("workers", "results", "groups", "psns", "regions")
    spec, jobs = jobs_and_spec(V1MODEL)
    p = plan(V1MODEL, spec, jobs)
    for f in PER_JOB:
        assert {e.job for e in getattr(p.only(1), f)} == {1} and {e.job for e in getattr(p.without(1), f)} == {2}, f
    with pytest.raises(ValueError, match="job 7 is not in the plan"):
        p.only(7)


def _answer(cmds: list[str], version: int) -> str:
    """What simple_switch_CLI prints for ``cmds``: entry handles carry a version above bit 24, as BMv2's do."""
    out, entries, nodes = [], {}, 0
    for c in cmds:
        if c.startswith("table_add "):
            table = c.split()[1]
            n = entries.setdefault(table, 0)
            entries[table] += 1
            out.append(f"Adding entry to exact match table {table}\nEntry has been added with handle {version << 24 | n}")
        elif c.startswith("mc_node_create "):
            out.append(f"Creating node with rid {c.split()[1]}\nnode was created with handle {nodes}")
            nodes += 1
    return "\n".join(out) + "\n"


def _new_incarnation(job: JobSpec) -> JobSpec:
    import dataclasses

    return dataclasses.replace(job, rkey=job.rkey ^ 0x5A5A, workers=tuple(
        dataclasses.replace(w, rkey=w.rkey + 0x100, result_psn=0x77, contrib_rkey=0xD1000000 + i)
        for i, w in enumerate(job.workers)))


def test_bmv2_switch_removes_one_job_and_adds_its_next_incarnation():
    spec, jobs = jobs_and_spec(V1MODEL)
    a, b = jobs
    sw = bmv2.Switch(plan(V1MODEL, spec, jobs))
    cmds = sw.configure()
    assert cmds == bmv2.commands(plan(V1MODEL, spec, jobs))
    sw.answered(cmds, _answer(cmds, version=3))
    out = sw.remove(a.job)
    part = plan(V1MODEL, spec, jobs).only(a.job)
    # The handles the switch answered, not the order of creation: entries of job 1 came first in each table.
    assert [c for c in out if c.startswith("table_delete")] == (
        [f"table_delete InaggIngress.workers {3 << 24 | i}" for i in range(len(a.workers))]
        + [f"table_delete InaggEgress.results {3 << 24 | i}" for i in range(len(a.workers))])
    assert [c for c in out if c.startswith("mc_")] == [
        x for i in range(len(a.workers)) for x in (f"mc_node_dissociate 2 {i}", f"mc_node_destroy {i}")] + [
        "mc_mgrp_destroy 2"]
    writes = {(c.split()[1], int(c.split()[2])) for c in out if c.startswith("register_write")}
    assert all(c.split()[3] == "0" for c in out if c.startswith("register_write"))
    expected = {(r, i) for r, n in bmv2.slot_registers(spec).items()
                for i in range(a.slot_base * n, (a.slot_base + a.slots) * n)}
    assert writes == expected | {("InaggEgress.result_psn", e.index) for e in part.psns}
    assert len(out) == len(set(out))
    assert sw.plan == plan(V1MODEL, spec, [b])
    with pytest.raises(ValueError, match="job 1 is not in the plan"):
        sw.remove(a.job)
    # The next incarnation: the same job number and region, new R_Keys; its nodes take the freed handles.
    a2 = _new_incarnation(a)
    p2 = plan(V1MODEL, spec, [b, a2])
    with pytest.raises(ValueError, match="the plan must hold the switch's jobs and job 1, nothing else changed"):
        sw.add(plan(V1MODEL, spec, [a2]), a.job)
    add = sw.add(p2, a.job)
    assert add == bmv2.commands(p2.only(a.job))[len(bmv2.SLOT_REGISTERS) + 1:]
    assert f"0x{a2.qpn(1):06x} => {a.job} 1 0x{a2.contrib_rkey(1):08x} " in "\n".join(add)
    assert not any(f"=> {b.job} " in c or c.startswith(f"table_add InaggEgress.results InaggEgress.rewrite {b.job} ")
                   for c in add)
    with pytest.raises(ValueError, match="job 1 is on the switch already: remove it first"):
        sw.add(p2, a.job)
    with pytest.raises(RuntimeError, match="node handle 5 where 'mc_node_associate 2 0' expected 0"):
        sw.answered(add, _answer(add, 4).replace("node was created with handle 0", "node was created with handle 5"))
    sw.answered(add, _answer(add, 4))
    assert f"table_delete InaggIngress.workers {4 << 24 | 0}" in sw.remove(a.job)
    with pytest.raises(RuntimeError, match="gave 0 entry handles for 4 table_add"):
        bmv2.Switch(p2).answered(bmv2.commands(p2.only(b.job)), "")


class _Recorder:
    """Stands in for bfrt_python: records each call as (dotted path, keyword arguments)."""

    def __init__(self, calls, path=""):
        self._calls, self._path = calls, path

    def __getattr__(self, name):
        return _Recorder(self._calls, f"{self._path}.{name}".lstrip("."))

    def __call__(self, **kw):
        self._calls.append((self._path, kw))


def _run_bfrt(text: str) -> list[tuple[str, dict]]:
    calls: list = []
    exec(compile(text, "bfrt_script.py", "exec"), {"bfrt": _Recorder(calls)})
    return calls


def test_bfrt_remove_script_undoes_what_the_script_wrote_for_the_job():
    spec, jobs = jobs_and_spec(TNA)
    a, b = jobs
    p = plan(TNA, spec, jobs)
    added = _run_bfrt(bfrt.script(p))
    removed = _run_bfrt(bfrt.remove_script(p, a.job))
    prefix = "inagg.pipe.InaggIngress."
    # Every entry the full script added for job 1 is deleted by its key, and nothing of job 2.
    assert [kw for path, kw in removed if path == prefix + "workers.delete"] == [
        {"hdr_bth_dqpn": kw["hdr_bth_dqpn"]} for path, kw in added
        if path == prefix + "workers.add_with_set_worker" and kw["job"] == a.job]
    assert [kw for path, kw in removed if path == "inagg.pipe.InaggEgress.results.delete"] == [
        {"hdr_bridge_job": a.job, "hdr_bridge_worker": i} for i in range(len(a.workers))]
    nodes = [kw["MULTICAST_NODE_ID"] for path, kw in added if path == "pre.node.add"][:len(a.workers)]
    assert [(path, kw) for path, kw in removed if path.startswith("pre.")] == [("pre.mgid.delete", {"MGID": 2})] + [
        ("pre.node.delete", {"MULTICAST_NODE_ID": n}) for n in nodes]
    mods = {(path.removeprefix("inagg.pipe.").removesuffix(".mod"), kw["REGISTER_INDEX"]): kw for path, kw in removed
            if path.endswith(".mod")}
    expected = {(r, i) for r, (n, _) in bfrt.SLOT_REGISTERS.items()
                for i in range(a.slot_base * n, (a.slot_base + a.slots) * n)}
    assert set(mods) == expected | {("InaggEgress.result_psn", psn_index(TNA, a.job, i)) for i in range(len(a.workers))}
    assert all(set(v for k, v in kw.items() if k != "REGISTER_INDEX") == {0} for kw in mods.values())
    assert set(mods[("InaggIngress.slot_key", a.slot_base)]) == {"REGISTER_INDEX", "chunk", "used"}
    assert removed[-1] == ("complete_operations", {})
    # The next incarnation: what the full script writes for the job, alone.
    a2 = _new_incarnation(a)
    p2 = plan(TNA, spec, [b, a2])
    again = _run_bfrt(bfrt.add_script(p2, a.job))
    whole = _run_bfrt(bfrt.script(p2))
    assert again[:-1] == [c for c in whole if c[1].get("job", c[1].get("hdr_bridge_job")) == a.job
                          or c[0] == "inagg.pipe.InaggEgress.result_psn.mod" and c[1]["REGISTER_INDEX"] // 32 == a.job
                          or c[0] == "pre.node.add" and c[1]["MULTICAST_NODE_ID"] // 32 == a.job
                          or c[0] == "pre.mgid.add" and c[1]["MGID"] == 2]
    assert [kw["rkey"] for path, kw in again if path == prefix + "workers.add_with_set_worker"] == [
        a2.contrib_rkey(i) for i in range(len(a.workers))]
