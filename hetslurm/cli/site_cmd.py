"""``hetslurm site``: check a site file, render Slurm's configuration from it, and roll it
out to a live cluster (diff, apply, rollback)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from hetslurm.cli.options import (
    backend_option,
    conf_dir_option,
    format_option,
    testbed_target_option,
)
from hetslurm.cli.output import emit
from hetslurm.site import load_site
from hetslurm.site.render import FRAGMENT_FILES, render, write_rendered

SITE_ARG = click.argument("site_file", metavar="SITE", type=click.Path(dir_okay=False))


@click.group()
def site() -> None:
    """Validate a site file and render slurm.conf, gres.conf and topology.conf from it.

    A site file (TOML, documented in docs/site-config.md) describes node classes (cores,
    NUMA, memory, GPUs with NVLink islands, FPGAs, power), the nodes as hostlists,
    partitions, the switch tree and workload classes.
    """


@site.command("check")
@SITE_ARG
@format_option
def check(site_file: str, output_format: str) -> None:
    """Validate SITE without writing anything; print a summary of its node classes.

    Exits 2 with one line naming the file, key and line when the site is invalid.
    """
    s = load_site(site_file)
    rows = []
    for cname, spec in s.node_classes.items():
        nodes = [n.name for n in s.nodes if n.class_name == cname]
        if not nodes:
            continue
        rows.append({
            "class": cname,
            "nodes": len(nodes),
            "cores": spec.sockets * spec.cores_per_socket,
            "memory_mib": spec.memory,
            "gpus": f"{spec.gpus.count}x{spec.gpus.model}" if spec.gpus else "",
            "fpgas": f"{spec.fpgas.count}x{spec.fpgas.model}" if spec.fpgas else "",
            "weight": next(n.weight for n in s.nodes if n.class_name == cname),
        })
    emit(rows, output_format, title=f"site '{s.name}': {len(s.nodes)} nodes, valid")


@site.command("render")
@SITE_ARG
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to write the files into (created if missing).")
@click.option("--whole", is_flag=True,
              help="Write a complete slurm.conf for a standalone cluster instead of "
                   "Include-able fragments.")
def render_cmd(site_file: str, out_dir: str, whole: bool) -> None:
    """Render Slurm configuration for SITE into --out.

    \b
    Default: fragments to Include from an existing slurm.conf:
      hetslurm-globals.conf     GresTypes, AccountingStorageTRES, TopologyPlugin, ...
      hetslurm-nodes.conf       NodeName lines with Gres=, Feature= and Weight=
      hetslurm-partitions.conf  PartitionName lines
    plus gres.conf (Cores= per NUMA domain, Links= per NVLink island) and topology.conf.
    With --whole, one complete slurm.conf replaces the three fragments.

    Rendering is deterministic; nothing is written when the site is invalid.
    """
    s = load_site(site_file)
    files = render(s, whole=whole)
    for path in write_rendered(files, out_dir):
        click.echo(str(path))
    if not whole:
        incl = " ".join(str(Path(out_dir) / f) for f in FRAGMENT_FILES)
        click.echo(f"add to slurm.conf: Include lines for {incl}; copy gres.conf and "
                   "topology.conf beside it", err=True)
    sys.stdout.flush()


# ------------------------------------------------------------ import (docs/site-config.md)
def _keyed_files(values: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """``[KEY=]FILE`` values: (KEY or None, FILE)."""
    out: list[tuple[str | None, str]] = []
    for v in values:
        key, eq, path = v.partition("=")
        out.append((key, path) if eq and key else (None, v))
    return out


@site.command("import")
@click.option("--from-conf", "from_conf", type=click.Path(file_okay=False), default=None,
              metavar="DIR",
              help="Read a Slurm configuration folder (slurm.conf with its Includes, "
                   "gres.conf, topology.conf) instead of the live cluster.")
@click.option("--gres-conf", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="gres.conf giving device files, Cores= and Links= (live: needed for them; "
                   "--from-conf: replaces DIR/gres.conf).")
@click.option("--gres-output", "gres_outputs", multiple=True, metavar="[NODES=]FILE",
              help="What `slurmd -G` printed on a node, saved to FILE; applies to the "
                   "hostlist NODES, else to every node with exactly those devices. "
                   "Repeatable.")
@click.option("--topo", "topos", multiple=True, metavar="[CLASS=]FILE",
              help="`nvidia-smi topo -m` output of one node, for NVLink islands and NUMA "
                   "domains; CLASS is a GPU model or a hostlist of nodes (none: every node "
                   "with that many GPUs). Repeatable, one per node class.")
@click.option("--name", default=None,
              help="Site name [default: the cluster's ClusterName].")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="Write the site here (atomically) [default: stdout].")
@click.option("--site-format", "site_format", type=click.Choice(("toml", "json")),
              default="toml", show_default=True,
              help="toml: a site file `site check` accepts, with '# guessed:' comments; "
                   "json: the same data and the guesses as a list, for scripts.")
@backend_option(default="auto")
def import_cmd(from_conf: str | None, gres_conf: str | None, gres_outputs: tuple[str, ...],
               topos: tuple[str, ...], name: str | None, out_file: str | None,
               site_format: str, backend: str) -> None:
    """Write a site file describing an existing cluster.

    \b
    Live (default): nodes, gres types and counts, features, weights, partitions and the
    switch tree from the running cluster (SLURM_CONF picks it); device files, Cores= and
    Links= from --gres-conf or --gres-output, NVLink islands from --topo.
    Offline: --from-conf DIR reads the same from Slurm's files.

    Where a value had to be assumed (islands without Links= or --topo, NUMA domains read
    from Cores=, power figures) the file says so in a '# guessed:' comment. The result is
    checked with the rules of `site check` before anything is written; when no valid site
    can be made the command exits 2 with the reason and writes nothing.

    \b
    Examples:
      hetslurm site import --from-conf /etc/slurm --out site.toml
      hetslurm site import --gres-conf /etc/slurm/gres.conf \\
          --topo h100=topo-h100.txt --out site.toml
      hetslurm site import --gres-output 'gpu[1-4]=slurmd-G.txt' > site.toml
    """
    from hetslurm.site import importer
    from hetslurm.textfile import read_text_file

    # The files named here are checked before Slurm is asked or a folder is read: a bad one
    # is one line and exit 2 whatever else is wrong.
    topo = [(key, importer.parse_topo_matrix(path)) for key, path in _keyed_files(topos)]
    outputs = _keyed_files(gres_outputs)
    for _, path in outputs:
        importer.parse_gres_output(path)
    if gres_conf is not None:
        read_text_file(gres_conf, what="gres.conf")
    if from_conf is not None:
        cluster = importer.from_conf(from_conf, gres_conf=gres_conf, gres_outputs=outputs,
                                     name=name)
    else:
        from hetslurm import slurm
        from hetslurm.levers.site_import import from_backend

        cluster = from_backend(slurm.get_backend(backend, env=dict(os.environ)),
                               gres_conf=gres_conf, gres_outputs=outputs, name=name)
    draft = importer.draft_site(cluster, topo)
    text = importer.to_toml(draft)
    importer.validate(text, out_file or "<imported site>")
    if site_format == "json":
        text = importer.to_json(draft)
    if out_file is None:
        click.echo(text, nl=False)
    else:
        write_rendered({Path(out_file).name: text}, Path(out_file).parent)
        click.echo(f"wrote {out_file}", err=True)
    guesses = sum(len(w) for w in draft.guessed.values())
    if guesses:
        click.echo(f"{guesses} value(s) guessed: see the '# guessed:' comments", err=True)


# ---------------------------------------------------------------- rollout (docs/levers.md)
def _target_options(func: Any) -> Any:
    opts = [
        testbed_target_option,
        conf_dir_option(),
        click.option("--whole", is_flag=True,
                     help="The live slurm.conf is one whole rendered file, not fragments."),
        click.option("--backup-dir", type=click.Path(file_okay=False),
                     help="Where backups go (default: <conf-dir>/hetslurm-backups)."),
        click.option("--restart-cmd", "restart_cmds", multiple=True, metavar="CMD",
                     help="Command that restarts daemons when a change needs it (repeatable; "
                          "default: systemctl restart slurmctld, then slurmd). Not a shell: "
                          "split like a command line."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def _target(site_path: str | None, testbed_dir: str | None, conf_dir: str | None,
            whole: bool, backup_dir: str | None, restart_cmds: tuple[str, ...]) -> Any:
    """(site or None, Target) for the options above."""
    from hetslurm.levers import SystemdDaemons, Target
    from hetslurm.slurm.conf import slurm_conf_dir
    from hetslurm.testbed.target import choose_target

    env = dict(os.environ)

    def live() -> Target:
        from hetslurm.hook.install import InstalledHook

        daemons = (SystemdDaemons(env, restart_cmds) if restart_cmds else SystemdDaemons(env))
        folder = slurm_conf_dir(conf_dir, env)
        return Target(conf_dir=folder, daemons=daemons, whole=whole, hook=InstalledHook(folder),
                      env=env, backup_dir=Path(backup_dir) if backup_dir else None)

    return choose_target(load_site(site_path) if site_path else None,
                         testbed_dir=testbed_dir, live=live)


def _change_rows(changes: Any) -> list[dict[str, Any]]:
    return [c.to_dict() for c in changes]


@site.command("diff")
@SITE_ARG
@_target_options
@click.option("--exit-code", is_flag=True, help="Exit 1 when there is a change.")
@format_option
def diff_cmd(site_file: str, testbed_dir: str | None, conf_dir: str | None, whole: bool,
             backup_dir: str | None, restart_cmds: tuple[str, ...], exit_code: bool,
             output_format: str) -> None:
    """Compare what SITE renders with the live cluster's files and QOS records.

    Each change names the file and item (a node, a partition, a global key, a gres.conf
    node block, a switch, a QOS, the hook's rules) and what applying it needs:
    `reconfigure` (scontrol reconfigure), `restart` (slurmctld and every slurmd),
    `sacctmgr`, or `hook` (the installed job_submit.lua re-rendered: classes, rankings,
    memory defaults, [classify] rules; slurmctld reloads it by itself).
    """
    from hetslurm.levers import diff

    s, target = _target(site_file, testbed_dir, conf_dir, whole, backup_dir, restart_cmds)
    plan = diff(s, target)
    if not plan.changes:
        click.echo("no change", err=True)
    else:
        click.echo(f"{len(plan.changes)} change(s); applying needs: {plan.action}", err=True)
    emit(_change_rows(plan.changes), output_format, title=f"site '{s.name}' vs live",
         document={"action": plan.action, "changes": _change_rows(plan.changes)})
    if exit_code and plan.changes:
        sys.exit(1)


@site.command("apply")
@SITE_ARG
@_target_options
@click.option("--dry-run", is_flag=True, help="Show the plan; change nothing.")
@click.option("--health-timeout", type=float, default=90.0, show_default=True,
              help="Seconds to wait for the cluster to be healthy after the change.")
@format_option
def apply_cmd(site_file: str, testbed_dir: str | None, conf_dir: str | None, whole: bool,
              backup_dir: str | None, restart_cmds: tuple[str, ...], dry_run: bool,
              health_timeout: float, output_format: str) -> None:
    """Apply SITE to the live cluster, safely.

    \b
    1. check the cluster is healthy (scontrol ping, nodes);
    2. back up the live files and the QOS records it will touch;
    3. write the new files atomically;
    4. scontrol reconfigure, or restart slurmctld and slurmd when a change needs it;
    5. check health again: slurmctld answers, every node back, none INVAL/DOWN;
    6. re-install the hook (job_submit.lua, with its mode and Slurm release) when the
       site's hook rules changed, checked first as `hook install` checks it;
    7. create or update QOS through sacctmgr.
    On any failure the backup is restored the same way and the command exits 7.
    """
    from hetslurm.levers import apply

    s, target = _target(site_file, testbed_dir, conf_dir, whole, backup_dir, restart_cmds)
    res = apply(s, target, dry_run=dry_run, health_timeout=health_timeout)
    if not res.plan.changes:
        click.echo("no change", err=True)
    elif dry_run:
        click.echo(f"dry run: would {res.plan.action} for {len(res.plan.changes)} change(s)",
                   err=True)
    else:
        click.echo(f"applied ({res.action}) in {res.seconds:.1f}s; backup {res.backup}",
                   err=True)
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
    emit(_change_rows(res.plan.changes), output_format, title=f"site '{s.name}'",
         document=res.to_dict())


@site.command("rollback")
@_target_options
@click.option("--health-timeout", type=float, default=90.0, show_default=True,
              help="Seconds to wait for the cluster to be healthy after restoring.")
@format_option
def rollback_cmd(testbed_dir: str | None, conf_dir: str | None, whole: bool,
                 backup_dir: str | None, restart_cmds: tuple[str, ...], health_timeout: float,
                 output_format: str) -> None:
    """Restore the configuration (files, hook and QOS) from before the last `site apply`.

    Uses the newest backup not yet rolled back; a second rollback goes one step further.
    """
    from hetslurm.levers import rollback

    _, target = _target(None, testbed_dir, conf_dir, whole, backup_dir, restart_cmds)
    res = rollback(target, health_timeout=health_timeout)
    click.echo(f"restored {res.backup} ({res.action or 'no file change'})", err=True)
    emit(_change_rows(res.plan.changes), output_format, title="rollback",
         document=res.to_dict())
