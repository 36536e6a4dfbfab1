"""Switch state per job per mode (``models/state.py`` ``job_state``) against ``docs/protocol.md`` section 9."""

from __future__ import annotations

import math

import pytest

from inagg.models import rc, state, terminated
from inagg.models.job import Mode
from inagg.models.state import STATE_OF, job_state, window_for


@pytest.mark.parametrize("workers,window,chunk", [(1, 1, 256), (8, 16, 1024), (32, 128, 1024), (64, 4, 4096)])
def test_uc_state_is_section_9s_formula(workers, window, chunk):
    s = job_state(Mode.UC, workers=workers, window=window, chunk_bytes=chunk)
    # Section 9: 2W slots of C bytes; per slot a 42-bit key, an n-bit bitmap, a 7-bit count, a 2-bit state,
    # the first-generation bit and C/4 promotion bits; per worker a 24-bit result PSN.
    slot_bits = 42 + workers + 7 + 2 + 1 + chunk // 4
    assert (s.slots, s.lane_bytes, s.slot_bits, s.child_bits, s.job_bits) == (
        2 * window, 2 * window * chunk, slot_bits, 24, 0)
    assert s.total_bytes == 2 * window * chunk + math.ceil((2 * window * slot_bits + 24 * workers) / 8)


def test_epic_operating_point_is_twice_the_bdp():
    # 100 Gb/s over 10 us: a BDP of 125,000 B, W = ceil(122.07) = 123 chunks of 1 KiB, 128 as a power of two.
    w = window_for(100e9, 10e-6, 1024)
    assert w == 128
    assert set(STATE_OF) == set(Mode)
    for mode in STATE_OF:
        s = job_state(mode, workers=32, window=w)
        assert s.lane_bytes == 2 * 128 * 1024  # EPIC's "about 250 KB": 2 x 125,000 B before the rounding
        assert s.total_bytes < 1.06 * s.lane_bytes


def test_modes_differ_in_per_child_and_per_job_state():
    ii = job_state(Mode.TRANSLATED, workers=8, window=4)
    iii = job_state(Mode.AUGMENTED, workers=8, window=4)
    # Mode II: an expected PSN per child (section 6.2). Mode III adds per child the oldest result it has not
    # ACKed, a NAK-sent flag and an ACK timer; once, the next result's PSN and the uplink's three PSNs (oldest
    # partial not ACKed, next partial, next result expected), NAK-sent flag and timer (section 7).
    assert (ii.child_bits, ii.job_bits) == (24, 0)
    assert (iii.child_bits, iii.job_bits) == (24 + 24 + 1 + 32, 4 * 24 + 1 + 32)
    assert ii.slot_bits == iii.slot_bits


def test_a_field_without_a_width_fails(monkeypatch):
    widths = state._widths

    def without_expected(n):
        slot, job = widths(n)
        del job["expected"]
        return slot, job

    monkeypatch.setattr(state, "_widths", without_expected)
    with pytest.raises(KeyError, match="TranslatedJob.expected"):
        job_state(Mode.TRANSLATED, workers=2, window=1)


def test_mode_i_state_at_epics_point_is_section_9s_list():
    w = window_for(100e9, 10e-6, 1024)
    s = job_state(Mode.TERMINATED, workers=32, window=w, chunk_bytes=1024)
    # inagg gives a Mode I job R = 2W slots like the others (section 9), each a chunk's lanes.
    assert (s.slots, s.lane_bytes) == (2 * w, 2 * w * 1024)
    # Per slot: a 32-bit chunk, a bitmap of 32 hosts, a 7-bit count, a done flag, C/4 promotion bits.
    assert s.slot_bits == 32 + 32 + 7 + 1 + 1024 // 4
    # Per host QP, the responder: expected PSN and MSN, "NAK sent", the next VA (every packet is ACKed,
    # so no coalescing count); the requester: next and oldest unACKed PSN, results completed, 3 bits of
    # retries left, its timer, the NAK Go-Back-N flag, 3 bits of RNR retries left, the RNR-wait flag. About
    # 30 bytes per QP, under 1 KB at 32 hosts.
    responder, requester = 24 + 24 + 1 + 64, 24 + 24 + 32 + 3 + 32 + 1 + 3 + 1
    assert s.child_bits == responder + requester
    assert math.ceil(s.child_bits / 8) == 30 and s.workers * s.child_bits < 8 * 1024
    # Once: the ring of R = 256 slot indices of 8 bits and its fill count 0..256, and the ACKed count.
    assert s.job_bits == 256 * 8 + 9 + 32


@pytest.mark.parametrize("cls", [terminated.TerminatedJob, rc.Requester, rc.Responder])
def test_a_new_mode_i_field_without_a_width_fails(monkeypatch, cls):
    init = cls.__init__

    def with_a_new_field(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.gained = 0

    monkeypatch.setattr(cls, "__init__", with_a_new_field)
    with pytest.raises(KeyError, match=f"{cls.__name__}.gained: no width"):
        job_state(Mode.TERMINATED, workers=2, window=1)
