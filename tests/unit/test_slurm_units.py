"""Slurm sentinels, units, hostlists and GRES strings: converted in one place."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hetslurm.slurm import units
from hetslurm.slurm.units import UNLIMITED, GresItem


@pytest.mark.parametrize(
    ("value", "bits", "expected"),
    [
        (4294967294, 32, None),
        (4294967295, 32, UNLIMITED),
        (0xFFFFFFFFFFFFFFFE, 64, None),
        (0xFFFFFFFFFFFFFFFF, 64, UNLIMITED),
        (0xFFFE, 16, None),
        (0xFFFF, 16, UNLIMITED),
        (4294967295, 64, 4294967295),  # a 32-bit INFINITE is a real number in a 64-bit field
        (None, 32, None),
        (7, 32, 7),
    ],
)
def test_from_uint(value: int | None, bits: int, expected: object) -> None:
    assert units.from_uint(value, bits) == expected


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("16000M", 16000),
        ("2G", 2048),
        ("1T", 1024 * 1024),
        ("512K", 1),
        ("1536K", 2),
        ("4000", 4000),
        ("1.5G", 1536),
        ("UNLIMITED", UNLIMITED),
        ("N/A", None),
        (None, None),
    ],
)
def test_memory_mib(text: str | None, mib: object) -> None:
    assert units.memory_mib(text) == mib


def test_memory_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="memory"):
        units.memory_mib("lots")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("01:00:00", 3600),
        ("2-00:00:00", 172800),
        ("1-02:03:04", 93784),
        ("05:30", 330),
        ("60", 3600),
        ("1-12", 129600),
        ("1-12:30", 131400),
        ("UNLIMITED", UNLIMITED),
        ("INFINITE", UNLIMITED),
        ("N/A", None),
        ("NONE", None),
        ("", None),
    ],
)
def test_time_seconds(text: str, seconds: object) -> None:
    assert units.time_seconds(text) == seconds


def test_time_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        units.time_seconds("soon")


def test_format_time_round_trips() -> None:
    for s in (59, 3600, 93784, 172800):
        assert units.time_seconds(units.format_time(s)) == s
    assert units.format_time(UNLIMITED) == "UNLIMITED"


def test_minutes_limit_null_is_unlimited() -> None:
    assert units.minutes_limit(60) == 3600
    assert units.minutes_limit(None) is UNLIMITED
    assert units.minutes_limit(4294967295) is UNLIMITED
    assert units.minutes_limit(4294967294) is None


def test_epoch_and_datetimes() -> None:
    assert units.from_epoch(0) is None
    assert units.from_epoch(4294967294) is None
    assert units.from_epoch(1796007153) == datetime(2026, 11, 30, 2, 52, 33, tzinfo=UTC)
    assert units.parse_datetime("Unknown") is None
    assert units.parse_datetime("None") is None
    parsed = units.parse_datetime("2026-11-30T02:52:33")
    assert parsed is not None and parsed.tzinfo is not None


def test_hostlists() -> None:
    assert units.expand_hostlist("gpu[1-2],cpu1") == ("gpu1", "gpu2", "cpu1")
    assert units.expand_hostlist("gpu[01-03]") == ("gpu01", "gpu02", "gpu03")
    assert units.expand_hostlist("(null)") == ()
    assert units.compress_hostlist(["gpu2", "gpu1", "gpu4", "gpu3", "gpu7"]) == "gpu[1-4,7]"
    with pytest.raises(ValueError):
        units.expand_hostlist("gpu[1-")


@pytest.mark.parametrize(
    ("text", "items"),
    [
        (
            "gpu:a100:4(S:0-1),fpga:u280:2",
            (GresItem("gpu", "a100", 4), GresItem("fpga", "u280", 2)),
        ),
        ("gpu:a100:2(IDX:0-1)", (GresItem("gpu", "a100", 2, (0, 1)),)),
        ("gpu:a100:3(IDX:0,2-3)", (GresItem("gpu", "a100", 3, (0, 2, 3)),)),
        ("gpu:0,fpga:u280:1(IDX:0)", (GresItem("gpu", None, 0), GresItem("fpga", "u280", 1, (0,)))),
        ("gpu:h100:0(IDX:N/A)", (GresItem("gpu", "h100", 0, ()),)),
        ("gpu:2", (GresItem("gpu", None, 2),)),
        ("gpu", (GresItem("gpu", None, 1),)),
        ("gres:gpu:a100:2", (GresItem("gpu", "a100", 2),)),
        ("gres/gpu:h100:1", (GresItem("gpu", "h100", 1),)),
        ("(null)", ()),
    ],
)
def test_parse_gres(text: str, items: tuple[GresItem, ...]) -> None:
    assert units.parse_gres(text) == items


def test_gres_counts_and_indices() -> None:
    items = units.parse_gres("gpu:a100:2(IDX:0-1),gpu:a100:1(IDX:3),fpga:0")
    assert units.gres_counts(items) == {("gpu", "a100"): 3}
    assert units.gres_indices(items) == {("gpu", "a100"): (0, 1, 3)}


def test_parse_tres_converts_memory() -> None:
    assert units.parse_tres("cpu=8,mem=16G,billing=8,gres/gpu:a100=4") == {
        "cpu": 8,
        "mem": 16384,
        "billing": 8,
        "gres/gpu:a100": 4,
    }
    assert units.parse_tres("(null)") == {}


def test_format_indices_is_the_inverse_of_parse_indices() -> None:
    from hetslurm.slurm.units import format_indices, parse_indices

    assert format_indices([4, 0, 1, 2, 2]) == "0-2,4"
    assert format_indices([]) == ""
    for text in ("0", "0-3", "1,3,5-7"):
        assert format_indices(parse_indices(text)) == text
