"""The switch service on the Verilated RTL switch (``inagg switch serve --backend rtl``).

One Verilator build (3 ports, 64-bit beats, 32 slots of 256 bytes, 4 jobs), cached in sim_build/ and shared by
both tests; each test starts one simulator.
"""

import os
import re
import signal
import time

import numpy as np
import pytest

from inagg.host import allreduce
from inagg.host.roce import contribution
from inagg.host.service import ServiceError, SwitchClient, SwitchService, join
from inagg.host.worker import Timing
from inagg.models.job import SwitchSpec

pytestmark = pytest.mark.cocotb

PORTS, WIDTH, SLOTS, CHUNK, JOBS = 3, 64, 32, 256, 4
SERVE = ["switch", "serve", "--backend", "rtl", "--ports", str(PORTS), "--width", str(WIDTH), "--slots", str(SLOTS),
         "--chunk-bytes", str(CHUNK), "--jobs", str(JOBS)]
# The simulated switch takes about a millisecond of wall-clock time per contribution at W = 64.
TIMING = dict(timeout=0.5, max_timeout=2.0, tries=10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_client_processes_two_jobs_and_a_wrong_token_on_the_rtl(two_clients):
    """`inagg switch serve --backend rtl` as a process: job A's owner, and a second client that tries to touch job A."""
    sim = []
    run = two_clients(SERVE, timing=TIMING, absent_worker=2, start_wait=600,  # a changed geometry is built first
                      answer_wait=60, count_wait=20, on_listening=lambda text: sim.append(
                          int(re.search(r"RTL switch running: simulator pid (\d+)", text).group(1))))
    assert not _alive(sim[0]), "the simulator outlived the service"
    assert "retired" not in run.log  # the removed jobs' slots were torn down, not retired
    # The summary's counters are read from the RTL's registers as the service stops.
    assert re.search(r"inagg.switch INFO stopped: .*'refused_requests': 3.*switch counters: RX_FRAMES \d+", run.log), \
        run.log
    assert re.search(r"inagg.switch INFO stopped: .*'foreign_qpn': 2", run.log), run.log


def test_reused_regions_oversize_frames_and_a_crashed_simulator():
    """In one process: a removed job's slots serve the next job, too long a frame is counted, a killed simulator is
    reported."""
    from inagg.testbench.bridge.realtime import RtlSwitch

    spec = SwitchSpec(ports=PORTS, slots=SLOTS, chunk_bytes=CHUNK)
    rtl = RtlSwitch(spec, width=WIDTH, jobs=JOBS)
    service = SwitchService(spec, vxlan=("127.0.0.1", 0), switch=rtl).start()
    try:
        with SwitchClient(service.control_address) as client:
            timing = Timing(**TIMING)
            first = client.create_job(1, window=8)
            assert (first.job.slot_base, first.job.slots) == (0, 16)
            g = join(first, 0, timing=timing)
            x = np.arange(300, dtype=np.float32)
            assert np.array_equal(allreduce(x, g), x)
            client.remove_job(first.job.job, first.token)
            second = client.create_job(1, window=8)  # the same job number and region, torn down in the RTL
            assert (second.job.job, second.job.slot_base) == (first.job.job, 0)
            g2 = join(second, 0, timing=timing)
            assert np.array_equal(allreduce(2 * x, g2), 2 * x)
            # Longer than the RTL takes, with the rank's own QPN so that the service hands it on.
            f = bytes(contribution(second.switch, g2.job, 0, 0, bytes(CHUNK)))
            g2.port.send(f + bytes(rtl.geometry.frame_bytes + 1 - len(f)))
            deadline = time.monotonic() + 10
            while (c := client.counters(second.job.job, second.token))["backend"] != {"oversize": 1}:
                assert time.monotonic() < deadline, c
                time.sleep(0.05)

            os.kill(rtl.pid, signal.SIGKILL)
            reason = f"the switch failed: the RTL simulator \\(pid {rtl.pid}\\) exited: killed by SIGKILL"
            deadline = time.monotonic() + 10
            while True:  # the service notices at its next look at the simulator's socket
                try:
                    client.counters(second.job.job, second.token)
                except ServiceError as e:
                    assert re.fullmatch(f"inagg switch service refused counters: {reason}", str(e))
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
            with pytest.raises(ServiceError, match=f"^inagg switch service refused create_job: {reason}$"):
                client.create_job(1)
            g2.port.send(f)
            deadline = time.monotonic() + 10
            while service.stats["switch_failed"] < 1:  # dropped and counted
                assert time.monotonic() < deadline
                time.sleep(0.05)
            g.port.close()
            g2.port.close()
    finally:
        service.stop()
    assert service.failure is not None and not _alive(rtl.pid)
