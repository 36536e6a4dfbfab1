"""A board build through `inagg board build`, to nextpnr's packed netlist: the Colorlight's default build fits its 25F."""

import json
import os
import stat

import pytest

from inagg import cli

from .test_synth import needs_yowasp


@pytest.mark.synth
@needs_yowasp
def test_colorlight_build_packs_into_its_25f(tmp_path, capsys):
    # The board of the two with the smaller device, at its default build: elaboration on the board's pins,
    # yosys, nextpnr's packer: 921 s here, niced beside another build (docs/board.md). The Versa's build is
    # elaborated only (tests/hdl/test_board.py): a second synthesis of this size would double that.
    assert cli.main(["board", "build", "--board", "colorlight-5a75b", "--pack-only", "--json",
                     "--out", str(tmp_path)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["board"], r["device"], r["placed"]) == ("colorlight-5a75b", "LFE5U-25F", False)
    assert r["luts_avail"] == 24288 and not r["overused"]
    assert 10_000 < r["luts"] <= r["luts_avail"] and r["ebr"] <= r["ebr_avail"]
    # Both MACs and the bridge are in the netlist (nextpnr names a cell after its net, under its block).
    cells = json.loads((tmp_path / "top.json").read_text())["modules"]["top"]["cells"]
    blocks = {name.split(".")[0] for name in cells} | {".".join(name.split(".")[:2]) for name in cells}
    assert {"eth0", "eth1", "switch.mgmt", "switch.engine", "pll"} <= blocks
    # A new key for the bitstream, beside it, for its owner's eyes only.
    key = tmp_path / "board.key"
    assert r["mgmt_key_file"] == str(key) and len(bytes.fromhex(key.read_text())) == 16
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
