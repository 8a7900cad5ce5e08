"""Hostile-input corpus (issue 18, item 2) for site files, traces, notifier input and state
files: hand-written edge cases and seeded generators, each case with its exact outcome.

Site files and state files also go through the command line in ``test_input_files.py``
(unreadable, binary, oversized); here their *contents* are hostile. Every generator is
seeded, so a failure names a case that reproduces.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetslurm.act.notify import MAX_VALUE, clean, notifier_argv, send
from hetslurm.cli import cli
from hetslurm.errors import ConfigError, PlacementError
from hetslurm.placement.state import LiveState
from hetslurm.simulate.traces import TraceError, read_trace
from hetslurm.site.load import parse_site

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
DEMO_TEXT = DEMO.read_text()
SEEDS = range(40)


# --- site files ------------------------------------------------------------------------------

def _line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


SITE_EDGES: list[tuple[str, str, str]] = [
    ("NUL in a string", 'schema_version = 1\nname = "a\x00b"\n',
     "s.toml:2: not valid TOML: Illegal character '\\x00' (at line 2, column 10)"),
    # tomllib recurses per level: before, a RecursionError traceback.
    ("arrays nested 2,000 deep", "schema_version = 1\nx = " + "[" * 2000 + "]" * 2000 + "\n",
     "s.toml: not valid TOML: arrays or inline tables nested too deeply"),
    ("inline tables nested 400 deep",
     "schema_version = 1\nx = " + "{a=" * 400 + "1" + "}" * 400 + "\n",
     "s.toml: not valid TOML: arrays or inline tables nested too deeply"),
    ("a table 500 keys deep", "schema_version = 1\n[" + ".".join(["a"] * 500) + "]\n",
     "s.toml:2: key 'a': unknown key 'a'"),
    ("a table declared twice", DEMO_TEXT.replace("[scheduling]", "[scheduling]\n[scheduling]", 1),
     "s.toml:13: not valid TOML: Cannot declare ('scheduling',) twice (at line 13, column 12)"),
    ("misspelled key", DEMO_TEXT.replace("[scheduling]", "[scheduling]\ngpu_model_ordr = []", 1),
     "s.toml:13: key 'scheduling.gpu_model_ordr': unknown key 'gpu_model_ordr'; did you mean "
     "'gpu_model_order'?"),
    ("count as a string", DEMO_TEXT.replace("count = 8", 'count = "8"', 1),
     "s.toml:29: key 'node_classes.h100x8.gpus.count': Input should be a valid integer "
     "(got '8')"),
    ("count past 64 bits", DEMO_TEXT.replace("count = 8", "count = 99999999999999999999", 1),
     "s.toml:29: key 'node_classes.h100x8.gpus.count': Input should be less than or equal "
     "to 64"),
    ("cores as a float", DEMO_TEXT.replace("cores_per_socket = 4", "cores_per_socket = 1e9", 1),
     "s.toml:21: key 'node_classes.h100x8.cores_per_socket': Input should be a valid integer "
     "(got 1000000000.0)"),
    ("negative memory", DEMO_TEXT.replace('memory = "16G"', 'memory = "-16G"', 1),
     "s.toml:22: key 'node_classes.h100x8.memory': '-16G' is not a memory size; write e.g. "
     "16000 (MiB) or '16G'"),
    ("a node named twice", DEMO_TEXT.replace("[nodes]", '[nodes]\n"gpu1" = "a100x8"', 1),
     "s.toml:74: key 'nodes.\"gpu[1-2]\"': node 'gpu1' is defined twice"),
    ("empty cluster name", DEMO_TEXT.replace('name = "hetdemo"', 'name = ""', 1),
     "s.toml:9: key 'name': cluster name must be lowercase letters, digits, '_' or '-', "
     "starting with a letter, at most 40 characters (Slurm lowercases ClusterName)"),
    ("200,000 comment lines and no classes", "schema_version = 1\n" + "# c\n" * 200_000
     + "name = 'x'\n", "s.toml: key 'node_classes': required key 'node_classes' is missing"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in SITE_EDGES],
                         ids=[c[0] for c in SITE_EDGES])
def test_site_edge_cases(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_site(text, "s.toml")
    assert str(info.value) == message


def _site_mutant(seed: int) -> tuple[bytes, str]:
    """The demo site with one seeded fault, and the exact error it must give."""
    rng = random.Random(seed)
    kind = seed % 4
    text = DEMO_TEXT
    if kind == 0:  # a negative device count
        n = rng.randint(-(10**6), 0)
        line = _line_of(text, "count = 8")
        bad = text.replace("count = 8", f"count = {n}", 1)
        return bad.encode(), (f"s.toml:{line}: key 'node_classes.h100x8.gpus.count': Input "
                              "should be greater than or equal to 1")
    if kind == 1:  # a huge device count
        n = rng.randint(65, 10**18)
        line = _line_of(text, "count = 8")
        bad = text.replace("count = 8", f"count = {n}", 1)
        return bad.encode(), (f"s.toml:{line}: key 'node_classes.h100x8.gpus.count': Input "
                              "should be less than or equal to 64")
    if kind == 2:  # an unknown key with a random name
        name = "zz" + "".join(rng.choice("abcdefghij_") for _ in range(rng.randint(1, 30)))
        bad = text.replace("[scheduling]\n", f"[scheduling]\n{name} = 1\n", 1)
        line = _line_of(bad, f"{name} = 1")
        return bad.encode(), f"s.toml:{line}: key 'scheduling.{name}': unknown key '{name}'"
    # A byte that is never UTF-8 at a random offset.
    raw = text.encode()
    at = rng.randrange(len(raw))
    byte = rng.choice([0x80, 0xBF, 0xC0, 0xC1, 0xF5, 0xFF])
    bad_bytes = raw[:at] + bytes([byte]) + raw[at:]
    line = raw[:at].count(b"\n") + 1
    return bad_bytes, f"s.toml:{line}: site file is not UTF-8 at byte {at} (0x{byte:02x})"


@pytest.mark.parametrize("seed", SEEDS)
def test_site_generated(tmp_path: Path, seed: int) -> None:
    data, message = _site_mutant(seed)
    path = tmp_path / "s.toml"
    path.write_bytes(data)
    res = CliRunner().invoke(cli, ["site", "check", str(path)], catch_exceptions=False)
    assert (res.exit_code, res.stderr.splitlines()) == (
        2, [f"hetslurm: error: {tmp_path}/{message}"])


# --- traces ----------------------------------------------------------------------------------

ALIBABA = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos,pod_phase,creation_time,"
           "deletion_time,scheduled_time\n")
ALI_OK = "p1,1000,1024,1,1000,LS,Running,0,100,10\n"
PHILLY = "timestamp,duration,num_gpus\n"

TRACE_EDGES: list[tuple[str, str, str, str]] = [
    ("truncated last row", "alibaba", ALIBABA + ALI_OK + "p2,1000,1024,1",
     ":3: 4 fields, header has 10"),
    ("wrong columns", "alibaba", "a,b,c\n1,2,3\n",
     ":1: header lacks column(s) name, cpu_milli, memory_mib, num_gpu, gpu_milli, qos, "
     "pod_phase, creation_time, deletion_time, scheduled_time"),
    ("NaN time", "alibaba", ALIBABA + ALI_OK.replace(",100,", ",nan,"),
     ":2: field 'deletion_time' = 'nan' is out of range (0..1e+10)"),
    ("ends before it starts", "alibaba", ALIBABA + "p1,1000,1024,1,1000,LS,Running,0,5,10\n",
     ":2: field 'deletion_time' = 5 is before scheduled_time 10"),
    ("1e30 GPUs", "alibaba", ALIBABA + "p1,1000,1024,1e30,1000,LS,Running,0,100,10\n",
     ":2: field 'num_gpu' = '1e30' is out of range (0..65536)"),
    ("infinite duration", "philly", PHILLY + "2017-10-03 00:00:00,inf,1\n",
     ":2: field 'duration' = 'inf' is out of range (0..1e+10)"),
    ("negative duration", "philly", PHILLY + "2017-10-03 00:00:00,-5,1\n",
     ":2: field 'duration' = '-5' is out of range (0..1e+10)"),
    ("not a date", "philly", PHILLY + "yesterday,5,1\n",
     ":2: field 'timestamp' = 'yesterday' is not a date and time"),
    # An unterminated quote swallows the file; before, csv's own error was a traceback.
    ("unterminated quote", "philly", PHILLY + '"2017-10-03 00:00:00,5,1\n' + "x" * 200_000,
     ":3: not CSV: field larger than field limit (131072)"),
    ("repeated column", "philly", "timestamp,duration,num_gpus,duration\n2017-10-03,5,1,5\n",
     ":1: header repeats column(s) duration"),
    ("short Gavel row", "gavel", "ResNet-18\tcmd\t1\n", ":1: 3 tab-separated fields, expected 7"),
    ("negative arrival", "gavel", "ResNet-18\tcmd\t1\tFalse\t100\t-3\t1\n",
     ":1: field 'arrival_time' = '-3' is out of range (0..1e+10)"),
    ("zero GPUs", "gavel", "ResNet-18\tcmd\t1\tFalse\t100\t3\t0\n",
     ":1: field 'scale_factor' = '0' is out of range (1..65536)"),
    ("empty Gavel job type", "gavel", "\tcmd\t1\tFalse\t100\t3\t1\n",
     ":1: field 'job_type' is empty"),
    ("empty file", "alibaba", "", ": empty file"),
    ("header only", "philly", PHILLY, ": no replayable job in the trace"),
    ("NUL byte", "philly", PHILLY + "2017-10-03 00:00:00,5\x00,1\n",
     ":2: trace file is binary: NUL byte at byte 49"),
]


@pytest.mark.parametrize(("fmt", "text", "tail"), [c[1:] for c in TRACE_EDGES],
                         ids=[c[0] for c in TRACE_EDGES])
def test_trace_edge_cases(tmp_path: Path, fmt: str, text: str, tail: str) -> None:
    path = tmp_path / "t"
    path.write_text(text)
    with pytest.raises(TraceError) as info:
        read_trace(path, fmt)
    assert str(info.value) == f"{path}{tail}"


def _philly_mutant(seed: int) -> tuple[str, str]:
    """A valid Philly trace of 5..50 rows with one seeded fault; the exact error."""
    rng = random.Random(seed)
    rows = [f"2017-10-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:00:00,"
            f"{rng.randint(1, 10**6)},{rng.choice([1, 2, 4, 8])}"
            for _ in range(rng.randint(5, 50))]
    i = rng.randrange(len(rows))
    line = i + 2
    when, dur, gpus = rows[i].split(",")
    kind = seed % 5
    if kind == 0:
        word = rng.choice(["nan", "NaN", "-inf", "inf"])
        rows[i] = f"{when},{word},{gpus}"
        expected = f":{line}: field 'duration' = '{word}' is out of range (0..1e+10)"
    elif kind == 1:
        d = -rng.randint(1, 10**6)
        rows[i] = f"{when},{d},{gpus}"
        expected = f":{line}: field 'duration' = '{d}' is out of range (0..1e+10)"
    elif kind == 2:
        g = rng.randint(65537, 10**9)
        rows[i] = f"{when},{dur},{g}"
        expected = f":{line}: field 'num_gpus' = '{g}' is out of range (1..65536)"
    elif kind == 3:
        rows[i] = ",".join(rows[i].split(",")[: rng.randint(1, 2)])
        expected = f":{line}: {rows[i].count(',') + 1} fields, header has 3"
    else:
        rows[i] = f"{when},{dur},{gpus},{rng.randint(0, 9)}"
        expected = f":{line}: 4 fields, header has 3"
    return PHILLY + "\n".join(rows) + "\n", expected


@pytest.mark.parametrize("seed", SEEDS)
def test_trace_generated(tmp_path: Path, seed: int) -> None:
    text, tail = _philly_mutant(seed)
    path = tmp_path / "philly.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as info:
        read_trace(path, "philly")
    assert str(info.value) == f"{path}{tail}"


def test_swf_zip_that_inflates_past_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    import zipfile

    import hetslurm.simulate.traces as traces

    monkeypatch.setattr(traces, "MAX_DATA_BYTES", 1000)
    path = tmp_path / "log.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("log.swf", "; " + "x" * 5000 + "\n")
    with pytest.raises(TraceError) as info:
        read_trace(path, "swf")
    assert str(info.value) == f"{path}: log.swf inflates to 5003 bytes, over 1000"


# --- notifier input --------------------------------------------------------------------------

NOTIFY_EDGES: list[tuple[str, str, str]] = [
    ("plain", "train-42", "train-42"),
    ("newline and CR", "a\nb\r\nc", "a?b??c"),
    ("terminal escape", "\x1b[31mred\x1b[0m\x07", "?[31mred?[0m?"),
    ("NUL and DEL", "a\x00b\x7f", "a?b?"),
    ("C1 control and bidi override", "x\x9by\u202ez", "x?y?z"),
    ("lone surrogate from a non-UTF-8 name", "caf\udce9", "caf?"),
    ("non-ASCII printable kept", "Jöb ✓", "Jöb ✓"),
    ("very long", "é" * 1000, "é" * (MAX_VALUE - 3) + "..."),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in NOTIFY_EDGES],
                         ids=[c[0] for c in NOTIFY_EDGES])
def test_notifier_values_are_cleaned(raw: str, expected: str) -> None:
    assert clean(raw, MAX_VALUE) == expected
    assert notifier_argv(["/bin/n", "--user={user}"], {"user": raw}) == [
        "/bin/n", f"--user={expected}"]


@pytest.mark.parametrize("seed", SEEDS)
def test_notifier_generated(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = [chr(c) for c in range(0x20)] + ["\x7f", "\x85", "\u2028", "\u202e", "a", "Z",
                                                 "0", "-", " ", "é", "日", "\udcff"]
    raw = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 600)))
    mapped = "".join(c if c.isprintable() else "?" for c in raw)
    expected = mapped if len(mapped) <= MAX_VALUE else mapped[: MAX_VALUE - 3] + "..."
    (out,) = notifier_argv(["{job}"], {"job": raw})
    assert out == expected
    assert all(c.isprintable() for c in out) and len(out) <= MAX_VALUE


def test_notifier_stdin_and_stderr(tmp_path: Path) -> None:
    # The notifier gets names and comments as JSON (controls escaped); what it writes to
    # stderr comes back cleaned for the action log. Before, a NUL in a value raised.
    echo = tmp_path / "echo.py"
    echo.write_text("import sys\ndata = sys.stdin.read()\nsys.stderr.write(data + '\\x1b[2J')\n"
                    "sys.exit(3)\n")
    payload = {"job": "1\x00", "user": "u", "action": "notify", "rule": "r",
               "name": "n\n\x1b]0;title\x07"}
    ok, detail = send([sys.executable, str(echo), "{job}"], payload, timeout=30)
    sent = json.dumps(payload, sort_keys=True) + "\n"
    assert "\\u001b" in sent and "\\n" in sent
    expected_tail = clean((sent + "\x1b[2J").strip()[-200:], 200)
    assert (ok, detail) == (False, f"notifier exited 3: {expected_tail}")


# --- state files -----------------------------------------------------------------------------

STATE_EDGES: list[tuple[str, str, str]] = [
    ("NaN time", '{"time": NaN, "nodes": []}', "state time must be finite"),
    ("time as text", '{"time": "now", "nodes": []}', "state time must be int or float, got 'now'"),
    ("nodes as an object", '{"nodes": {}}', "state nodes must be a list"),
    ("a list at the top", "[]", "state state must be an object"),
    ("a node twice", '{"nodes": [{"name": "gpu1"}, {"name": "gpu1"}]}',
     "state lists a node twice"),
    ("an infinite GPU index", '{"nodes": [{"name": "gpu1", "gpus_used": [1e400]}]}',
     "state nodes[0].gpus_used must be int, got inf"),
    # json decodes recursively; before, a RecursionError traceback.
    ("arrays 100,000 deep", "[" * 100_000 + "]" * 100_000,
     "state file is not JSON: nested too deeply"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in STATE_EDGES],
                         ids=[c[0] for c in STATE_EDGES])
def test_state_edge_cases(text: str, message: str) -> None:
    with pytest.raises(PlacementError) as info:
        LiveState.from_json(text)
    assert str(info.value) == message


def test_state_file_through_place(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    res = CliRunner().invoke(cli, ["place", "--site", str(DEMO), "--request", "gpus=1",
                                   "--state", str(path)])
    assert (res.exit_code, res.stderr.splitlines()) == (
        5, [f"hetslurm: error: {path}: state file is not JSON: nested too deeply"])
