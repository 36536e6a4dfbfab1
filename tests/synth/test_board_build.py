"""Board builds through `inagg board build`, to nextpnr's packed netlist: each board's default build fits its device."""

import json
import os
import stat

import pytest

from inagg import cli

from .test_synth import needs_yowasp


@pytest.mark.synth
@needs_yowasp
@pytest.mark.parametrize("name, device, luts", [("colorlight-5a75b", "LFE5U-25F", 24288),
                                                ("versa-ecp5", "LFE5UM-45F", 43848)])
def test_a_board_build_packs_into_its_device(name, device, luts, tmp_path, capsys):
    # Each board at its default build: elaboration on the board's pins, yosys, nextpnr's packer; 2 to 3 minutes
    # each on a core here, more beside other builds (docs/board.md).
    assert cli.main(["board", "build", "--board", name, "--pack-only", "--json", "--out", str(tmp_path)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["board"], r["device"], r["placed"]) == (name, device, False)
    assert r["luts_avail"] == luts and not r["overused"]
    assert 10_000 < r["luts"] <= r["luts_avail"] and r["ebr"] <= r["ebr_avail"]
    # Both MACs and the bridge are in the netlist (nextpnr names a cell after its net, under its block).
    cells = json.loads((tmp_path / "top.json").read_text())["modules"]["top"]["cells"]
    blocks = {name.split(".")[0] for name in cells} | {".".join(name.split(".")[:2]) for name in cells}
    assert {"eth0", "eth1", "switch.mgmt", "switch.engine", "pll"} <= blocks
    # A new key for the bitstream, beside it, for its owner's eyes only.
    key = tmp_path / "board.key"
    assert r["mgmt_key_file"] == str(key) and len(bytes.fromhex(key.read_text())) == 16
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
