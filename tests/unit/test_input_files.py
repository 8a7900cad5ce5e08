"""Every CLI option that reads a user-named file refuses a bad one in one line, exit 2.

Finding 8 of issue 18: a non-UTF-8 site file (every ``--site`` command), a missing or binary
``--chain-before/--chain-after``, a binary ``--hook`` or ``--state`` file ended in a Python
traceback and exit 1. Every loader now reads through :func:`hetslurm.textfile.read_text_file`;
each case below runs the real command through click's runner and expects exit 2 and exactly
one stderr line, ``hetslurm: error: <file>[:<line>]: <what> <problem>``, with no traceback.
``test_every_file_option_is_covered`` walks the CLI so a new file option must join the table.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.textfile import (
    MAX_CONFIG_BYTES,
    MAX_DATA_BYTES,
    read_text_file,
    read_text_stream,
)

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "site-configs" / "demo.toml")
PARAMS = str(ROOT / "site-configs" / "simulate-params.toml")
#: A TOML-looking file whose second line holds Latin-1 "é" (0xe9) at byte 30.
NOT_UTF8 = b'schema_version = 1\nname = "caf\xe9"\n'
BAD = "{bad}"

# (command, option, argv with BAD where the bad file goes, what the message calls the file).
# Every other argument is valid, so the bad file is the first thing that fails.
OPTIONS: list[tuple[str, str, list[str], str]] = [
    ("site check", "SITE", ["site", "check", BAD], "site file"),
    ("site render", "SITE", ["site", "render", BAD, "--out", "{tmp}/conf"], "site file"),
    ("site diff", "SITE", ["site", "diff", BAD], "site file"),
    ("site apply", "SITE", ["site", "apply", BAD], "site file"),
    ("testbed up", "--site", ["testbed", "up", "--site", BAD], "site file"),
    ("bench testbed", "--site", ["bench", "testbed", "--site", BAD], "site file"),
    ("bench audit", "--site", ["bench", "audit", "--site", BAD], "site file"),
    ("bench hook", "--site", ["bench", "hook", "--site", BAD], "site file"),
    ("bench simulate", "--site", ["bench", "simulate", "--site", BAD], "site file"),
    ("bench simulate", "--params", ["bench", "simulate", "--site", DEMO, "--params", BAD],
     "parameter file"),
    ("hook render", "--site", ["hook", "render", "--site", BAD], "site file"),
    ("hook render", "--chain-before",
     ["hook", "render", "--site", DEMO, "--chain-before", BAD], "--chain-before file"),
    ("hook render", "--chain-after",
     ["hook", "render", "--site", DEMO, "--chain-after", BAD], "--chain-after file"),
    ("hook install", "--site", ["hook", "install", "--site", BAD, "--dir", "{tmp}"],
     "site file"),
    ("hook install", "--chain-before",
     ["hook", "install", "--site", DEMO, "--dir", "{tmp}", "--chain-before", BAD],
     "--chain-before file"),
    ("hook install", "--chain-after",
     ["hook", "install", "--site", DEMO, "--dir", "{tmp}", "--chain-after", BAD],
     "--chain-after file"),
    ("explain", "--site", ["explain", "{job}", "--site", BAD], "site file"),
    ("explain", "--hook", ["explain", "{job}", "--site", DEMO, "--hook", BAD],
     "--hook file"),
    ("explain", "--state", ["explain", "{job}", "--site", DEMO, "--state", BAD],
     "state file"),
    ("collect", "--site", ["collect", "--site", BAD], "site file"),
    ("collect", "--gres-conf",
     ["collect", "--site", DEMO, "--store", "{tmp}/store", "--gres-conf", BAD], "gres.conf"),
    ("collect", "--fake-scenario",
     ["collect", "--site", DEMO, "--store", "{tmp}/store", "--gres-conf", "{gres}",
      "--all-nodes", "--nvml", "fake", "--ticks", "1", "--fake-scenario", BAD],
     "fake NVML scenario"),
    ("audit", "--site", ["audit", "--site", BAD], "site file"),
    ("place", "--site", ["place", "--site", BAD, "--request", "gpus=1", "--state", "empty"],
     "site file"),
    ("place", "--state", ["place", "--site", DEMO, "--request", "gpus=1", "--state", BAD],
     "state file"),
    ("simulate", "--site", ["simulate", "--site", BAD, "--trace", "{trace}", "--params",
                            PARAMS, "--trace-format", "philly"], "site file"),
    ("simulate", "--params", ["simulate", "--site", DEMO, "--trace", "{trace}", "--params",
                              BAD, "--trace-format", "philly"], "parameter file"),
    ("simulate", "--trace", ["simulate", "--site", DEMO, "--trace", BAD, "--params", PARAMS,
                             "--trace-format", "philly"], "trace file"),
    ("simulate", "--validate", ["simulate", "--validate", BAD], "workload file"),
    ("act requeue-stalled", "--site", ["act", "requeue-stalled", "--site", BAD], "site file"),
    ("rebalance", "--site", ["rebalance", "--site", BAD], "site file"),
    ("rebalance rollback", "--site", ["rebalance", "rollback", "--site", BAD], "site file"),
    ("site import", "--gres-conf", ["site", "import", "--gres-conf", BAD], "gres.conf"),
    ("learn speeds", "--site", ["learn", "speeds", "--site", BAD], "site file"),
    ("learn classes", "--site", ["learn", "classes", "--site", BAD], "site file"),
    ("advise", "--site", ["advise", "--site", BAD], "site file"),
    ("bench accounting", "--site", ["bench", "accounting", "--site", BAD], "site file"),
]

# File options that are not read as user input text, and why.
NOT_INPUT = {
    # hetslurm's own action log and lock: opened with O_NOFOLLOW by hetslurm/act (log.py,
    # lock.py), written as well as read.
    ("act requeue-stalled", "--log"), ("act requeue-stalled", "--lock"),
    ("rebalance", "--log"), ("rebalance", "--lock"),
    ("rebalance rollback", "--log"), ("rebalance rollback", "--lock"),
    # slurmctld's log: its tail is read with bad bytes replaced (a log is not ours to refuse).
    ("hook check", "--log"),
    # Outputs.
    ("audit", "--out"), ("state dump", "--out"), ("site import", "--out"),
    ("learn speeds", "--out"), ("learn speeds", "--site-out"), ("learn classes", "--out"),
    ("advise", "--out"), ("simulate", "--rows-out"),
    # hetslurm's own cache: a version-checked JSON document, ignored (and said so) when it
    # cannot be read, never an error (hetslurm/audit/scripts.py).
    ("learn speeds", "--script-cache"), ("advise", "--script-cache"),
    # The rebalance read cache: opened with O_NOFOLLOW and checked on its descriptor, a
    # miss (said among the problems) when doubtful, never an error (metrics/window_cache.py,
    # tests/unit/test_window_cache.py).
    ("rebalance", "--read-cache"),
    # Scripts are passed on as bytes (Slurm does); see test_explain_script_* below.
    ("explain", "JOB_SCRIPT"),
    # A sacct JSON file is read as bytes and judged as sacct's output; see below.
    ("audit", "--sacct-file"), ("learn speeds", "--sacct-file"),
    ("learn classes", "--sacct-file"), ("advise", "--sacct-file"),
}


def _file_options() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()

    def walk(cmd: click.Command, path: list[str]) -> None:
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            if not cmd.invoke_without_command:
                return  # a group that runs by itself (rebalance) has options of its own
        for p in cmd.params:
            names = p.opts if isinstance(p, click.Option) else [p.human_readable_name]
            if isinstance(p.type, click.Path) and p.type.file_okay:
                found.add((" ".join(path), max(names, key=len)))
            elif p.name in ("state", "state_spec"):  # live|empty|FILE, a plain string
                found.add((" ".join(path), "--state"))

    walk(cli, [])
    return found


def test_every_file_option_is_covered() -> None:
    covered = {(cmd, opt) for cmd, opt, _, _ in OPTIONS}
    assert _file_options() - NOT_INPUT - covered == set()
    assert covered | NOT_INPUT <= _file_options()


def _run(args: list[str], tmp_path: Path, bad: Path) -> tuple[int, list[str], str]:
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\n#HET gpus=1\nhostname\n")
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus\n2017-10-03 00:00:00,60,1\n")
    gres = tmp_path / "gres.conf"
    gres.write_text("NodeName=gpu1 Name=gpu Type=a100 File=/dev/nvidia0\n")
    argv = [a.replace(BAD, str(bad)).replace("{tmp}", str(tmp_path))
            .replace("{job}", str(job)).replace("{trace}", str(trace))
            .replace("{gres}", str(gres)) for a in args]
    res = CliRunner().invoke(cli, argv)
    return res.exit_code, res.stderr.splitlines(), res.stdout


@pytest.mark.parametrize(("command", "option", "args", "what"), OPTIONS,
                         ids=[f"{c} {o}" for c, o, _, _ in OPTIONS])
def test_non_utf8_file_is_one_line_exit_2(tmp_path: Path, command: str, option: str,
                                          args: list[str], what: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(NOT_UTF8)
    code, err, _ = _run(args, tmp_path, bad)
    assert (code, err) == (2, [f"hetslurm: error: {bad}:2: {what} is not UTF-8 at byte 30 "
                               "(0xe9)"])


# The other ways a named file is bad, through one command per reader family.
SAMPLE = [o for o in OPTIONS if (o[0], o[1]) in {
    ("site check", "SITE"), ("hook install", "--chain-before"), ("explain", "--hook"),
    ("place", "--state"), ("simulate", "--trace"), ("simulate", "--params"),
}]
#: Past both bounds (configuration files 16 MiB, data files 1 GiB); sparse, so the size is
#: refused before a byte is read.
HUGE = MAX_DATA_BYTES + 1


def _sparse(p: Path) -> None:
    with p.open("wb") as fh:
        fh.truncate(HUGE)


KINDS: dict[str, tuple[Callable[[Path], None], str]] = {
    "binary (NUL)": (lambda p: p.write_bytes(b"schema_version = 1\n\0\0\0ELF"),
                     ":2: {what} is binary: NUL byte at byte 19"),
    "missing": (lambda p: None, ": cannot read {what}: No such file or directory"),
    # click refuses it first (dir_okay=False), as a usage error; see the test.
    "a folder": (lambda p: p.mkdir(), ""),
    "a FIFO": (os.mkfifo, ": {what} is not a regular file"),
    "too large": (_sparse, ": {what} is larger than {limit} bytes ({size})"),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("command", "option", "args", "what"), SAMPLE,
                         ids=[f"{c} {o}" for c, o, _, _ in SAMPLE])
def test_bad_file_kinds(tmp_path: Path, kind: str, command: str, option: str,
                        args: list[str], what: str) -> None:
    bad = tmp_path / "bad.input"
    make, tail = KINDS[kind]
    make(bad)
    code, err, _ = _run(args, tmp_path, bad)
    if kind == "a folder" and option == "--state":
        # --state is live|empty|FILE, a plain string: the reader refuses the folder.
        tail = ": {what} is not a regular file"
    elif kind == "a folder":
        # click's own check of a dir_okay=False path: its usage-error form, exit 2.
        flag = "'JOB_SCRIPT'" if option == "JOB_SCRIPT" else (
            "'SITE'" if option == "SITE" else f"'{option}'")
        assert (code, err[-1]) == (2, f"Error: Invalid value for {flag}: File '{bad}' is a "
                                      "directory.")
        return
    if kind in ("missing", "a FIFO") and what == "trace file":
        # read_trace checks the path first, in its own words.
        assert (code, err) == (2, [f"hetslurm: error: {bad}: no such trace file"])
        return
    limit = MAX_DATA_BYTES if what in ("state file", "trace file") else MAX_CONFIG_BYTES
    expected = "hetslurm: error: " + str(bad) + tail.format(what=what, limit=limit, size=HUGE)
    assert (code, err) == (2, [expected])


def test_explain_script_keeps_any_bytes_but_not_a_folder(tmp_path: Path) -> None:
    # Slurm hands the hook the script's bytes as they are; explain does the same.
    script = tmp_path / "latin1.sh"
    script.write_bytes(b"#!/bin/bash\n# caf\xe9\n#HET gpus=1\n")
    res = CliRunner().invoke(cli, ["explain", str(script), "--site", DEMO, "--format", "json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["explain", str(tmp_path), "--site", DEMO])
    assert res.exit_code == 2
    # click refuses a folder for a dir_okay=False argument itself, in its usage form.
    assert "is a directory" in res.stderr


def test_sacct_file_that_cannot_be_read_is_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "sacct.json"
    res = CliRunner().invoke(cli, ["audit", "--site", DEMO, "--sacct-file", str(missing),
                                   "--store", str(tmp_path / "store")])
    assert (res.exit_code, res.stderr.splitlines()) == (
        2, [f"hetslurm: error: {missing}: cannot read sacct JSON file: No such file or "
            "directory"])


def test_reader_directly(tmp_path: Path) -> None:
    p = tmp_path / "x.txt"
    p.write_bytes("naïve\r\nline two\n".encode())
    assert read_text_file(p, what="x") == "naïve\r\nline two\n"
    p.write_bytes(b"ok\nok\n\xff\xfe")
    with pytest.raises(ConfigError) as info:
        read_text_file(p, what="x")
    assert (str(info.value), info.value.line, info.value.exit_code) == (
        f"{p}:3: x is not UTF-8 at byte 6 (0xff)", 3, 2)
    assert read_text_file(p, what="x", errors="surrogateescape").endswith("\udcff\udcfe")
    p.write_bytes(b"12345")
    with pytest.raises(ConfigError, match="x is larger than 4 bytes"):
        read_text_file(p, what="x", max_bytes=4)
    import io

    with pytest.raises(ConfigError, match=r"^<stdin>: x is larger than 4 bytes$"):
        read_text_stream(io.BytesIO(b"12345"), what="x", label="<stdin>", max_bytes=4)
    assert read_text_stream(io.BytesIO(b"1234"), what="x", label="<stdin>", max_bytes=4) == "1234"
