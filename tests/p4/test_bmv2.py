"""p4/v1model on BMv2 simple_switch, where it and p4c-bm2-ss are installed (p4/tests/run_bmv2.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("inagg_p4_run_bmv2", ROOT / "p4" / "tests" / "run_bmv2.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


RUNNER = _runner()
MISSING = [name for name, cmd in RUNNER.tools().items() if cmd is None]
needs_tools = pytest.mark.skipif(bool(MISSING), reason=f"not found: {', '.join(MISSING)} (see p4/tests/run_bmv2.py)")


@needs_tools
@pytest.mark.parametrize("chunk_bytes", [1024, 256])
def test_simple_switch_answers_every_vector_as_the_model_does(chunk_bytes, tmp_path):
    # 1024: the stored vectors; 256: the same scenario on the 64-lane build.
    folder = RUNNER.VECTORS if chunk_bytes == 1024 else RUNNER.generated_vectors(chunk_bytes, tmp_path)
    report = RUNNER.run_vectors(folder)
    assert report.ok, "\n".join(report.mismatches)


@needs_tools
@pytest.mark.skipif(os.geteuid() != 0, reason="the namespace topology needs root")
def test_workers_allreduce_through_simple_switch():
    r = RUNNER.run_allreduce(workers=3, size=16 << 10, chunk_bytes=256)
    assert r.exact
    assert r.counters["COMPLETED"] == 6 + (16 << 10) // 256  # the agreement round's chunks, then the data's
    assert r.counters["RX_CONTRIB"] == 3 * r.counters["COMPLETED"]


@pytest.mark.skipif("p4c-bm2-ss" in MISSING, reason="p4c-bm2-ss not found (see p4/tests/run_bmv2.py)")
def test_teardown_wipes_every_register_the_compiled_program_declares(tmp_path):
    # A register of the program is wiped per slot by bmv2.Switch.remove or is a per-worker one; none is global.
    import json

    from inagg.host.p4ctl import bmv2
    from inagg.models.job import SwitchSpec

    spec = SwitchSpec(slots=16, chunk_bytes=256)
    RUNNER._compile(RUNNER.tools()["p4c-bm2-ss"], spec, tmp_path / "inagg.json")
    declared = {r["name"]: r["size"] for r in json.loads((tmp_path / "inagg.json").read_text())["register_arrays"]}
    assert {r: n * spec.slots for r, n in bmv2.slot_registers(spec).items()} == {
        r: n for r, n in declared.items() if r not in bmv2.WORKER_REGISTERS}
    assert {r: declared[r] for r in bmv2.WORKER_REGISTERS} == {"InaggEgress.result_psn": 1024 * 64}


@needs_tools
@pytest.mark.skipif(os.geteuid() != 0, reason="the namespace topology needs root")
@pytest.mark.parametrize("number", [None, 3], ids=["same job number", "new job number"])
def test_a_job_torn_down_beside_another_starts_its_next_incarnation_on_wiped_slots(number):
    report = RUNNER.run_incarnation(chunk_bytes=256, number=number)
    assert report.ok, "\n".join(report.mismatches)
    assert (report.frames_in, report.frames_out) == (30, 24)
