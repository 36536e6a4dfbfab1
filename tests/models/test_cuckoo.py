"""The exception path's cuckoo table: hashing, load, overload, and no lost keys."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from inagg.models.cuckoo import CuckooTable, hashes, hashes_np, make_key


def test_hash_definition():
    # h0/h1 are the low and high halves of zlib's CRC-32 over the key's 4 big-endian bytes.
    import zlib
    crc = zlib.crc32(bytes([0x00, 0x40, 0x00, 0x05]))
    assert hashes(make_key(1, 5), 1 << 16) == (crc & 0xFFFF, crc >> 16)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=200), st.sampled_from([2, 64, 4096, 65536]))
def test_vectorized_hash_equals_scalar(keys, size):
    h0, h1 = hashes_np(np.array(keys, np.uint32), size)
    assert [(int(a), int(b)) for a, b in zip(h0, h1)] == [hashes(k, size) for k in keys]


@pytest.mark.parametrize("seed", range(5))
def test_inserts_up_to_documented_load_succeed(seed):
    """Documented load factor: 45% of the two tables with max_kicks=32 and a 4-entry stash."""
    t = CuckooTable(1024, max_kicks=32, stash=4)
    keys = np.random.default_rng(seed).choice(2**32, int(0.45 * 2048), replace=False)
    for i, k in enumerate(keys):
        assert t.insert(int(k), i)
    assert t.stats.refused == 0 and len(t) == len(keys)
    assert all(t.lookup(int(k)) == i for i, k in enumerate(keys))


def test_overload_is_a_counted_refusal_and_loses_nothing():
    t = CuckooTable(16, max_kicks=8, stash=2)
    keys = np.random.default_rng(1).choice(2**32, 200, replace=False)
    placed = {}
    for i, k in enumerate(keys):
        if t.insert(int(k), i):
            placed[int(k)] = i
    assert t.stats.refused == 200 - len(placed) > 0
    assert len(t) == len(placed) <= t.capacity
    assert all(t.lookup(k) == v for k, v in placed.items())
    assert all(t.lookup(int(k)) is None for k in keys if int(k) not in placed)


def test_kick_chain_moves_keys_to_their_other_table():
    size = 8
    # Find three keys that share h0 position: the third must kick.
    keys, seen = [], {}
    for k in range(10000):
        h0, _ = hashes(k, size)
        seen.setdefault(h0, []).append(k)
        if len(seen[h0]) == 3:
            keys = seen[h0]
            break
    t = CuckooTable(size, max_kicks=4, stash=0)
    for k in keys:
        assert t.insert(k, k)
    assert all(t.lookup(k) == k for k in keys)
    for k in keys:
        kind, pos = t.where(k)
        assert pos == hashes(k, size)[int(kind[1])]


def test_delete_and_reinsert():
    t = CuckooTable(4, max_kicks=2, stash=1)
    assert t.insert(7, "a")
    with pytest.raises(KeyError):
        t.insert(7, "b")
    assert t.delete(7) == "a" and t.lookup(7) is None and t.delete(7) is None
    assert t.insert(7, "c") and t.lookup(7) == "c"
    assert t.stats.deletes == 1


def test_stash_holds_what_no_chain_places():
    t = CuckooTable(2, max_kicks=0, stash=3)
    results = [t.insert(k, k) for k in range(10)]
    assert sum(results) == len(t) <= 7
    assert t.stats.stashed == len(t.stash_entries) == 3


@pytest.mark.parametrize("kw,msg", [
    (dict(size=3), "power of two"), (dict(size=1 << 17), "power of two"),
    (dict(size=8, max_kicks=-1), "max_kicks"), (dict(size=8, stash=-2), "stash"),
])
def test_parameter_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        CuckooTable(**kw)


def test_key_errors():
    with pytest.raises(ValueError, match="10 bits"):
        make_key(1024, 0)
    with pytest.raises(ValueError, match="22 bits"):
        make_key(0, 1 << 22)
