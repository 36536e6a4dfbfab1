"""The lossy link: rates, seeds, and what each fault does to a frame."""

import pytest

from inagg.host.link import Faults, LossyLink

FRAME = bytes(range(100))


def run(faults, n=20000, seed=1):
    link = LossyLink(faults, seed)
    out = [link.transmit(FRAME) for _ in range(n)]
    return link, out


def test_clean_link_passes_frames_untouched():
    link, out = run(Faults(), n=10)
    assert out == [[(0.0, FRAME)]] * 10 and not link.stats


def test_rates_are_met_and_seeded():
    f = Faults(loss=0.1, dup=0.05, reorder=0.2, corrupt=0.01, reorder_delay=1e-3)
    link, out = run(f)
    n = 20000
    assert abs(link.stats["lost"] / n - 0.1) < 0.01
    assert abs(link.stats["duplicated"] / n - 0.05 * 0.9) < 0.01
    assert abs(link.stats["reordered"] / n - 0.2 * 0.9) < 0.015
    assert sum(len(o) for o in out) == n - link.stats["lost"] + link.stats["duplicated"]
    assert {d for o in out for d, _ in o} == {0.0, 1e-3}
    assert run(f)[1] == out and run(f, seed=2)[1] != out


def test_corruption_flips_exactly_one_bit():
    _, out = run(Faults(corrupt=0.5), n=200)
    flipped = [g for o in out for _, g in o if g != FRAME]
    assert flipped
    for g in flipped:
        assert sum(bin(a ^ b).count("1") for a, b in zip(g, FRAME)) == 1


@pytest.mark.parametrize("kw, match", [
    (dict(loss=1.0), r"loss rate must be a number in \[0, 1\), not 1.0"),
    (dict(dup=-0.1), r"dup rate must be a number in \[0, 1\), not -0.1"),
    (dict(reorder_delay=0), "reorder_delay must be a positive number, not 0"),
])
def test_faults_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        Faults(**kw)


def test_held_frames_leave_when_due_in_due_order():
    from inagg.host.link import HeldFrames

    held = HeldFrames()
    assert held.wait(0.5) == 0.5 and list(held.due()) == []
    held.hold(0.2, 1, 3, b"late")
    held.hold(0.0, 0, 1, b"first")
    held.hold(0.0, 0, 2, b"second")
    assert len(held) == 3 and held.wait(0.5) == 0.0
    assert list(held.due()) == [(0, 1, b"first"), (0, 2, b"second")]
    assert 0.0 < held.wait(0.5) <= 0.2 and list(held.due()) == []
    assert list(held.due(now=float("inf"))) == [(1, 3, b"late")] and len(held) == 0


def test_held_frames_cross_delivers_now_or_holds():
    from inagg.host.link import Faults, HeldFrames, LossyLink

    got = []

    def arrive(*frame):
        got.append(frame)

    held = HeldFrames()
    held.cross(LossyLink(), 0, 2, b"clean", arrive)
    assert got == [(0, 2, b"clean")] and len(held) == 0
    # Every frame reordered and duplicated: both copies are held, none arrives before its delay.
    link = LossyLink(Faults(reorder=0.999999, dup=0.999999, reorder_delay=10.0), seed=1)
    held.cross(link, 1, 3, b"late", arrive)
    assert got == [(0, 2, b"clean")] and len(held) == 2
    assert list(held.due(now=float("inf"))) == [(1, 3, b"late"), (1, 3, b"late")]
    held.cross(LossyLink(Faults(loss=0.999999), seed=1), 0, 1, b"lost", arrive)
    assert len(got) == 1 and len(held) == 0
