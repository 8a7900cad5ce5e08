"""`hook install` checks every class, GPU model and FPGA model of the site through the
rendered hook before writing it (issue 18, finding 6): a rules table that breaks class=,
gpu-type= or fpga= jobs is refused with one line and nothing is written."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.hook import install as install_mod
from hetslurm.hook import render as render_mod
from hetslurm.site import load_site
from hetslurm.site.hook_rules import hook_rules
from hetslurm.site.load import parse_site

pytest.importorskip("lupa")

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


def break_rules(monkeypatch: pytest.MonkeyPatch, change: Callable[[dict[str, Any]], None]
                ) -> None:
    """Render every hook from a rules table that ``change`` has broken."""
    def broken(site: Any) -> dict[str, Any]:
        rules = copy.deepcopy(hook_rules(site))
        change(rules)
        return rules
    monkeypatch.setattr(render_mod, "hook_rules", broken)


def install(conf: Path, *extra: str) -> Any:
    return CliRunner().invoke(cli, ["hook", "install", "--slurm-version", "22.05",
                                    "--site", str(DEMO), "--dir", str(conf),
                                    *extra])


def refused(res: Any, conf: Path, *words: str) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert not list(conf.iterdir())  # nothing written, not even a temporary file
    return str(lines[0])


def _point_classes_at(partition: str) -> Callable[[dict[str, Any]], None]:
    def change(rules: dict[str, Any]) -> None:
        for entry in rules["classes"].values():
            entry["partition"] = partition
    return change


def _drop_class_models(rules: dict[str, Any]) -> None:
    for entry in rules["classes"].values():
        del entry["gpu_models"], entry["gpu_text"], entry["fpga_models"]


def _drop_gpu_model(rules: dict[str, Any]) -> None:
    rules["gpu_models"] = rules["gpu_models"][:1]


def _drop_fpga_models(rules: dict[str, Any]) -> None:
    rules["fpga_models"] = []


def _corrupt_classes(rules: dict[str, Any]) -> None:
    rules["classes"] = {name: "broken" for name in rules["classes"]}


@pytest.mark.parametrize(("change", "words"), [
    (_point_classes_at("nosuch"), ("class=", "partition='nosuch'", "the site says")),
    (_drop_class_models, ("class=",)),
    (_corrupt_classes, ("class=",)),
    (_drop_gpu_model, ("gpu-type=a100",)),
    (_drop_fpga_models, ("fpga=", "has none")),
], ids=["missing-partition", "class-models-gone", "classes-not-tables", "gpu-model-gone",
        "fpga-models-gone"])
def test_a_broken_rules_table_is_refused_and_nothing_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        change: Callable[[dict[str, Any]], None], words: tuple[str, ...]) -> None:
    break_rules(monkeypatch, change)
    line = refused(install(tmp_path), tmp_path, "hetslurm: error: the rendered job_submit.lua",
                   "nothing was installed", *words)
    assert "'#HET " in line


def test_a_refused_install_keeps_the_installed_hook(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert install(tmp_path).exit_code == 0
    hook = tmp_path / "job_submit.lua"
    before = (hook.read_bytes(), hook.stat().st_mtime_ns)
    break_rules(monkeypatch, _point_classes_at("nosuch"))
    res = install(tmp_path)
    assert res.exit_code == 2 and "partition='nosuch'" in res.stderr
    assert (hook.read_bytes(), hook.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job_submit.lua"]


@pytest.mark.parametrize("mode", ["enforce", "shadow", "off"])
def test_every_mode_is_checked_as_if_enforcing(tmp_path: Path, mode: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    assert install(tmp_path / "good", "--mode", mode).exit_code == 0
    break_rules(monkeypatch, _point_classes_at("nosuch"))
    refused(install(tmp_path / "bad", "--mode", mode), tmp_path / "bad", "partition='nosuch'")


def test_smoke_jobs_cover_every_class_and_model() -> None:
    site = load_site(DEMO)
    directives = [j.directive for j in install_mod.site_smoke_jobs(site)]
    assert directives == [
        "class=inference", "gpus=1 class=inference", "class=io", "class=stream",
        "fpga=1 class=stream", "class=train", "gpus=1 class=train",
        "gpus=1 gpu-type=h100", "gpus=1 gpu-type=a100", "fpga=u280"]


def test_the_expectations_come_from_the_site_not_the_table() -> None:
    site = parse_site(DEMO.read_text() + '''
[classes.solo]
devices = ["h100"]
qos = "normal"

[classes.mixed]
devices = ["a100", "u280"]
partition = "gpu"
''', "extra.toml")
    text = render_mod.render_hook(site).text
    assert install_mod.validate_text(text, site).ok
    # The same text judged against a site whose class asks for another QOS is refused.
    other = parse_site(DEMO.read_text() + '\n[classes.solo]\ndevices = ["h100"]\nqos = "x"\n',
                       "other.toml")
    got = install_mod.validate_text(text, other)
    assert not got.ok and "qos='normal', the site says 'x'" in str(got.error)


def test_a_chained_script_may_rewrite_the_same_fields(tmp_path: Path) -> None:
    # The class checks run on the hook without the site's chained script, which is the
    # site's own business (here: it moves every job to another partition afterwards).
    chain = tmp_path / "after.lua"
    chain.write_text("function slurm_job_submit(job_desc, part_list, submit_uid)\n"
                     "  job_desc.partition = \"elsewhere\"\n  return slurm.SUCCESS\nend\n")
    conf = tmp_path / "etc"
    conf.mkdir()
    res = install(conf, "--chain-after", str(chain))
    assert res.exit_code == 0, res.output


def test_install_text_without_a_site_keeps_the_plain_smoke_jobs(tmp_path: Path) -> None:
    site = load_site(DEMO)
    res = install_mod.install_text(render_mod.render_hook(site).text, tmp_path)
    assert res.changed
    with pytest.raises(ConfigError, match="does not load"):
        install_mod.install_text("this is not lua", tmp_path)
