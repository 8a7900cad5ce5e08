"""``hetslurm advise``: the audit's evidence as a proposed site file (issue 22 item 5)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from hetslurm.cli.options import format_option, site_option, site_path
from hetslurm.cli.output import emit


@click.command("advise")
@site_option()
@click.option("--since", default="now-30d", show_default=True,
              help="Start: epoch, ISO 8601 or now-N{s,m,h,d}.")
@click.option("--until", default="now", show_default=True, help="End (exclusive).")
@click.option("--sacct-file", type=click.Path(dir_okay=False), default=None,
              help="Read accounting from this 'sacct --json' output instead of running sacct.")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Metrics store folder: GPU samples for the classification rules and the "
                   "GPU advice [default: none; without it, only runs that held no GPU "
                   "count as not using one].")
@click.option("--min-jobs", type=click.IntRange(2), default=3, show_default=True,
              help="Fewest runs of a model in a class for a speed ratio, and of a recurring "
                   "job for a classification rule.")
@click.option("--min-mem-jobs", type=click.IntRange(1), default=10, show_default=True,
              help="Fewest one-node runs with a measured MaxRSS for a class's default "
                   "memory.")
@click.option("--mem-quantile", type=click.FloatRange(0.5, 1.0), default=0.95,
              show_default=True, help="Quantile of the class's MaxRSS the default covers.")
@click.option("--mem-headroom", type=click.FloatRange(1.0, 4.0), default=1.2,
              show_default=True, help="Factor on that quantile (then rounded up to 256 MiB).")
@click.option("--classify-mode", type=click.Choice(["off", "suggest", "apply"]),
              default="suggest", show_default=True,
              help="The [classify] mode written when the site has no [classify] yet (a site "
                   "that has one keeps its mode).")
@click.option("--cpu-class", default=None,
              help="The CPU class classification rules point to [default: the site's only "
                   "CPU class].")
@click.option("--scripts/--no-scripts", "use_scripts", default=True, show_default=True,
              help="Tell recurring jobs apart by a hash of their stored batch script (as "
                   "`learn speeds` does); --no-scripts: by user and job name only.")
@click.option("--max-scripts", type=click.IntRange(0), default=5000, show_default=True,
              help="Most stored scripts read from accounting in one run.")
@click.option("--script-cache", type=click.Path(dir_okay=False), default=None,
              help="Where script hashes are cached [default: "
                   "$XDG_CACHE_HOME/hetslurm/script-hashes.json, else ~/.cache/...].")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the proposed site file here (atomically; not written when nothing "
                   "changes).")
@format_option
def advise_cmd(site_file: str | None, since: str, until: str, sacct_file: str | None,
               store: str | None, min_jobs: int, min_mem_jobs: int, mem_quantile: float,
               mem_headroom: float, classify_mode: str, cpu_class: str | None,
               use_scripts: bool, max_scripts: int, script_cache: str | None,
               out_path: str | None, output_format: str) -> None:
    """Propose a site file from what the site's jobs measured: review, apply, roll back.

    From one range of accounting (and the metrics store with --store) it proposes, each
    with its evidence as '#' comments above the table it changes:

    \b
      [classes.NAME] devices    class rankings from measured speeds (learn speeds --rank)
      [levers.speed]            the measured ratios (billing weights), when complete
      [classify] rules          recurring jobs whose runs never used a GPU -> the CPU class
      [classes.NAME] mem_per_node
                                p95 of the class's MaxRSS x 1.2, rounded up to 256 MiB;
                                the hook gives it to a job of the class asking no memory
      GPUs per run per class    advice comments only (no default is enforced)

    The whole file is checked by the site loader before it is written. A class with too
    few measured runs gets no proposal and a note; nothing to propose writes nothing (exit
    0). A measured GPU model the site lacks is an error (exit 2, nothing written).
    Rows: each change. docs/learn.md, "Advice".

    \b
    Example:
      hetslurm advise --since now-30d --out proposed.toml
      hetslurm site diff proposed.toml          # what applying it changes
      hetslurm site apply proposed.toml         # slurm.conf, QOS and the hook's rules
      hetslurm site rollback                    # back to before
    """
    from hetslurm.audit.advise import AdviseRequest, advise
    from hetslurm.cli.audit_cmd import time_range
    from hetslurm.site import load_site
    from hetslurm.site.render import write_rendered
    from hetslurm.textfile import read_text_file

    t0, t1 = time_range(since, until)
    path = site_path(site_file)
    site = load_site(path)
    text = read_text_file(path, what="site file")
    req = AdviseRequest(since=t0, until=t1, sacct_file=sacct_file, store=store,
                        min_jobs=min_jobs, min_mem_jobs=min_mem_jobs,
                        mem_quantile=mem_quantile, mem_headroom=mem_headroom,
                        classify_mode=classify_mode, cpu_class=cpu_class,
                        use_scripts=use_scripts, max_scripts=max_scripts,
                        script_cache=script_cache)
    adv = advise(req, site, text, str(path), dict(os.environ))
    doc = adv.to_dict()
    doc.update(since=t0, until=t1, out=out_path if adv.site_text is not None else None)
    emit([{"change": c} for c in adv.changes], output_format,
         title=f"advice from {adv.runs} measured GPU runs", document=doc)
    for note in adv.notes:
        click.echo(f"hetslurm advise: {note}", err=True)
    if adv.energy is not None:
        from hetslurm.audit.energy_advice import energy_notes

        for line in energy_notes(adv.energy):
            click.echo(f"hetslurm advise: {line}", err=True)
    for m in adv.memory:
        if m.note and m.runs:
            click.echo(f"hetslurm advise: class {m.wclass}: {m.note}", err=True)
    if adv.site_text is None:
        click.echo("hetslurm advise: nothing to propose (see the notes)"
                   + ("; nothing written" if out_path else ""), err=True)
        return
    if out_path:
        out = Path(out_path)
        write_rendered({out.name: adv.site_text}, out.parent or ".")
        click.echo(f"hetslurm advise: wrote {len(adv.changes)} change(s) to {out_path}; "
                   f"review with `hetslurm site diff {out_path}`", err=True)
