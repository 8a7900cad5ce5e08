"""The hostile script corpus's live subset (at most 200 scripts, its largest included) through
sbatch and the real slurmctld: each gets the outcome the in-process run gives it, exactly.

Issue 18: what the hook decides for a 4 MB flood of short lines, a header walked to its cap,
a directive past 4 MB or behind a code line must be what slurmctld then does.
"""

from __future__ import annotations

import re
from pathlib import Path

from _cluster_helpers import Jobs
from test_hook_cluster import show

from hetslurm.lab import hostile
from hetslurm.process import run_command

FIELD_SHOWN = {"tres_per_node": "TresPerNode", "features": "Features", "partition": "Partition"}


def test_live_subset_gets_the_corpus_outcomes(jobs: Jobs, tmp_path: Path) -> None:
    subset = hostile.live_subset(hostile.cases())
    assert 50 <= len(subset) <= 200
    failures: list[str] = []
    path = tmp_path / "job.sh"
    for case in subset:
        assert case.script is not None
        path.write_text(case.script)
        res = run_command(["sbatch", "--hold", "--parsable", "-o", "/dev/null", str(path)],
                          timeout=120, env=jobs.env, check=False)
        if case.kind == "reject":
            if res.returncode == 0:
                jobs.ids.append(res.stdout.strip().split(";")[0])
                failures.append(f"{case.name}: accepted, expected {case.expect!r}")
            elif f"sbatch: error: {case.expect}" not in res.stderr.splitlines():
                failures.append(f"{case.name}: {res.stderr.strip()[:300]!r}")
            continue
        if res.returncode != 0:
            failures.append(f"{case.name}: refused: {res.stderr.strip()[:300]!r}")
            continue
        job_id = res.stdout.strip().split(";")[0]
        jobs.ids.append(job_id)
        fields = show(jobs, job_id)
        has_record = re.search(r"AdminComment=\S*hetslurm:\{", fields["_raw"]) is not None
        if case.kind == "unchanged":
            if has_record or f"{jobs.gres}gpu" in fields.get("TresPerNode", ""):
                failures.append(f"{case.name}: changed: {fields['_raw'][:300]}")
            continue
        # The corpus says what 22.05 shows; from 24.11 a gres is named "gres/...".
        want = {f: v.replace("gres:", jobs.gres) if isinstance(v, str) else v
                for f, v in case.expect.items()}
        wrong = {f: fields.get(FIELD_SHOWN[f]) for f, v in want.items()
                 if fields.get(FIELD_SHOWN[f]) != v}
        if wrong or not has_record:
            failures.append(f"{case.name}: {wrong or 'no record'}, expected {case.expect}")
    path.unlink(missing_ok=True)
    assert not failures, f"{len(failures)} of {len(subset)}:\n" + "\n".join(failures[:15])
    # Nothing went wrong inside the hook: a failure there fails open with an error log line.
    log = Path(run_command(["scontrol", "show", "config"], timeout=30, env=jobs.env).stdout
               .split("SlurmctldLogFile", 1)[1].split("=", 1)[1].split()[0])
    assert "hetslurm: internal error" not in log.read_text(errors="replace")
