"""``hetslurm bench``: benchmarks that print JSON (they report; they do not assert)."""

from __future__ import annotations

import click

from hetslurm.cli.options import shipped_default, shipped_site_option, site_option, site_path
from hetslurm.cli.output import emit, format_option


@click.group()
def bench() -> None:
    """Benchmarks. Each prints its figures (use --format json for the record)."""


@bench.command("testbed")
@shipped_site_option("demo.toml", "demo site")
@click.option("--jobs", type=click.IntRange(1, 100_000), default=200, show_default=True,
              help="Held batch jobs to submit for the submit-rate figure.")
@format_option
def bench_testbed_cmd(site_file: str, jobs: int, output_format: str) -> None:
    """Boot a fresh testbed in a temporary folder and time it.

    Reports: up (cold, with MariaDB initialisation, and warm) until every node is idle;
    down until nothing is left running; sbatch submissions per second; the controller's
    own average time per submit (sdiag, REQUEST_SUBMIT_BATCH_JOB). Needs root.
    """
    from hetslurm.lab.bench_testbed import bench_testbed

    res = bench_testbed(site_file, jobs=jobs)
    emit([{"metric": k, "value": v} for k, v in res.items()], output_format,
         title="testbed benchmark", document=res)


@bench.command("audit")
@click.option("--jobs", "n_jobs", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Synthetic jobs (sacct --json form).")
@click.option("--samples", type=click.IntRange(1), default=10_000_000, show_default=True,
              help="Synthetic GPU samples (60 s interval).")
@click.option("--nodes", type=click.IntRange(2), default=1000, show_default=True,
              help="Synthetic 8-GPU nodes (half H100, half A100).")
@click.option("--real-jobs", type=click.IntRange(0), default=0, show_default=True,
              help="Also run this many 1-GPU jobs on the testbed ($SLURM_CONF) and compare "
                   "the audit with the per-job way (sacct -j and a store read per job).")
@site_option()
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where the synthetic data set is written (and removed) [default: $TMPDIR].")
@format_option
def bench_audit_cmd(n_jobs: int, samples: int, nodes: int, real_jobs: int,
                    site_file: str | None, workdir: str | None, output_format: str) -> None:
    """Time the audit on a synthetic month and, optionally, against the per-job way.

    Reports jobs, samples, seconds and peak_rss_mb of 'hetslurm audit' run in a child
    process (targets: 60 s, 4 GB), and with --real-jobs speedup_vs_per_job.
    """
    import os
    import tempfile
    from pathlib import Path

    from hetslurm.lab.bench_audit import bench_real, bench_synthetic

    def log(msg: str) -> None:
        click.echo(f"bench audit: {msg}", err=True)

    from hetslurm.site import load_site

    # The site of the testbed the real jobs run on: the one rule. Read before the minutes of
    # the synthetic run, so a bad or missing site file fails at once.
    site = load_site(site_path(site_file)) if real_jobs or site_file else None
    res = bench_synthetic(n_jobs, samples, nodes, workdir, log)
    res["speedup_vs_per_job"] = None
    if real_jobs and site is not None:
        with tempfile.TemporaryDirectory(prefix="hetslurm-bench-real-") as tmp:
            real = bench_real(dict(os.environ), site, real_jobs, Path(tmp), log)
        res.update(real)
    emit([{"metric": k, "value": v} for k, v in res.items()], output_format,
         title="audit benchmark", document=res)


@bench.command("learn")
@click.option("--jobs", "n_jobs", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Synthetic completed one-GPU runs (sacct --json form).")
@click.option("--groups", type=click.IntRange(1), default=20_000, show_default=True,
              help="Recurring jobs (user and job name) they belong to.")
@click.option("--nodes", type=click.IntRange(2), default=1000, show_default=True,
              help="Synthetic 8-GPU nodes (half H100, half A100).")
@click.option("--reference-runs", type=click.IntRange(0), default=2000, show_default=True,
              help="Runs the vectorised fit and its dense reference are compared on.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where the synthetic data set is written (and removed) [default: $TMPDIR].")
@format_option
def bench_learn_cmd(n_jobs: int, groups: int, nodes: int, reference_runs: int,
                    workdir: str | None, output_format: str) -> None:
    """Time 'hetslurm learn speeds' on a synthetic month, with and without script hashes.

    Reports, for each, seconds, peak_rss_mb, rows and the H100 ratio found (against the
    A100 reference; truth 2.0) of 'learn speeds --rank' run in a child process (target:
    60 s), and the vectorised fit
    beside the dense reference on --reference-runs runs.
    """
    from hetslurm.lab.bench_learn import bench_learn

    def log(msg: str) -> None:
        click.echo(f"bench learn: {msg}", err=True)

    res = bench_learn(n_jobs, nodes, groups, reference_runs, workdir, log)
    emit([{"metric": k, "value": v} for k, v in res.items()], output_format,
         title="learn speeds benchmark", document=res)


@bench.command("advise")
@click.option("--jobs", "n_jobs", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Synthetic completed one-GPU runs (sacct --json form, with MaxRSS).")
@click.option("--groups", type=click.IntRange(1), default=20_000, show_default=True,
              help="Recurring jobs (user and job name) they belong to.")
@click.option("--nodes", type=click.IntRange(2), default=1000, show_default=True,
              help="Synthetic 8-GPU nodes (half H100, half A100).")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where the synthetic data set is written (and removed) [default: $TMPDIR].")
@format_option
def bench_advise_cmd(n_jobs: int, groups: int, nodes: int, workdir: str | None,
                     output_format: str) -> None:
    """Time 'hetslurm advise --out' on the synthetic month of 'bench learn', with MaxRSS.

    Reports seconds and peak_rss_mb of the whole command in a child process (target: 60 s),
    the changes it proposed, the proposed 'train' order (truth: h100 first) and its
    proposed mem_per_node.
    """
    from hetslurm.lab.bench_learn import bench_advise

    def log(msg: str) -> None:
        click.echo(f"bench advise: {msg}", err=True)

    res = bench_advise(n_jobs, nodes, groups, workdir, log)
    emit([{"metric": k, "value": v} for k, v in res.items()], output_format,
         title="advise benchmark", document=res)


@bench.command("backend")
@click.option("--calls", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="Timed calls per operation and backend (after one untimed warm-up call).")
@click.option("--backends", default="cli,rest", show_default=True,
              help="Comma-separated backends to time (cli, rest).")
@format_option
def bench_backend_cmd(calls: int, backends: str, output_format: str) -> None:
    """Time the access layer's backends per call on the running cluster.

    Reads nodes, one node, jobs, one job and partitions, then changes a held job of its own
    (admin comment; release + hold) on each backend in turn, and reports one row per backend
    and operation: calls, p50_ms, p99_ms. The CLI backend spawns Slurm's commands; the REST
    backend talks to slurmrestd ($HETSLURM_REST_URL, $SLURM_JWT).

    \b
    Example, on the testbed:
      eval "$(hetslurm testbed env)"
      export SLURM_JWT=$(scontrol token lifespan=3600 | cut -d= -f2)
      hetslurm bench backend --calls 100 --format json
    """
    import os

    from hetslurm.lab.bench_backend import bench_backends

    names = tuple(b.strip() for b in backends.split(",") if b.strip())
    res = bench_backends(dict(os.environ), calls=calls, backends=names,
                         log=lambda m: click.echo(f"bench backend: {m}", err=True))
    emit(res["rows"], output_format, title="backend cost per call", document=res)


@bench.command("accounting")
@shipped_site_option("demo.toml", "demo site")
@click.option("--jobs", type=click.IntRange(1, 1000), default=16, show_default=True,
              help="One-core jobs run at once under each setting.")
@click.option("--seconds", type=click.IntRange(1, 3600), default=65, show_default=True,
              help="How long each job runs (65 s: two samples at the default 30 s).")
@click.option("--submits", type=click.IntRange(1, 100_000), default=200, show_default=True,
              help="Held submissions timed in slurmctld (sdiag) under each setting.")
@click.option("--slurm", "slurm_release", default=None,
              help="Slurm release of the testbeds (22.05, 24.11, 26.05) [default: the host's].")
@format_option
def bench_accounting_cmd(site_file: str, jobs: int, seconds: int, submits: int,
                         slurm_release: str | None, output_format: str) -> None:
    """What jobacct_gather/linux costs, against jobacct_gather/none, side by side.

    For each setting boots a testbed of its own (temporary folder; needs root), times the
    controller's submit path (sdiag, held jobs), then runs the jobs at once and adds up the
    CPU seconds of the testbed's slurmctld, slurmd and slurmstepd over that run. Rows: one
    per setting; the JSON adds ratio_linux_vs_none.
    """
    from hetslurm.lab.bench_accounting import bench_accounting

    res = bench_accounting(site_file, jobs=jobs, seconds=seconds, submits=submits,
                           slurm=slurm_release,
                           log=lambda m: click.echo(f"bench accounting: {m}", err=True))
    emit(res["rows"], output_format, title="jobacct_gather cost", document=res)


@bench.command("hook")
@shipped_site_option("demo.toml", "demo site")
@click.option("--calls", type=click.IntRange(100, 10_000_000), default=20_000, show_default=True,
              help="In-process calls for the typical p50/p99.")
@click.option("--no-testbed", is_flag=True, help="Only the in-process figures (no root needed).")
@click.option("--depths", default="0,1000,5000", show_default=True,
              help="Queue depths (held jobs) for the controller figures.")
@click.option("--jobs", type=click.IntRange(10, 10_000), default=100, show_default=True,
              help="Submissions per side in a measurement round.")
@click.option("--rounds", type=click.IntRange(1, 100), default=20, show_default=True,
              help="Rounds per depth; within a round the #HET job and the plain job alternate "
                   "submission by submission; the ratio is that of the two jobs' mean "
                   "submit times over all rounds.")
@click.option("--plugin-reference/--no-plugin-reference", default=True, show_default=True,
              help="Also time the plain job with no job_submit plugin at all (slurmctld "
                   "restarted without JobSubmitPlugins=lua, between two blocks with the "
                   "hook): what job_submit/lua itself costs.")
@format_option
def bench_hook_cmd(site_file: str, calls: int, no_testbed: bool, depths: str, jobs: int,
                   rounds: int, plugin_reference: bool, output_format: str) -> None:
    """Time the job_submit hook: per call in-process (typical p50/p99, the slowest case of the
    hostile corpus) and slurmctld's mean submit time from sdiag with and without it at several
    queue depths (each submission timed on its own, the two jobs alternating), plus the
    corpus's worst script with the hook enforcing and switched off, on a fresh testbed in a
    temporary folder (needs root).
    """
    from hetslurm.lab.bench_hook import bench_hook
    from hetslurm.testbed.cluster import default_site

    try:
        depth_list = tuple(int(d) for d in depths.split(",") if d.strip())
    except ValueError as e:
        raise click.BadParameter(f"--depths: {e}") from e
    res = bench_hook(site_file or default_site(), calls=calls, testbed=not no_testbed,
                     depths=depth_list, jobs_per_round=jobs, rounds=rounds,
                     log=lambda m: click.echo(m, err=True), plugin_reference=plugin_reference)
    rows = [{"metric": k, "value": v} for k, v in res.items()
            if k not in ("depths", "adversarial_ms", "plugin_reference", "worst_case")]
    rows += [{"metric": f"depth {d['pending']}", "value":
              f"with {d['with_hook_us']} us, without {d['without_hook_us']} us, "
              f"ratio {d['ratio']}"
              + (f"; hook's Lua {d['with_hook_lua_us']} / {d['without_hook_lua_us']} us per call"
                 if "with_hook_lua_us" in d else "")} for d in res["depths"]]
    worst = res.get("worst_case")
    if worst:
        rows.append({"metric": f"worst case in slurmctld ({worst['case']})", "value":
                     f"with the hook {worst['with_hook_us']} us, switched off "
                     f"{worst['hook_off_us']} us: {worst['extra_ms']} ms more"})
    ref = res.get("plugin_reference")
    if ref:
        rows.append({"metric": "no job_submit plugin (depth 0)", "value":
                     f"{ref['no_plugin_us']} us; the plain job through the hook "
                     f"{ref['plugin_plain_us']} us ({ref['plugin_ratio']}x), the #HET job "
                     f"{ref['plugin_het_us']} us ({ref['total_ratio']}x)"})
    emit(rows, output_format, title="hook benchmark", document=res)


@bench.command("placement")
@click.option("--sizes", default="1000,10000", show_default=True,
              help="Synthetic cluster sizes (nodes), comma-separated.")
@click.option("--no-alibaba", is_flag=True,
              help="Skip the Alibaba node inventory ($HETSLURM_TRACES).")
@click.option("--calls", type=click.IntRange(100, 1_000_000), default=5000, show_default=True,
              help="place() calls per cluster for p50/p99.")
@click.option("--reference-calls", type=click.IntRange(1, 10_000), default=20,
              show_default=True, help="Calls of the plain-Python implementation (slow).")
@click.option("--batch", "batch_jobs", type=click.IntRange(1, 1_000_000), default=10_000,
              show_default=True, help="Requests in the batch (place_batch) measurement.")
@format_option
def bench_placement_cmd(sizes: str, no_alibaba: bool, calls: int, reference_calls: int,
                        batch_jobs: int, output_format: str) -> None:
    """Time the placement core: p50/p99 of place() from Python and of the plain-Python
    implementation, a batch, peak memory; on synthetic half-loaded clusters and the real
    Alibaba node inventory (docs/placement.md, "Benchmark"). Each cluster runs in its own
    process. Reports figures; asserts nothing.
    """
    from hetslurm.lab.bench_placement import bench_placement

    try:
        size_list = tuple(int(s) for s in sizes.split(",") if s.strip())
    except ValueError as e:
        raise click.BadParameter(f"--sizes: {e}") from e
    res = bench_placement(size_list, alibaba=not no_alibaba, calls=calls,
                          reference_calls=reference_calls, batch_jobs=batch_jobs,
                          log=lambda m: click.echo(f"bench placement: {m}", err=True))
    cols = ("name", "nodes", "p50_us", "p99_us", "kernel_p50_us", "reference_p50_us",
            "speedup", "batch_jobs", "batch_s", "peak_rss_mb")
    emit([{c: r.get(c) for c in cols} for r in res["results"]], output_format,
         title="placement benchmark", document=res)


@bench.command("simulate")
@shipped_site_option("case-study.toml", "case study")
@click.option("--params", "params_file", type=click.Path(dir_okay=False),
              default=shipped_default("simulate-params.toml"),
              help="Simulator assumptions [default: the shipped simulate-params.toml].")
@click.option("--jobs", "limit", type=click.IntRange(1), default=None,
              help="First N jobs of each trace [default: all].")
@click.option("--load", "load_specs", multiple=True, metavar="TRACE=LOAD",
              help="Replay TRACE (alibaba, philly) at LOAD instead of its default "
                   "(repeat for several loads).")
@click.option("--backfill", "backfills", multiple=True, type=click.Choice(["easy", "slurm"]),
              help="Backfill model to time (repeat for both) [default: easy and slurm].")
@format_option
def bench_simulate_cmd(site_file: str, params_file: str, limit: int | None,
                       load_specs: tuple[str, ...], backfills: tuple[str, ...],
                       output_format: str) -> None:
    """Replay speed of `hetslurm simulate` per policy and backfill model on the Alibaba and
    Philly traces.

    JSON entries: trace, policy, backfill, load, jobs, dropped, seconds, jobs_per_s,
    mean_queue_depth, scheduling_passes, reservations, core_calls, core_builds
    (docs/simulate.md). Target: the whole Philly trace with EASY backfill within 60 s per
    policy.
    """
    from hetslurm.lab.bench_simulate import bench_simulate
    from hetslurm.simulate.params import load_params
    from hetslurm.site.load import load_site

    loads: dict[str, list[float]] = {}
    for spec in load_specs:
        name, sep, value = spec.partition("=")
        try:
            loads.setdefault(name.strip(), []).append(float(value))
        except ValueError:
            sep = ""
        if not sep:
            raise click.BadParameter(f"{spec!r} is not TRACE=LOAD", param_hint="--load")
    rows = bench_simulate(load_site(site_file), load_params(params_file),
                          policies=("slurm-default", "hetslurm"), limit=limit,
                          loads=loads or None, backfills=backfills or ("easy", "slurm"))
    emit(rows, output_format, title="simulate benchmark", document=rows)


@bench.command("rebalance")
@click.option("--jobs", type=click.IntRange(1), default=10_000, show_default=True,
              help="Running 1-GPU jobs, each with an hour of samples.")
@click.option("--interval", "interval_s", type=click.FloatRange(1.0, 3600.0), default=30.0,
              show_default=True, help="Seconds between samples (the collector's interval).")
@click.option("--segments-per-node", type=click.IntRange(1, 360), default=12,
              show_default=True,
              help="Store segments per node for the hour (12: the collector's 5-minute "
                   "flush; 1: the hour compacted).")
@click.option("--nodes", type=click.IntRange(2), default=None,
              help="8-GPU nodes [default: enough for the jobs with a quarter to spare].")
@click.option("--pending", type=click.IntRange(0), default=1000, show_default=True,
              help="Pending jobs (half of them relaxable #HET energy=low jobs).")
@click.option("--per-job-sample", type=click.IntRange(1), default=300, show_default=True,
              help="Jobs the per-job way is timed on (then scaled to all).")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where the synthetic state is written (and removed) [default: $TMPDIR].")
@format_option
def bench_rebalance_cmd(jobs: int, interval_s: float, segments_per_node: int,
                        nodes: int | None, pending: int, per_job_sample: int,
                        workdir: str | None, output_format: str) -> None:
    """Time one dry-run `hetslurm rebalance` pass on a synthetic cluster.

    The state (docs/act.md#benchmark): JOBS running 1-GPU jobs on 8-GPU nodes, an hour of
    samples each, pending #HET jobs; the pass runs every phase in a child process.
    Reports jobs, seconds (target 10), peak_rss_mb, phase_seconds and speedup against the
    per-job way (one metrics store read per job, timed on a sample and scaled), and
    relax_batch: every pending job's relax plan the sequential and the batch way side by
    side (batch_s, sequential_s, ratio, threads; target: batch <= 1 s and faster), failing
    if they decide differently.
    """
    from hetslurm.lab.bench_rebalance import bench_rebalance

    def log(msg: str) -> None:
        click.echo(f"bench rebalance: {msg}", err=True)

    try:
        res = bench_rebalance(jobs, nodes=nodes, interval_s=interval_s,
                              segments_per_node=segments_per_node, pending=pending,
                              per_job_sample=per_job_sample, workdir=workdir, log=log)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    emit([{"metric": k, "value": v} for k, v in res.items()], output_format,
         title="rebalance benchmark", document=res)
