"""``inagg demo --switch rtl --waves run.fst`` writes the run's waveforms, from a build with tracing of its own.

The smallest harness the demo builds (2 ports, 64-bit beats), traced; skipped with the reason when the
lz4 headers Verilator's FST writer needs are missing (``.ci/run`` installs them).
"""

import ctypes
import ctypes.util
import json
import re
from pathlib import Path

import pytest

from inagg import cli

pytestmark = pytest.mark.cocotb

_HIER_LZ4 = 6  # FST block type: the hierarchy, compressed with LZ4 (the one Verilator's writer emits)


def _fst_hierarchy(path: Path) -> bytes:
    """The scope and signal names block of an FST file, decompressed.

    A block is a type byte and a big-endian length that counts itself; the
    hierarchy's starts with its uncompressed length, then the LZ4 block.
    """
    data = path.read_bytes()
    pos = 0
    while pos + 9 <= len(data):
        kind, length = data[pos], int.from_bytes(data[pos + 1:pos + 9], "big")
        if kind == _HIER_LZ4:
            size = int.from_bytes(data[pos + 9:pos + 17], "big")
            lz4 = ctypes.CDLL(ctypes.util.find_library("lz4"))
            out = ctypes.create_string_buffer(size)
            assert lz4.LZ4_decompress_safe(data[pos + 17:pos + 1 + length], out, length - 16, size) == size
            return out.raw
        pos += 1 + length
    raise AssertionError(f"{path} has no hierarchy block")


def test_demo_writes_an_fst_file_that_names_the_switch_signals(tmp_path, capsys):
    from inagg.testbench import toolchain
    from inagg.testbench.bridge.build import check_fst

    try:
        check_fst()
    except toolchain.MissingTool as e:
        pytest.skip(str(e))
    waves = tmp_path / "run.fst"
    rc = cli.main(["demo", "--switch", "rtl", "--workers", "2", "--width", "64", "--window", "16", "--size", "4KiB",
                   "--waves", str(waves), "--json"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["ok"] and s["rtl"]["waves"] == str(waves)
    assert waves.stat().st_size > 0
    hierarchy = _fst_hierarchy(waves)
    # The switch's blocks are scopes, and signals are traced down to them (a vector's name carries its range).
    for name in [b"switch", b"engine", b"ingress0", b"ingress1", b"emitter0", b"emitter1", b"alarm", b"order_log"]:
        assert re.search(re.escape(name) + rb"( \[\d+:0\])?\0", hierarchy), name
