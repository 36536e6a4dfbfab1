"""The register map description: addresses, the writes of a job, its checks, and docs/rtl.md in step."""

from pathlib import Path

import pytest

import dataclasses

from inagg.models import regmap as rm
from inagg.models.geometry import MAX_PORTS, SwitchGeometry
from inagg.models.job import Collective, ExceptionSpec, JobSpec, Mode, SwitchSpec, Uplink, WorkerSpec
from inagg.models.protocol import Counter

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rtl.md"


def _job(job=1, workers=2, port=0, slot_base=4, slots=4, mode=Mode.UC):
    ws = tuple(WorkerSpec(port=port, mac=f"02:00:00:00:00:{w + 1:02x}", ip=f"10.0.0.{w + 1}", qpn=0x100 + w,
                          rkey=0xAB00 + w, result_va=0x1_0000_0000 * (w + 1) + 0x40, result_psn=7 + w)
               for w in range(workers))
    return JobSpec(job=job, rkey=0xC0DE, slot_base=slot_base, slots=slots, workers=ws, mode=mode)


def test_addresses():
    m = rm.RegMap(jobs=4, workers=8)
    assert m.counter(Counter.RX_FRAMES) == 0x100
    assert m.counter(Counter.EXC_REFUSED) == 0x100 + 4 * 19
    assert m.job(3, "SLOTS") == 0x1000 + 3 * 0x20 + 0xC
    assert m.worker(1, 2, "PSN") == 0x8000 + (8 + 2) * 0x40 + 0x20
    assert m.addr_width == 16
    offsets = [r.offset for r in rm.SWITCH_REGISTERS.values()]
    assert len(set(offsets)) == len(offsets) and max(offsets) < rm.COUNTER_BASE
    assert rm.COUNTER_BASE + 4 * len(Counter) <= rm.JOB_BASE


def test_mac_counters_have_a_block_per_port():
    """Issue 23: port p's MAC counters at MAC_BASE + MAC_STRIDE p, in MAC_STATS's order, for every port a switch
    may have, between the management bridge's counters and the job registers."""
    assert rm.RegMap.mac_stat(0, "rx_good") == 0x400 and rm.RegMap.mac_stat(1, "tx_long") == 0x420 + 4 * 6
    addrs = [rm.RegMap.mac_stat(p, name) for p in range(MAX_PORTS) for name in rm.MAC_STATS]
    assert len(set(addrs)) == len(addrs) and all(a % 4 == 0 for a in addrs)
    assert rm.MGMT_BASE + 4 * len(rm.MGMT_STATS) <= rm.MAC_BASE and max(addrs) < rm.JOB_BASE
    assert rm.MAC_STRIDE & (rm.MAC_STRIDE - 1) == 0 and 4 * len(rm.MAC_STATS) <= rm.MAC_STRIDE
    assert MAX_PORTS <= rm.MAC_PORTS


@pytest.mark.parametrize("port, name, message", [
    (rm.MAC_PORTS, "rx_good", r"^MAC port must be an integer in 0\.\.95, not 96$"),
    (True, "rx_good", r"^MAC port must be an integer in 0\.\.95, not True$"),
    (0, "rx_bad", r"^MAC counter must be one of rx_good, rx_fcs_errors, rx_runts, rx_long, rx_overflow, tx_frames, "
                  r"tx_long, not 'rx_bad'$"),
])
def test_mac_counter_addresses_are_checked(port, name, message):
    with pytest.raises(ValueError, match=message):
        rm.RegMap.mac_stat(port, name)


def test_job_writes_put_ctrl_last_and_split_fields():
    m = rm.RegMap(jobs=4, workers=8)
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    writes = m.job_writes(_job(), spec)
    assert writes[-1] == (m.job(1, "CTRL"), 1 | 2 << 8)
    w = dict(writes)
    assert w[m.worker(1, 1, "VA_HI")] == 2 and w[m.worker(1, 1, "VA_LO")] == 0x40
    assert w[m.worker(1, 0, "MAC_HI")] == 0x0200 and w[m.worker(1, 0, "MAC_LO")] == 0x00000001
    assert w[m.worker(1, 1, "IP")] == 0x0A000002
    assert w[m.job(1, "SLOT_BASE")] == 4 and w[m.job(1, "SLOTS")] == 4
    assert all(value < 1 << 32 for _, value in writes)
    assert dict(m.switch_writes(spec))[m.switch("IP")] == 0x0A0000FE


@pytest.mark.parametrize("job, message", [
    (_job(job=4), r"^job 4 does not exist: the switch has 4 jobs$"),
    (_job(workers=9), r"^job 1 has 9 workers, the switch at most 8$"),
    (_job(slot_base=16, slots=4), r"^job 1's slots 16\.\.19 exceed the switch's 16 slots$"),
    (_job(port=2), r"^worker port 2 does not exist: the switch has 2 ports$"),
    (_job(mode=Mode.AUGMENTED), r"^job 1 asks for mode AUGMENTED \(III\); this switch implements UC \(uc\), "
                                r"TRANSLATED \(II\)$"),
])
def test_job_writes_refuse_what_the_switch_cannot_hold(job, message):
    with pytest.raises(ValueError, match=message):
        rm.RegMap(jobs=4, workers=8).job_writes(job, SwitchSpec(ports=2, slots=16, chunk_bytes=256))


_UPLINK = Uplink(port=1, mac="02:00:00:00:00:fd", ip="10.0.0.253", qpn=0x20000, rkey=0xD00D, result_qpn=0x20001,
                 result_rkey=0xD00E, result_va=0)
_EXC = SwitchSpec(ports=2, slots=16, chunk_bytes=256, exception=ExceptionSpec(table=4))


@pytest.mark.parametrize("job, installed, message", [
    (dataclasses.replace(_job(), parent=_UPLINK), (),
     r"^job 1 is below the root of a tree \(port 1 faces its parent switch\): the RTL switch sends no partial "
     r"upward; it runs a job alone or at the root$"),
    (dataclasses.replace(_job(), subswitches=frozenset({1})), (),
     r"^job 1 has child switches \(workers 1\): the RTL switch takes no partial with promoted lanes from a child$"),
    (dataclasses.replace(_job(), collective=Collective.REDUCE_SCATTER), (),
     r"^job 1 runs reduce-scatter: the RTL switch runs allreduce only$"),
    (dataclasses.replace(_job(), collective=Collective.BROADCAST, root=0), (),
     r"^job 1 runs broadcast: the RTL switch runs allreduce only$"),
    (_job(mode=Mode.TRANSLATED), (_job(job=0, slot_base=0, slots=8),),
     r"^job 1's slots 4\.\.7 overlap job 0's 0\.\.7 and one of them is a Mode II or III job: the RTL's slot rules "
     r"of those modes take a slot without its job, so such a job shares no slot, exception path or not$"),
    (_job(job=2, slot_base=4, slots=2), (_job(mode=Mode.TRANSLATED),),
     r"^job 2's slots 4\.\.5 overlap job 1's 4\.\.7 and one of them is a Mode II or III job"),
    (_job(job=2, slot_base=4, slots=2), (_job(mode=Mode.AUGMENTED),),
     r"^job 2's slots 4\.\.5 overlap job 1's 4\.\.7 and one of them is a Mode II or III job"),
])
def test_job_writes_refuse_what_the_gateware_does_not_run(job, installed, message):
    """Issue 18: jobs the models run but the RTL does not are refused before any write, naming what and why."""
    with pytest.raises(ValueError, match=message):
        rm.RegMap(jobs=4, workers=8, modes=frozenset(rm.MODE_CODES)).job_writes(job, _EXC, installed)
    if not installed:
        with pytest.raises(ValueError, match=message):
            SwitchGeometry.for_spec(_EXC, width=64).check_job(job)


def test_job_writes_take_what_the_gateware_runs():
    """UC jobs share slots through the exception path; a Mode II job beside them, on slots of its own."""
    m = rm.RegMap(jobs=4, workers=8)
    uc, guest = _job(job=0, slot_base=0, slots=8), _job(job=2, slot_base=0, slots=4)
    ii = _job(mode=Mode.TRANSLATED, slot_base=8, slots=8)
    assert m.job_writes(guest, _EXC, (uc,))[-1] == (m.job(2, "CTRL"), m.ctrl(guest))
    assert m.job_writes(ii, _EXC, (uc, guest))[-1] == (m.job(1, "CTRL"), m.ctrl(ii))
    assert m.job_writes(ii, _EXC, (ii,))  # the job itself, written again
    with pytest.raises(ValueError, match=r"^job 2's slot region overlaps job 0's and this switch has no exception "
                                         r"path$"):
        m.job_writes(guest, SwitchSpec(ports=2, slots=16, chunk_bytes=256), (uc,))


def test_a_jobs_mode_goes_into_its_ctrl_and_modes_name_the_switchs():
    """Issue 18, mode per job: CTRL carries the job's mode (MODE_CODES); MODES names what the switch takes."""
    both = rm.RegMap(jobs=4, workers=8, modes=frozenset({Mode.UC, Mode.TRANSLATED}))
    writes = both.job_writes(_job(mode=Mode.TRANSLATED), SwitchSpec(ports=2, slots=16, chunk_bytes=256))
    assert writes[-1] == (both.job(1, "CTRL"), 1 | 2 << 8 | rm.MODE_CODES[Mode.TRANSLATED] << 16)
    assert rm.JOB_CTRL.decode(writes[-1][1])["mode"] == 2
    assert both.modes_value() == 0b101 and rm.RegMap.decode_modes(0b101) == both.modes
    assert rm.RegMap(4, 8).modes_value() == 0b101 and rm.RegMap(4, 8, modes=frozenset({Mode.UC})).modes_value() == 1
    assert rm.RegMap.decode_modes(0b1010) == {Mode.TERMINATED, Mode.AUGMENTED}
    assert sorted(rm.MODE_CODES.values()) == list(range(len(Mode)))  # one code a mode, each fits the field
    assert rm.JOB_CTRL.field("mode").width == rm.MODES.width.bit_length() - 1 == 2


@pytest.mark.parametrize("jobs, workers, message", [
    (0, 8, r"^jobs must be an integer in 1\.\.1024, not 0$"),
    (4, 65, r"^workers must be an integer in 1\.\.64, not 65$"),
    (1000, 8, r"^1000 jobs do not fit the job register block$"),
])
def test_geometry_is_checked(jobs, workers, message):
    with pytest.raises(ValueError, match=message):
        rm.RegMap(jobs=jobs, workers=workers)


@pytest.mark.parametrize("modes", [frozenset(), {Mode.UC}, frozenset({"uc"})])
def test_modes_are_checked(modes):
    with pytest.raises(ValueError, match=r"^modes must be a non-empty frozenset of Mode, not "):
        rm.RegMap(jobs=4, workers=8, modes=modes)


def test_docs_hold_the_register_map():
    assert rm.RegMap(4, 8).markdown() in DOCS.read_text()


def test_fields_encode_and_decode_at_their_bits():
    assert rm.JOB_CTRL.encode(enable=1, workers=5) == 1 | 5 << 8
    assert rm.JOB_CTRL.decode(0x20701) == {"enable": 1, "workers": 7, "mode": 2}
    assert rm.GEOMETRY.field("log2_slots").bits == "[20:16]" and rm.TEARDOWN.field("busy").bits == "[0]"
    assert rm.TEARDOWN_BUSY == 1 and rm.TEARDOWN_REFUSED == 2
    assert rm.JOB_REGISTERS["SLOTS"].width == 17 and rm.WORKER_REGISTERS["QPN"].encode(value=0xABCDEF) == 0xABCDEF
    assert rm.RegMap.from_jobs(rm.RegMap(jobs=5, workers=7).jobs_value()) == rm.RegMap(5, 7)
    # 65536 slots need the fifth bit of log2 slots.
    assert rm.GEOMETRY.decode(rm.RegMap.geometry(SwitchSpec(ports=3, slots=1 << 16, chunk_bytes=256), 512)) == {
        "ports": 3, "width64": 8, "log2_slots": 16, "log2_chunk": 8}


@pytest.mark.parametrize("call, error, message", [
    (lambda: rm.JOB_CTRL.encode(workers=128), ValueError, r"^workers must be an integer in 0\.\.127, not 128$"),
    (lambda: rm.JOB_CTRL.encode(enable=True), ValueError, r"^enable must be an integer in 0\.\.1, not True$"),
    (lambda: rm.JOB_CTRL.encode(valid=1), ValueError, r"^register CTRL has no field 'valid'; it has enable, workers, mode$"),
    (lambda: rm.Field("x", 30, 4), ValueError, r"^Field x must lie within bits 31:0, not 30\+4$"),
    (lambda: rm.Field("1x", 0, 4), TypeError, r"^Field name must be an identifier, not '1x'$"),
    (lambda: rm.Field("x", 0, 4, "RX"), ValueError, r"^Field access must be one of \('RO', 'WO', 'RW'\), not 'RX'$"),
    (lambda: rm.Register("R", 2, "RW", "", (rm.Field("x", 0, 4),)), ValueError,
     r"^Register R must be word-aligned, not at 0x2$"),
    (lambda: rm.Register("R", 0, "RW", "", (rm.Field("x", 0, 4), rm.Field("y", 3, 2, "RO"))), ValueError,
     r"^Field y of register R overlaps another field$"),
])
def test_declarations_are_checked(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_read_field_and_a_write_field_may_share_bits():
    assert rm.TEARDOWN.encode(job=3) == 3 and rm.TEARDOWN.decode(3)["refused"] == 1


def test_a_switch_geometry_is_checked_against_the_plan():
    """GEOMETRY read off a board: the plan's chunks, every job's slot region and every worker's port must fit."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    job = _job(port=1, slot_base=4, slots=4)
    word = rm.RegMap.geometry(spec, 64)
    rm.RegMap.check_geometry(word, spec, [job])  # fits
    with pytest.raises(ValueError, match=r"built for 2 ports, 16 slots of 256-byte chunks, 64-bit beats; "
                                         r"the plan's chunks are 1024 bytes"):
        rm.RegMap.check_geometry(word, dataclasses.replace(spec, chunk_bytes=1024), [job])
    small = rm.RegMap.geometry(dataclasses.replace(spec, slots=4), 64)
    with pytest.raises(ValueError, match=r"job 1 needs slots 4..7"):
        rm.RegMap.check_geometry(small, spec, [job])
    with pytest.raises(ValueError, match=r"job 1 has a worker on port 2"):
        rm.RegMap.check_geometry(word, spec, [_job(port=2)])
