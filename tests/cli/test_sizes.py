"""One size grammar on the command line: ``inagg demo --size`` and ``inagg schedule --size`` read sizes alike."""

import argparse

import pytest

from inagg import cli
from inagg.host import demo, sizes
from inagg.host.schedules import cli as schedule_cli

# Every form either command accepted before they shared the grammar, and what it means (exactly: the schedule
# command read 4.1kB through a float, as 4099 bytes).
SIZES = [("4096", 4096), ("16MiB", 16 << 20), ("1 GB", 10**9), ("8KiB", 8192), ("64kib", 65536), ("2GiB", 2 << 30),
         ("1kB", 1000), ("1KB", 1000), ("3k", 3000), ("5M", 5 * 10**6), ("1g", 10**9), ("12B", 12), (" 7 mb ", 7 * 10**6),
         ("1.5KiB", 1536), ("4.1kB", 4100), ("2.5", 2), ("0", 0)]


@pytest.mark.parametrize("text, n", SIZES)
def test_both_commands_read_a_size_the_same(text, n):
    assert sizes.parse_size(text) == schedule_cli.parse_size(text) == n
    if n % 4 == 0:
        assert demo.parse_size(text) == n


@pytest.mark.parametrize("text", ["lots", "12 parsecs", "1.5.2MiB", "-4", "MiB", "4 Mi B", ""])
def test_a_bad_size_gets_the_same_message_everywhere(text):
    message = f"bad size {text!r}: size must be a number of bytes with an optional unit (B; kB, MB, GB; KiB, MiB, GiB)"
    with pytest.raises(ValueError) as e:
        sizes.parse_size(text)
    assert str(e.value) == message
    with pytest.raises(ValueError, match=r"^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        demo.parse_size(text)
    with pytest.raises(argparse.ArgumentTypeError) as e:
        schedule_cli.parse_size(text)
    assert str(e.value) == message


def test_the_demo_wants_whole_float32_elements():
    with pytest.raises(ValueError, match=r"^size must be a multiple of 4 bytes \(whole float32 elements\), not 1000002$"):
        demo.parse_size("1000.002kB")


@pytest.mark.parametrize("argv", [["demo", "--help"], ["schedule", "--help"]])
def test_the_grammar_is_in_the_help(argv, capsys):
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert " ".join(sizes.SIZE_GRAMMAR.split()) in " ".join(capsys.readouterr().out.split())
