"""The command line: `site check`, error reporting, help text and docs/cli.md coverage."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hetslurm import errors
from hetslurm.cli import cli
from hetslurm.site import load_site

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
CASE_STUDY = ROOT / "site-configs" / "case-study.toml"
CLI_DOC = ROOT / "docs" / "cli.md"


def run(*args: str):  # -> click.testing.Result
    # click >= 8.2 keeps stderr apart from stdout in every CliRunner result.
    return CliRunner().invoke(cli, list(args))


def bad_site(tmp_path: Path) -> Path:
    text = DEMO.read_text().replace("count = 8\n", "count = 80\n", 1)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


# --- site check -----------------------------------------------------------------------


@pytest.mark.parametrize("path", [DEMO, CASE_STUDY], ids=["demo", "case-study"])
def test_check_ok(path: Path) -> None:
    result = run("site", "check", str(path))
    assert result.exit_code == 0, result.output
    site = load_site(path)
    assert f"{len(site.nodes)} nodes, valid" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("path", [DEMO, CASE_STUDY], ids=["demo", "case-study"])
def test_check_json(path: Path) -> None:
    result = run("site", "check", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    site = load_site(path)
    assert [r["class"] for r in rows] == list(site.node_classes)
    assert sum(r["nodes"] for r in rows) == len(site.nodes)
    by_class = {r["class"]: r for r in rows}
    for node in site.nodes:
        assert by_class[node.class_name]["weight"] == node.weight
        assert by_class[node.class_name]["cores"] == node.cores


def test_check_csv() -> None:
    result = run("site", "check", str(DEMO), "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert rows[0]["class"] == "h100x8"
    assert rows[0]["gpus"] == "8xh100"


def test_case_study_has_100_gpus_and_200_cpu_nodes() -> None:
    site = load_site(CASE_STUDY)
    assert sum(len(n.gpus) for n in site.nodes) == 100
    assert sum(1 for n in site.nodes if not n.gpus and not n.fpgas) == 200
    assert set(site.gpu_models()) == {"v100", "p100", "k80"}  # the models Gavel measured


# --- errors ---------------------------------------------------------------------------


def test_bad_file_one_line_exit_2(tmp_path: Path) -> None:
    path = bad_site(tmp_path)
    result = run("site", "check", str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line_no = DEMO.read_text().splitlines().index("count = 8") + 1
    assert lines[0].startswith(f"hetslurm: error: {path}:{line_no}: "
                               "key 'node_classes.h100x8.gpus.count': ")
    assert "Traceback" not in result.stderr


def test_bad_file_verbose_shows_traceback(tmp_path: Path) -> None:
    result = run("-v", "site", "check", str(bad_site(tmp_path)))
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "hetslurm.errors.ConfigError" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("hetslurm: error: ")


def test_missing_file_exit_2(tmp_path: Path) -> None:
    result = run("site", "check", str(tmp_path / "nope.toml"))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"hetslurm: error: {tmp_path / 'nope.toml'}: cannot read")


def test_usage_error_exit_2() -> None:
    result = run("site", "check")
    assert result.exit_code == 2
    assert "Missing argument 'SITE'" in result.stderr


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("hetslurm, version ")


# --- help and documentation -----------------------------------------------------------


def walk(cmd: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    yield " ".join(path), cmd
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            yield from walk(cmd.commands[name], (*path, name))


COMMANDS = [(p, c) for p, c in walk(cli) if not c.hidden]


def test_tree_has_the_site_commands() -> None:
    paths = {p for p, _ in COMMANDS}
    assert {"site", "site check", "site render"} <= paths


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[p or "hetslurm" for p, _ in COMMANDS])
def test_every_command_has_help(path: str, cmd: click.Command) -> None:
    assert (cmd.help or "").strip(), f"'hetslurm {path}' has no help text"
    assert cmd.get_short_help_str().strip()
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert (param.help or "").strip(), f"option {param.opts} of '{path}' has no help"
    result = run(*path.split(), "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout


def _doc_headings() -> list[str]:
    return [line for line in CLI_DOC.read_text().splitlines() if line.startswith("#")]


@pytest.mark.parametrize(("path", "cmd"), [c for c in COMMANDS if c[0]],
                         ids=[p for p, _ in COMMANDS if p])
def test_every_command_is_documented(path: str, cmd: click.Command) -> None:
    # A heading such as "### `hetslurm site check SITE`" documents the command.
    pattern = re.compile(rf"hetslurm {re.escape(path)}(?![\w-])")
    assert any(pattern.search(h) for h in _doc_headings()), (
        f"'hetslurm {path}' has no heading in docs/cli.md")


def _error_classes(base: type) -> Iterator[type]:
    for sub in base.__subclasses__():
        yield sub
        yield from _error_classes(sub)


def test_exit_codes_are_documented() -> None:
    text = CLI_DOC.read_text()
    codes = {errors.HetslurmError.exit_code} | {c.exit_code for c in
                                                _error_classes(errors.HetslurmError)}
    for code in sorted(codes | {0, 2}):
        assert re.search(rf"^\| {code} \|", text, re.M), f"exit code {code} not in docs/cli.md"
    # And the group's own help agrees with the documentation.
    assert cli.help is not None
    for code in codes:
        assert f"{code} " in cli.help
