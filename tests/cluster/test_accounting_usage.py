"""What Slurm measures per job once ``[accounting]`` renders jobacct_gather/linux and
AccountingStoreFlags=job_script (issue 22, item 2): a job's CPU time, peak memory and bytes
read and written come back from sacct, and its batch script after it ended."""

from __future__ import annotations

import time

from _cluster_helpers import Jobs

from hetslurm.slurm import get_backend

MIB = 2**20
#: Longer than one JobAcctGatherFrequency (30 s) so at least one sample is taken while the
#: task runs: memory and IO are only seen in samples (CPU time comes from rusage).
SCRIPT = ("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; "
          "dd if=/dev/zero of=/tmp/hs-acct-$SLURM_JOB_ID bs=1M count=32 status=none; sync; "
          "cat /tmp/hs-acct-$SLURM_JOB_ID > /dev/null; rm -f /tmp/hs-acct-$SLURM_JOB_ID; "
          "sleep 36  # hs-acct-marker")


def test_sacct_carries_cpu_memory_io_and_the_script(slurm_env: dict[str, str],
                                                      jobs: Jobs) -> None:
    backend = get_backend("cli", env=slurm_env)
    job_id = int(jobs.sbatch("-p", "cpu", "-c", "1", script=SCRIPT))
    jobs.wait_state(str(job_id), {"COMPLETED"}, timeout=120)
    deadline = time.monotonic() + 30
    while True:  # slurmdbd records the end a moment after the job ends
        records = backend.accounting_jobs_by_id([job_id])
        usage = [records.usage(r) for r in records.raws]
        if (usage and usage[0].disk_write_bytes is not None) or time.monotonic() > deadline:
            break
        time.sleep(1)
    (u,) = usage
    assert u.job_id == job_id
    assert u.cpu_s > 0.05, u
    assert u.max_rss_mib is not None and u.max_rss_mib > 0, u
    assert u.disk_write_bytes is not None and u.disk_write_bytes >= 32 * MIB, u
    assert u.disk_read_bytes is not None and u.disk_read_bytes >= 32 * MIB, u
    script = backend.stored_batch_script(job_id)
    assert "hs-acct-marker" in script and script.startswith("#!")
