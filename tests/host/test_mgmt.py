"""The host's management session and bus against the model bridge: round trips, losses, restarts, refusals."""

import pytest

from inagg.host.controller import Controller, mac_counters, management_target, plan, register_writes
from inagg.host.mgmt import MgmtBus, MgmtError, MgmtSession, MgmtTimeout
from inagg.models import regmap as rm
from inagg.models.mgmt import MgmtBridge, Op, Status

KEY = bytes(range(16, 32))
BOARD, HOST = "02:00:00:00:00:fe", "02:00:00:00:01:09"
REGMAP = rm.RegMap(4, 8)


class Registers:
    """Every register of the map holds what was written last; TEARDOWN reads idle; ID is read-only."""

    def __init__(self):
        self.values, self.writes = {}, []

    def read(self, addr):
        return 0 if addr == REGMAP.switch("TEARDOWN") else self.values.get(addr, 0)

    def write(self, addr, value):
        if addr == REGMAP.switch("ID"):
            return False
        self.values[addr] = value
        self.writes.append((addr, value))
        return True


class Link:
    """The host's wire to a model board; ``lose`` names the frames lost (request i is frame 2 i, its answer 2 i + 1)."""

    def __init__(self, bridge, lose=()):
        self.bridge, self.lose, self.count, self.inbox, self.now = bridge, set(lose), 0, [], 0.0

    def _lost(self):
        self.count += 1
        return self.count - 1 in self.lose

    def send(self, frame):
        if self._lost():
            return
        answer, _ = self.bridge.receive(frame)
        if answer is not None and not self._lost():
            self.inbox.append(answer)

    def recv(self, timeout):
        if self.inbox:
            return self.inbox.pop(0)
        self.now += timeout
        return None


def board(key=KEY):
    regs = Registers()
    return MgmtBridge(key, regs.read, regs.write, REGMAP.addr_width), regs


def bus(link, **kw):
    return MgmtBus(MgmtSession(KEY, board=BOARD, host=HOST, **kw), link.send, link.recv, clock=lambda: link.now)


def test_controller_configures_a_board_over_management_frames():
    bridge, regs = board()
    p = plan([3, 2])
    with Controller(management_target(bus(Link(bridge)), REGMAP, p.switch), p):
        assert regs.writes == register_writes(p, REGMAP)
    assert regs.writes[-1] == (REGMAP.switch("TEARDOWN"), p.jobs[0].job)
    assert bridge.counters["accepted"] == bridge.floor and bridge.counters["replayed"] == 0


def test_read_round_trip():
    bridge, regs = board()
    b = bus(Link(bridge))
    b.write(REGMAP.switch("IP"), 0x0A00_00FE)
    assert b.read(REGMAP.switch("IP")) == 0x0A00_00FE
    assert b.read(REGMAP.mgmt_stat("accepted")) == 3


def test_mac_counters_of_a_port_by_name():
    bridge, regs = board()
    for k, name in enumerate(rm.MAC_STATS):
        regs.values[REGMAP.mac_stat(1, name)] = 100 + k
    assert mac_counters(bus(Link(bridge)), 1) == {name: 100 + k for k, name in enumerate(rm.MAC_STATS)}


def test_lost_request_is_sent_again():
    bridge, regs = board()
    b = bus(Link(bridge, lose={0}))
    b.write(REGMAP.switch("IP"), 7)
    assert regs.values[REGMAP.switch("IP")] == 7 and bridge.counters["accepted"] == 1


def test_lost_answer_to_a_write_completes_on_the_replayed_copy():
    bridge, regs = board()
    b = bus(Link(bridge, lose={1}))
    b.write(REGMAP.switch("IP"), 7)
    assert regs.writes == [(REGMAP.switch("IP"), 7)]  # written once
    assert bridge.counters["replayed"] == 1 and b.session.seq == 2


def test_lost_answer_to_a_read_asks_again():
    bridge, regs = board()
    regs.values[REGMAP.switch("IP")] = 9
    b = bus(Link(bridge, lose={1}))
    assert b.read(REGMAP.switch("IP")) == 9
    assert bridge.counters == {**bridge.counters, "accepted": 2, "replayed": 1}


def test_restarted_host_continues_above_the_floor():
    bridge, _ = board()
    link = Link(bridge)
    bus(link, seq=100).write(REGMAP.switch("IP"), 1)
    b = bus(link)  # a new run, starting at 1 again
    b.write(REGMAP.switch("IP"), 2)
    assert bridge.floor == 101 and b.session.seq == 102 and bridge.counters["replayed"] == 1


def test_wrong_key_times_out():
    bridge, regs = board(key=bytes(16))
    b = bus(Link(bridge), tries=3)
    with pytest.raises(MgmtTimeout, match="no answer .* after 3 tries"):
        b.write(REGMAP.switch("IP"), 1)
    assert bridge.counters["bad_tag"] == 3 and regs.writes == []
    assert not b.session.pending


def test_every_frame_lost_times_out():
    bridge, _ = board()
    b = bus(Link(bridge, lose=set(range(100))), tries=2, timeout=0.5)
    with pytest.raises(MgmtTimeout):
        b.read(0)
    assert b._recv.__self__.now == pytest.approx(1.0)


def test_refused_access_raises():
    bridge, _ = board()
    with pytest.raises(MgmtError, match="refused the WRITE of 0x0000: SLVERR"):
        bus(Link(bridge)).write(REGMAP.switch("ID"), 1)


def test_session_ignores_other_frames_and_late_answers():
    bridge, _ = board()
    s = MgmtSession(KEY, board=BOARD, host=HOST)
    s.request(Op.READ, 0, now=0.0)
    first, = s.data_to_send()
    s.poll(1.0)
    again, = s.data_to_send()
    assert first == again
    answer, _ = bridge.receive(first)
    assert s.receive(bytes(60), 1.0) is None
    r = s.receive(answer, 1.0)
    assert r.status == Status.OK and not s.pending
    assert s.receive(bridge.receive(again)[0], 1.0) is None  # the copy's answer comes late
    with pytest.raises(MgmtError, match="still waiting"):
        s.request(Op.READ, 0, now=2.0)
        s.request(Op.READ, 0, now=2.0)


def test_session_checks_its_parameters():
    with pytest.raises(ValueError, match="tries"):
        MgmtSession(KEY, board=BOARD, host=HOST, tries=0)
    with pytest.raises(ValueError, match="management key"):
        MgmtSession(bytes(3), board=BOARD, host=HOST)
