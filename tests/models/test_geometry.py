"""The switch geometry: one validation with exact messages, the registers it reports, the job rules."""

import pytest

from inagg.models import regmap as rm
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import ExceptionSpec, JobSpec, SwitchSpec, WorkerSpec

BASE = dict(ports=2, width=64, slots=16, chunk_bytes=256)


def _job(job=1, workers=2, port=0, slot_base=4, slots=4):
    ws = tuple(WorkerSpec(port=port, mac="02:00:00:00:00:01", ip="10.0.0.1", qpn=0x100 + w, rkey=1, result_va=0)
               for w in range(workers))
    return JobSpec(job=job, rkey=2, slot_base=slot_base, slots=slots, workers=ws)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(ports=65), ValueError, r"^Port count must be an integer in 1\.\.64, not 65$"),
    (dict(ports=True), ValueError, r"^Port count must be an integer in 1\.\.64, not True$"),
    (dict(width=128), ValueError, r"^Data width must be one of \(64, 256, 512\), not 128$"),
    (dict(slots=1 << 17), ValueError, r"^Slot count must be a power of two from 2 to 65536, not 131072$"),
    (dict(chunk_bytes=300), ValueError, r"^Chunk size must be one of \(256, 512, 1024, 2048, 4096\), not 300$"),
    (dict(jobs=65), ValueError, r"^Job count must be an integer in 1\.\.64, not 65$"),
    (dict(workers=0), ValueError, r"^Workers per job must be an integer in 1\.\.64, not 0$"),
    (dict(exception=4), TypeError, r"^Exception path must be an ExceptionSpec or None, not 4$"),
    (dict(exception=ExceptionSpec(4, max_kicks=2000)), ValueError,
     r"^Exception kick-out bound must be an integer from 0 to 1024, not 2000$"),
    (dict(exception=ExceptionSpec(4, stash=65)), ValueError,
     r"^Exception stash must be an integer from 0 to 64, not 65$"),
    (dict(exception=ExceptionSpec(32768)), ValueError, r"^65540 overflow slots exceed the slot engine's 65536$"),
])
def test_geometry_is_checked_once(kwargs, error, message):
    with pytest.raises(error, match=message):
        SwitchGeometry(**{**BASE, **kwargs})


def test_flat_keywords_and_a_spec_give_the_same_geometry():
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256, exception=ExceptionSpec(8, 5, 3))
    g = SwitchGeometry.for_spec(spec, width=64, jobs=3, workers=4)
    assert g == SwitchGeometry.from_params(**BASE, jobs=3, workers=4, exc_table=8, exc_max_kicks=5, exc_stash=3)
    assert g.space == 16 + 2 * 8 + 3 and g.port_bits == 1 and g.regmap == rm.RegMap(3, 4)
    assert g.geometry_value == rm.RegMap.geometry(spec, 64)
    assert SwitchGeometry.from_params(**BASE, exc_table=0).exception is None
    with pytest.raises(ValueError, match=r"^Exception table must be 0 \(no exception path\) or a power of two from 2 "
                                         r"to 65536, not 6$"):
        SwitchGeometry.from_params(**BASE, exc_table=6)
    with pytest.raises(TypeError, match=r"^spec must be a SwitchSpec, not dict$"):
        SwitchGeometry.for_spec({}, width=64)


@pytest.mark.parametrize("job, message", [
    (_job(job=4), r"^job 4 does not exist: the switch has 4 jobs$"),
    (_job(workers=9), r"^job 1 has 9 workers, the switch at most 8$"),
    (_job(slot_base=16), r"^job 1's slots 16\.\.19 exceed the switch's 16 slots$"),
    (_job(port=2), r"^worker port 2 does not exist: the switch has 2 ports$"),
])
def test_the_job_rules_are_the_register_maps(job, message):
    with pytest.raises(ValueError, match=message):
        SwitchGeometry(**BASE).check_job(job)
    with pytest.raises(ValueError, match=message):
        rm.RegMap(4, 8).job_writes(job, SwitchSpec(ports=2, slots=16, chunk_bytes=256))


def test_overlapping_regions_need_an_exception_path():
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    with pytest.raises(ValueError, match=r"^job 1's slot region overlaps job 2's and this switch has no exception "
                                         r"path$"):
        spec.check_job(_job(), [_job(job=2, slot_base=0, slots=8)])
    spec.check_job(_job(), [_job(job=1), _job(job=2, slot_base=8)])
    SwitchSpec(ports=2, slots=16, chunk_bytes=256, exception=ExceptionSpec(4)).check_job(_job(), [_job(job=2)])
