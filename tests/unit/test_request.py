"""The request grammar (job_submit/hetreq.lua through lupa) and resolve() against a site."""

from __future__ import annotations

import re
import sys
import time
import tomllib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetslurm.errors import PlacementError
from hetslurm.request import _lua
from hetslurm.request.language import (
    Locality,
    Request,
    format_request,
    parse_request,
    request_from_table,
    resolve,
)
from hetslurm.site import Site, load_site

pytest.importorskip("lupa")

ROOT = Path(__file__).resolve().parents[2]
HETREQ = ROOT / "job_submit" / "hetreq.lua"


def parse_error(text: str) -> str:
    with pytest.raises(PlacementError) as info:
        parse_request(text)
    return str(info.value)


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(ROOT / "site-configs" / "demo.toml")


# Every key -------------------------------------------------------------------------------------


def test_empty_request_is_all_defaults() -> None:
    assert parse_request("") == Request()
    assert parse_request(" \t\n ") == Request()


def test_lua_defaults_match_the_dataclass() -> None:
    defaults = _lua.to_python(_lua.hetreq().DEFAULTS)
    for name, value in defaults.items():
        assert getattr(Request(), name) == value, name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nodes=3", Request(nodes=3, given=("nodes",))),
        ("gpus=4", Request(gpus_per_node=4, gpus_per_job=4, given=("gpus",))),
        (
            "nodes=2 gpus=8",
            Request(nodes=2, gpus_per_node=4, gpus_per_job=8, given=("nodes", "gpus")),
        ),
        ("gpus=0", Request(gpus_per_node=0, gpus_per_job=0, given=("gpus",))),
        (
            "gpus-per-node=2 nodes=4",
            Request(nodes=4, gpus_per_node=2, given=("gpus-per-node", "nodes")),
        ),
        (
            "gpus=2 gpu-type=h100|a100",
            Request(
                gpus_per_node=2,
                gpus_per_job=2,
                gpu_models=("h100", "a100"),
                given=("gpus", "gpu-type"),
            ),
        ),
        (
            "gpus=2 gpu-type=any",
            Request(gpus_per_node=2, gpus_per_job=2, given=("gpus", "gpu-type")),
        ),
        (
            "gpus=1 min-gpu-mem=40G",
            Request(
                gpus_per_node=1,
                gpus_per_job=1,
                min_gpu_mem_mib=40960,
                given=("gpus", "min-gpu-mem"),
            ),
        ),
        ("fpga=2", Request(fpgas_per_node=2, given=("fpga",))),
        ("fpga=u280", Request(fpgas_per_node=1, fpga_models=("u280",), given=("fpga",))),
        ("fpga=u280:2", Request(fpgas_per_node=2, fpga_models=("u280",), given=("fpga",))),
        (
            "fpga=u280|u250:2",
            Request(fpgas_per_node=2, fpga_models=("u280", "u250"), given=("fpga",)),
        ),
        ("cores=16", Request(cores_per_node=16, given=("cores",))),
        ("mem=16G", Request(mem_per_node_mib=16384, given=("mem",))),
        ("locality=numa", Request(locality=Locality(numa="preferred"), given=("locality",))),
        (
            "gpus=4 locality=nvlink:required,numa:preferred",
            Request(
                gpus_per_node=4,
                gpus_per_job=4,
                locality=Locality(nvlink="required", numa="preferred"),
                given=("gpus", "locality"),
            ),
        ),
        (
            "nodes=2 locality=switch:required switch-wait=10m",
            Request(
                nodes=2,
                locality=Locality(switch="required", switch_wait_s=600),
                given=("nodes", "locality", "switch-wait"),
            ),
        ),
        ("class=train", Request(workload_class="train", given=("class",))),
        ("priority=high", Request(priority="high", given=("priority",))),
        ("priority=low", Request(priority="low", given=("priority",))),
        ("energy=low", Request(energy="low", given=("energy",))),
        ("no-requeue", Request(no_requeue=True, given=("no-requeue",))),
        ("on-idle=downgrade", Request(on_idle="downgrade", given=("on-idle",))),
        ("on-idle=requeue", Request(on_idle="requeue", given=("on-idle",))),
    ],
)
def test_each_key(text: str, expected: Request) -> None:
    assert parse_request(text) == expected


def test_the_architecture_example() -> None:
    r = parse_request("gpus=4 gpu-type=h100|a100 locality=nvlink")
    assert (r.gpus_per_node, r.gpu_models, r.locality.nvlink) == (4, ("h100", "a100"), "preferred")


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        ("512", 512),
        ("512M", 512),
        ("512m", 512),
        ("2g", 2048),
        ("1T", 1048576),
        ("2048K", 2),
        ("0016G", 16384),
        ("64T", 64 * 1048576),
    ],
)
def test_memory_units(value: str, mib: int) -> None:
    assert parse_request(f"mem={value}").mem_per_node_mib == mib


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("600", 600),
        ("0", 0),
        ("45s", 45),
        ("10m", 600),
        ("2h", 7200),
        ("1d", 86400),
        ("10:00", 600),
        ("90:30", 5430),
        ("00:10:00", 600),
        ("1:00:05", 3605),
        ("24:00:00", 86400),
    ],
)
def test_switch_wait_forms(value: str, seconds: int) -> None:
    r = parse_request(f"nodes=2 locality=switch switch-wait={value}")
    assert r.locality.switch_wait_s == seconds


def test_whitespace_of_any_kind_separates_tokens() -> None:
    assert parse_request("gpus=2\tnodes=2\n  cores=4\r\n") == parse_request(
        "gpus=2 nodes=2 cores=4"
    )


# Every error path: the message names the token and what is accepted ------------------------------


@pytest.mark.parametrize(
    ("text", "token", "says"),
    [
        # keys
        ("gpu=4", "'gpu=4'", "did you mean 'gpus'"),
        ("GPUS=4", "'GPUS=4'", "did you mean 'gpus'"),
        ("gpus_per_node=2", "'gpus_per_node=2'", "did you mean 'gpus-per-node'"),
        ("prioirty=high", "'prioirty=high'", "did you mean 'priority'"),
        ("zzzzzz=1", "'zzzzzz=1'", "keys: nodes, gpus"),
        ("=4", "'=4'", "key is missing"),
        ("gpus=2 gpus=2", "'gpus=2'", "given twice"),
        ("no-requeue no-requeue", "'no-requeue'", "given twice"),
        ("gpus", "'gpus'", "needs a value"),
        ("gpus=", "'gpus='", "needs a value"),
        ("no-requeue=yes", "'no-requeue=yes'", "is a flag"),
        # numbers
        ("gpus=-1", "'gpus=-1'", "from 0 to 65536"),
        ("gpus=1.5", "'gpus=1.5'", "whole number"),
        ("gpus=0x10", "'gpus=0x10'", "whole number"),
        ("gpus=1e3", "'gpus=1e3'", "whole number"),
        ("gpus=+4", "'gpus=+4'", "whole number"),
        ("gpus=4abc", "'gpus=4abc'", "whole number"),
        ("gpus=inf", "'gpus=inf'", "whole number"),
        ("gpus=nan", "'gpus=nan'", "whole number"),
        ("gpus=1000000", "'gpus=1000000'", "from 0 to 65536"),
        ("gpus=4294967294", "'gpus=4294967294'", "from 0 to 65536"),
        ("gpus=18446744073709551615", "'gpus=18446744073709551615'", "from 0 to 65536"),
        ("gpus=9007199254740993", "'gpus=9007199254740993'", "from 0 to 65536"),
        ("gpus=" + "9" * 400, "'gpus=999", "from 0 to 65536"),
        ("gpus-per-node=65", "'gpus-per-node=65'", "from 0 to 64"),
        ("gpus-per-node=64 nodes=1025", "'gpus-per-node=64'", "at most 65536 GPUs per job"),
        ("nodes=0", "'nodes=0'", "from 1 to 65536"),
        ("nodes=65537", "'nodes=65537'", "from 1 to 65536"),
        ("nodes=4294967294", "'nodes=4294967294'", "from 1 to 65536"),
        ("cores=0", "'cores=0'", "from 1 to 16384"),
        ("cores=16385", "'cores=16385'", "from 1 to 16384"),
        ("fpga=65", "'fpga=65'", "0 to 64"),
        ("fpga=-1", "'fpga=-1'", "fpga=N"),
        ("fpga=u280:0", "'fpga=u280:0'", "fpga=model:N"),
        ("fpga=u280:", "'fpga=u280:'", "fpga=model:N"),
        ("fpga=u280:x", "'fpga=u280:x'", "fpga=model:N"),
        ("mem=0", "'mem=0'", "from 1M to 64T"),
        ("mem=65T", "'mem=65T'", "from 1M to 64T"),
        ("mem=16GB", "'mem=16GB'", "e.g. 16G"),
        ("mem=1.5G", "'mem=1.5G'", "e.g. 16G"),
        ("mem=1536K", "'mem=1536K'", "whole number of MiB"),
        ("mem=18446744073709551615T", "'mem=18446744073709551615T'", "from 1M to 64T"),
        ("gpus=1 min-gpu-mem=0", "'min-gpu-mem=0'", "from 1M to 64T"),
        ("gpus=1 min-gpu-mem=lots", "'min-gpu-mem=lots'", "e.g. 16G"),
        # per-job split and conflicts
        ("nodes=2 gpus=7", "'gpus=7'", "split evenly over nodes=2"),
        ("nodes=2 gpus=130", "'gpus=130'", "at most 64 per node"),
        ("gpus=4 gpus-per-node=4", "'gpus=4'", "give one of them"),
        ("gpu-type=h100", "'gpu-type=h100'", "needs GPUs"),
        ("gpus=0 gpu-type=h100", "'gpu-type=h100'", "needs GPUs"),
        ("min-gpu-mem=40G", "'min-gpu-mem=40G'", "needs GPUs"),
        ("locality=nvlink", "'locality=nvlink'", "nvlink needs GPUs"),
        ("switch-wait=10m", "'switch-wait=10m'", "needs locality=switch"),
        ("locality=numa switch-wait=10m", "'switch-wait=10m'", "needs locality=switch"),
        ("no-requeue on-idle=requeue", "'on-idle=requeue'", "contradicts 'no-requeue'"),
        # models
        ("gpus=1 gpu-type=H100", "'gpu-type=H100'", "lowercase letter"),
        ("gpus=1 gpu-type=1a", "'gpu-type=1a'", "lowercase letter"),
        ("gpus=1 gpu-type=a-b", "'gpu-type=a-b'", "lowercase letter"),
        ("gpus=1 gpu-type=" + "a" * 32, "'gpu-type=aaaa", "at most 31"),
        ("gpus=1 gpu-type=gpu", "'gpu-type=gpu'", "not a model name"),
        ("gpus=1 gpu-type=h100|any", "'gpu-type=h100|any'", "not a model name"),
        ("gpus=1 gpu-type=h100||a100", "'gpu-type=h100||a100'", "empty model name"),
        ("gpus=1 gpu-type=h100|", "'gpu-type=h100|'", "empty model name"),
        ("gpus=1 gpu-type=h100|h100", "'gpu-type=h100|h100'", "listed twice"),
        (
            "gpus=1 gpu-type=" + "|".join(f"m{i}" for i in range(17)),
            "'gpu-type=m0|m1",
            "at most 16 models",
        ),
        ("fpga=U280:1", "'fpga=U280:1'", "lowercase letter"),
        ("fpga=:2", "'fpga=:2'", "empty model name"),
        ("fpga=cpu:1", "'fpga=cpu:1'", "not a model name"),
        # locality
        ("locality=nvlnk", "'locality=nvlnk'", "did you mean 'nvlink'"),
        ("locality=", "'locality='", "needs a value"),
        ("locality=,", "'locality=,'", "unknown locality level ''"),
        ("locality=numa,numa", "'locality=numa,numa'", "given twice"),
        ("locality=numa:hard", "'locality=numa:hard'", "numa:required or numa:preferred"),
        ("locality=numa:requird", "'locality=numa:requird'", "did you mean 'required'"),
        ("locality=numa:", "'locality=numa:'", "numa:required or numa:preferred"),
        ("nodes=2 locality=switch switch-wait=2d", "'switch-wait=2d'", "at most one day"),
        ("nodes=2 locality=switch switch-wait=86401", "'switch-wait=86401'", "at most one day"),
        ("nodes=2 locality=switch switch-wait=-5", "'switch-wait=-5'", "600 (seconds)"),
        ("nodes=2 locality=switch switch-wait=10:61", "'switch-wait=10:61'", "10:00"),
        ("nodes=2 locality=switch switch-wait=1:60:00", "'switch-wait=1:60:00'", "00:10:00"),
        ("nodes=2 locality=switch switch-wait=10x", "'switch-wait=10x'", "30s"),
        # choices and class
        ("priority=urgent", "'priority=urgent'", "one of high, normal, low"),
        ("priority=hihg", "'priority=hihg'", "did you mean 'high'"),
        ("energy=high", "'energy=high'", "one of low, normal"),
        ("on-idle=kill", "'on-idle=kill'", "notify, requeue, downgrade"),
        ("class=9lives", "'class=9lives'", "starts with a letter"),
        ("class=a.b", "'class=a.b'", "starts with a letter"),
    ],
)
def test_errors_name_the_token(text: str, token: str, says: str) -> None:
    message = parse_error(text)
    assert token in message
    assert says in message


def test_parse_bound_is_a_slurm_comment() -> None:
    # 1024 bytes is accepted (padding is whitespace), 1025 is refused with a message.
    assert parse_request("gpus=2".ljust(1024)).gpus_per_node == 2
    message = parse_error("gpus=2".ljust(1025))
    assert "1025 bytes" in message and "at most 1024" in message


def test_bound_counts_bytes_not_characters() -> None:
    assert "1026 bytes" in parse_error("é" * 513)


def test_too_many_tokens() -> None:
    message = parse_error(" ".join(["nodes=1"] * 33))
    assert "more than 32 words" in message
    # Below the bound the duplicate is what is reported.
    assert "given twice" in parse_error(" ".join(["nodes=1"] * 32))


def test_messages_are_printable_ascii_and_short() -> None:
    message = parse_error("gpus=\x00\x1b[31m\u2603" + "x" * 200)
    assert message.isascii() and message.isprintable()
    assert "..." in message
    assert len(message) < 200


def test_lone_surrogate_reaches_the_grammar() -> None:
    assert "unknown key" in parse_error("\ud800=1")


# Numbers are exact integers that Lua 5.1 prints as digits ----------------------------------------


def test_largest_values_print_as_digits_in_lua() -> None:
    text = (
        "nodes=65536 gpus-per-node=1 min-gpu-mem=64T fpga=u280:64 cores=16384 mem=64T "
        "locality=switch switch-wait=86400"
    )
    parse = _lua.hetreq().parse
    lua = _lua.new_runtime()
    tostring = lua.eval("tostring")
    table = parse(text.encode())
    numbers = [
        table[k]
        for k in (
            b"nodes",
            b"gpus_per_node",
            b"min_gpu_mem_mib",
            b"fpgas_per_node",
            b"cores_per_node",
            b"mem_per_node_mib",
        )
    ]
    numbers.append(table[b"locality"][b"switch_wait_s"])
    for n in numbers:
        assert re.fullmatch(rb"\d+", tostring(n)), n
    assert parse_request(text).mem_per_node_mib == 64 * 1024 * 1024


# Round trips --------------------------------------------------------------------------------------

_models = st.lists(
    st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=4, unique=True
).filter(lambda ms: not {"gpu", "fpga", "cpu", "any"} & set(ms))


@st.composite
def valid_requests(draw: st.DrawFn) -> Request:
    nodes = draw(st.integers(1, 65536))
    per_node = draw(st.integers(0, min(64, 65536 // nodes)))
    per_job = draw(st.booleans())
    gpu_models = tuple(draw(_models)) if per_node and draw(st.booleans()) else ()
    fpgas = draw(st.integers(0, 64))
    fpga_models = tuple(draw(_models)) if fpgas and draw(st.booleans()) else ()
    level = st.sampled_from([None, "required", "preferred"])
    switch = draw(level)
    return Request(
        nodes=nodes,
        gpus_per_node=per_node,
        gpus_per_job=per_node * nodes if per_job else None,
        gpu_models=gpu_models,
        min_gpu_mem_mib=draw(st.none() | st.integers(1, 64 * 1048576)) if per_node else None,
        fpgas_per_node=fpgas,
        fpga_models=fpga_models,
        cores_per_node=draw(st.integers(1, 16384)),
        mem_per_node_mib=draw(st.none() | st.integers(1, 64 * 1048576)),
        locality=Locality(
            nvlink=draw(level) if per_node else None,
            numa=draw(level),
            switch=switch,
            switch_wait_s=draw(st.none() | st.integers(0, 86400)) if switch else None,
        ),
        workload_class=draw(
            st.none() | st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,10}", fullmatch=True)
        ),
        priority=draw(st.sampled_from(["high", "normal", "low"])),
        energy=draw(st.sampled_from(["low", "normal"])),
        no_requeue=(no_requeue := draw(st.booleans())),
        on_idle=draw(
            st.sampled_from([None, "notify", "downgrade"] + ([] if no_requeue else ["requeue"]))
        ),
    )


@settings(max_examples=300, deadline=None)
@given(valid_requests())
def test_format_then_parse_round_trips(request: Request) -> None:
    parsed = parse_request(format_request(request))
    assert replace(parsed, given=()) == request


@pytest.mark.parametrize(
    "text",
    [
        "nodes=2 gpus=8 gpu-type=h100|a100 min-gpu-mem=40960M locality=nvlink:required",
        "fpga=u280:2 cores=4 mem=16384M class=stream energy=low",
        "nodes=4 gpus-per-node=2 locality=numa:preferred,switch:required switch-wait=600 "
        "priority=high no-requeue on-idle=notify",
    ],
)
def test_canonical_text_is_a_fixed_point(text: str) -> None:
    assert format_request(parse_request(text)) == text


def test_request_from_table_refuses_drift() -> None:
    table: dict[str, Any] = {"nodes": 1, "gpus": 4}
    with pytest.raises(ValueError, match="gpus"):
        request_from_table(table)
    with pytest.raises(ValueError, match="nodes"):
        request_from_table({"nodes": 1.5})
    with pytest.raises(ValueError, match="locality"):
        request_from_table({"locality": {"nvlink": "always"}})
    assert request_from_table({"nodes": 2.0, "gpu_models": {}}) == Request(nodes=2)


# Robustness: junk never raises a Lua error, only PlacementError -------------------------------

_WORDS = [
    "gpus",
    "nodes",
    "gpu-type",
    "fpga",
    "mem",
    "locality",
    "switch-wait",
    "nvlink",
    "required",
    "preferred",
    "switch",
    "h100",
    "a100",
    "class",
    "no-requeue",
    "on-idle",
    "min-gpu-mem",
    "cores",
    "priority",
    "energy",
    "any",
    "9007199254740993",
]
_grammar_alphabet = st.sampled_from(
    [*"=|:,- \t\n0123456789abcdefghiklmnopqrstuvwxyzGKMT.x+e_", *_WORDS, "\x00", "\u00e9"]
)


def _parse_or_refuse(text: str) -> None:
    try:
        r = parse_request(text)
    except PlacementError as e:
        assert str(e)
        return
    assert isinstance(r, Request)
    assert 1 <= r.nodes <= 65536 and 0 <= r.gpus_per_node <= 64
    assert r.gpus_per_node * r.nodes <= 65536


@settings(max_examples=1500, deadline=None)
@given(st.lists(_grammar_alphabet, max_size=60).map("".join))
def test_grammar_shaped_junk_never_crashes(text: str) -> None:
    _parse_or_refuse(text)


_VALUES = st.sampled_from(
    [
        "0",
        "1",
        "2",
        "4",
        "8",
        "64",
        "65",
        "-1",
        "1.5",
        "0x10",
        "1e30",
        "4294967294",
        "",
        "any",
        "h100",
        "h100|a100",
        "u280:2",
        "u280|",
        "16G",
        "1536K",
        "64T",
        "nvlink",
        "numa:required",
        "switch,nvlink:preferred",
        "switch:hard",
        "10m",
        "00:10:00",
        "99:99",
        "train",
        "high",
        "low",
        "notify",
        "requeue",
        "9" * 30,
        "\u00e9",
    ]
)
_KEYS_AND_JUNK = st.sampled_from([*_WORDS[:1], "gpus-per-node", *_WORDS[1:], "gpu", "x"])
_tokens = st.one_of(
    st.tuples(_KEYS_AND_JUNK, _VALUES).map("=".join),
    st.sampled_from(["no-requeue", "gpus", "="]),
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_tokens, max_size=8).map(" ".join))
def test_key_value_soup_is_parsed_or_refused(text: str) -> None:
    _parse_or_refuse(text)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=1100))
def test_any_text_never_crashes(text: str) -> None:
    _parse_or_refuse(text)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1100))
def test_any_bytes_never_crash_the_lua(data: bytes) -> None:
    result = _lua.hetreq().parse(data)
    if isinstance(result, tuple):
        assert result[0] is None and isinstance(result[1], bytes) and result[1].isascii()


def test_adversarial_input_is_fast() -> None:
    worst = " ".join(["zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"] * 20)[:1024]
    start = time.perf_counter()
    for _ in range(100):
        with pytest.raises(PlacementError):
            parse_request(worst)
    assert (time.perf_counter() - start) / 100 < 0.005


# The Lua module keeps its rules --------------------------------------------------------------


def _code_only(lua: str) -> str:
    lua = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', lua)  # strings first: they may hold "--"
    return re.sub(r"--[^\n]*", "", lua)


def test_lua_source_keeps_to_lua51_and_no_io() -> None:
    code = _code_only(HETREQ.read_text())
    for banned in (
        r"\bgoto\b",
        r"//",
        r"\bos\.",
        r"\bio\.",
        r"\brequire\b",
        r"\bdebug\.",
        r"\berror\s*\(",
        r"\bload(string|file)?\s*\(",
        r"\bdofile\b",
        r"\bsetfenv\b",
        r"\bprint\s*\(",
    ):
        assert not re.search(banned, code), banned
    # Every top-level binding is local: a line starting at column 0 with a name and '='.
    assert not re.findall(
        r"^(?!local\b|return\b|end\b|function M\.)[A-Za-z_]\w*\s*=", code, flags=re.MULTILINE
    )


def test_runtime_is_the_chosen_lua_without_python() -> None:
    lua = _lua.new_runtime()
    assert lua.eval("_VERSION") == b"Lua 5." + _lua.flavour()[-1].encode()
    assert lua.eval("python") is None
    assert lua.eval("package.loaded.python") is None


def test_loader_refuses_global_reads_and_writes() -> None:
    lua_error = _lua._lupa(_lua.flavour()).LuaError
    lua = _lua.new_runtime()
    with pytest.raises(lua_error, match="write of global"):
        _lua.load_module(lua, b"x = 1 return {}", "bad.lua")
    mod = _lua.load_module(lua, b"return {f = function() return os.time() end}", "bad.lua")
    with pytest.raises(lua_error, match="unknown global os"):
        mod.f()


def test_missing_lupa_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lupa", None)
    with pytest.raises(PlacementError, match="pip install lupa"):
        _lua.new_runtime()


def test_unknown_lua_version_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_lua.LUA_ENV, "lua50")
    with pytest.raises(PlacementError, match=r"HETSLURM_LUA=lua50: the hook runs under lua51"):
        _lua.new_runtime()


def test_every_key_is_documented() -> None:
    doc = (ROOT / "docs" / "requests.md").read_text()
    keys = _lua.to_python(_lua.hetreq().KEYS)
    assert len(keys) == 16
    for key in keys:
        assert re.search(rf"^### `{re.escape(key)}[`=]", doc, flags=re.MULTILINE), key


def test_bounds_in_docs_match_lua() -> None:
    doc = (ROOT / "docs" / "requests.md").read_text()
    limits = _lua.to_python(_lua.hetreq().LIMITS)
    for name, value in limits.items():
        assert f"| `{name}` | {value} |" in doc, name


def test_dataclass_fields_are_known_to_the_lua_or_resolve() -> None:
    table = _lua.parse_table(
        "gpus=1 gpu-type=h100 min-gpu-mem=1G fpga=u280 mem=1G class=x "
        "on-idle=notify locality=nvlink wait-for=first,max=1h"
    )
    names = {f.name for f in fields(Request)}
    # ``tokens`` is the hook's key -> word map (the same keys as ``given``), not a field.
    assert set(table) == (names - {"partition", "qos", "cpu_only", "own_gpu_models", "partitions",
                                   "rank_all"}) | {"tokens"}
    assert set(table["tokens"]) == set(table["given"])
    assert table["tokens"]["gpu-type"] == "gpu-type=h100"


def test_a_request_starts_from_the_lua_defaults() -> None:
    # hetreq.lua builds each request with a table constructor (no copy of DEFAULTS per call):
    # the two must agree.
    defaults = _lua.to_python(_lua.hetreq().DEFAULTS)
    table = _lua.parse_table("class=x")
    for key, value in defaults.items():
        assert table[key] == value, key


# Packaging ---------------------------------------------------------------------------------------


def test_pyproject_lists_every_hetslurm_package() -> None:
    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert set(find_packages(str(ROOT), include=["hetslurm", "hetslurm.*"])) <= listed
    assert config["package-dir"]["hetslurm_job_submit"] == "job_submit"
    assert "*.lua" in config["package-data"]["hetslurm_job_submit"]


def test_source_is_read_from_the_checkout() -> None:
    assert _lua.lua_source() == HETREQ.read_bytes()


# resolve() against site-configs/demo.toml -------------------------------------------------


def test_class_expands_devices_and_partition(demo: Site) -> None:
    r = resolve(parse_request("gpus=2 class=train"), demo)
    assert (r.gpu_models, r.partition, r.qos, r.cpu_only) == (("h100", "a100"), "gpu", None, False)
    r = resolve(parse_request("gpus=2 class=inference"), demo)
    assert r.gpu_models == ("a100", "h100")


def test_explicit_gpu_type_beats_the_class(demo: Site) -> None:
    r = resolve(parse_request("gpus=2 class=train gpu-type=a100"), demo)
    assert (r.gpu_models, r.partition) == (("a100",), "gpu")
    # An explicit "any" is explicit too.
    assert resolve(parse_request("gpus=2 class=train gpu-type=any"), demo).gpu_models == ()


def test_class_ranks_only_the_kinds_asked_for(demo: Site) -> None:
    assert resolve(parse_request("class=train"), demo).gpu_models == ()
    r = resolve(parse_request("fpga=1 class=stream"), demo)
    assert (r.fpga_models, r.partition) == (("u280",), "fpga")
    assert resolve(parse_request("fpga=u280:2 class=stream"), demo).fpga_models == ("u280",)


def test_cpu_class(demo: Site) -> None:
    r = resolve(parse_request("class=io cores=4"), demo)
    assert (r.cpu_only, r.partition, r.gpu_models) == (True, "cpu", ())
    with pytest.raises(PlacementError, match="class=io runs on CPU-only nodes"):
        resolve(parse_request("class=io gpus=1"), demo)


def test_unknown_class_and_models(demo: Site) -> None:
    with pytest.raises(PlacementError, match=r"class=trian.*did you mean 'train'.*inference"):
        resolve(parse_request("class=trian"), demo)
    with pytest.raises(PlacementError, match=r"'h200'.*did you mean 'h100'.*h100, a100"):
        resolve(parse_request("gpus=1 gpu-type=h200"), demo)
    with pytest.raises(PlacementError, match=r"FPGA model 'u250'.*u280"):
        resolve(parse_request("fpga=u250:1"), demo)


def test_min_gpu_mem(demo: Site) -> None:
    assert demo.gpu_memory_mib() == {"h100": 81920, "a100": 40960}
    assert resolve(parse_request("gpus=1 min-gpu-mem=60G"), demo).gpu_models == ("h100",)
    assert resolve(parse_request("gpus=1 min-gpu-mem=40G"), demo).gpu_models == ("h100", "a100")
    r = resolve(parse_request("gpus=1 class=inference min-gpu-mem=60G"), demo)
    assert r.gpu_models == ("h100",)
    with pytest.raises(PlacementError, match="gpu-type a100 has 40960 MiB"):
        resolve(parse_request("gpus=1 gpu-type=h100|a100 min-gpu-mem=60G"), demo)
    with pytest.raises(PlacementError, match=r"no GPU model of site 'hetdemo' has that much"):
        resolve(parse_request("gpus=1 min-gpu-mem=1T"), demo)


def test_devices_the_site_lacks(demo: Site) -> None:
    cpu_only = replace(demo, node_classes={"cpu8": demo.node_classes["cpu8"]})
    with pytest.raises(PlacementError, match="asks for GPUs; site 'hetdemo' has none"):
        resolve(parse_request("gpus=1"), cpu_only)
    with pytest.raises(PlacementError, match="asks for FPGAs"):
        resolve(parse_request("fpga=1"), cpu_only)


def test_resolve_is_idempotent(demo: Site) -> None:
    r = resolve(parse_request("gpus=2 class=train min-gpu-mem=60G"), demo)
    assert resolve(r, demo) == r


def test_module_embeds_verbatim_in_a_hook() -> None:
    # What the hook installer does: the module text inside a function body, in a plain
    # runtime whose globals are the controller's (no sandbox).
    from lupa import lua51

    lua = lua51.LuaRuntime(register_eval=False, register_builtins=False)
    hook = (
        "local hetreq = (function()\n"
        + HETREQ.read_text()
        + "\nend)()\n"
        + (
            "return function(t) local r, e = hetreq.parse(t) "
            "if r then return r.gpus_per_node end return e end"
        )
    )
    check = lua.execute(hook)
    assert check("nodes=2 gpus=8") == 4
    assert "unknown key" in check("gpu=1")
