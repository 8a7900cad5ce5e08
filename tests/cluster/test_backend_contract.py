"""The backend contract (tests/_backend_contract.py) on the real testbed: the CLI backend and
the REST backend (slurmrestd with a JWT from ``scontrol token``) answer alike, and every REST
call the backend makes is in the OpenAPI document the testbed's own slurmrestd serves."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from _backend_contract import CHECKS, check_job_lifecycle
from _cluster_helpers import Jobs, release_under_test

from hetslurm.slurm import SlurmBackend, get_backend
from hetslurm.slurm.rest_backend import RestAuthError, RestBackend, RestError, missing_operations
from hetslurm.testbed import Testbed

#: The release the session's testbed runs (what conftest's fixture brings up).
RELEASE = release_under_test()
#: Where the release's slurmrestd serves the API the REST backend speaks (not 22.05).
REST = RELEASE.rest_api is not None


@pytest.fixture(scope="module")
def rest_env(testbed: Testbed, slurm_env: dict[str, str]) -> dict[str, str]:
    return {**slurm_env, **testbed.rest_env(lifespan_s=3600)}


@pytest.fixture(params=["cli", "rest"] if REST else ["cli"])
def backend(request: pytest.FixtureRequest, slurm_env: dict[str, str],
            rest_env: dict[str, str]) -> Iterator[SlurmBackend]:
    b = get_backend(request.param, env=rest_env if request.param == "rest" else slurm_env)
    yield b
    if isinstance(b, RestBackend):
        b.close()


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_contract(backend: SlurmBackend, name: str) -> None:
    check: Callable[[SlurmBackend], None] = CHECKS[name]
    check(backend)


def test_contract_job_lifecycle(backend: SlurmBackend, jobs: Jobs) -> None:
    # Typed: 22.05 refuses to turn an untyped gres request into a typed one.
    job_id = int(jobs.sbatch("-H", "-p", "gpu", "--gres=gpu:a100:1"))
    check_job_lifecycle(backend, job_id)


def _rest_reads_what_the_cli_reads(slurm_env: dict[str, str], rest_env: dict[str, str],
                                       jobs: Jobs) -> None:
    cli, rest = get_backend("cli", env=slurm_env), get_backend("rest", env=rest_env)
    running = int(jobs.sbatch("-p", "gpu", "--gres=gpu:h100:2", "-c", "2", script="sleep 60"))
    from _backend_contract import wait_job
    wait_job(cli, running, lambda j: j.state == "RUNNING", "the start")
    assert rest.nodes() == cli.nodes()
    assert rest.partitions() == cli.partitions()
    by_id = {j.job_id: j for j in cli.jobs()}
    for job in rest.jobs():
        assert job == by_id[job.job_id], job.job_id
    # CPU ids from job_resources equal scontrol -d's CPU_IDs.
    assert rest.job(running).cpu_ids == cli.job(running).cpu_ids != {}


def _rest_serves_every_operation(rest_env: dict[str, str]) -> None:
    rest = get_backend("rest", env=rest_env)
    assert isinstance(rest, RestBackend)
    assert missing_operations(rest.openapi()) == []
    assert rest.ping() is None


def _rest_refuses_bad_tokens(testbed: Testbed, rest_env: dict[str, str]) -> None:
    url = rest_env["HETSLURM_REST_URL"]
    # Expired: scontrol's shortest lifespan, read after it ran out.
    short = testbed.slurm().token(lifespan_s=1)
    import time
    time.sleep(2.5)
    with pytest.raises(RestAuthError, match="expired"):
        RestBackend(rest_env, url=url, token=short).nodes()
    # Signed with another key: the same claims, another signature.
    head, claims, _sig = rest_env["SLURM_JWT"].split(".")
    forged = f"{head}.{claims}.c2lnbmVkLXdpdGgtYW5vdGhlci1rZXk"
    with pytest.raises(RestAuthError, match="refused the token"):
        RestBackend(rest_env, url=url, token=forged).nodes()
    # Nothing listens there.
    with pytest.raises(RestError, match="unreachable"):
        RestBackend(rest_env, url="http://127.0.0.1:9", token=rest_env["SLURM_JWT"]).nodes()


def _rest_refused_on_22_05(rest_env: dict[str, str]) -> None:
    """22.05's slurmrestd runs (JWT and all) but serves v0.0.36-38 only: one clear line."""
    rest = get_backend("rest", env=rest_env)
    with pytest.raises(RestError, match=r"does not serve v0\.0\.42.*--backend cli"):
        rest.nodes()
    with pytest.raises(RestError, match="does not serve"):
        rest.job(1)


# Each release gets the tests that apply to it (no skips): the REST checks where the release
# serves v0.0.42, the refusal where it does not.
if REST:
    test_rest_reads_what_the_cli_reads = _rest_reads_what_the_cli_reads
    test_rest_serves_every_operation = _rest_serves_every_operation
    test_rest_refuses_bad_tokens = _rest_refuses_bad_tokens
else:
    test_rest_refused_on_22_05 = _rest_refused_on_22_05


def _status_same_through_rest(rest_env: dict[str, str], jobs: Jobs) -> None:
    """A user's view: ``hetslurm status`` and a ``rebalance`` dry run read the same cluster
    through REST as through the CLIs."""
    import json

    from click.testing import CliRunner

    from hetslurm.cli import cli

    jobs.sbatch("-H", "-p", "gpu", "--gres=gpu:a100:1")
    env = {k: rest_env[k] for k in ("SLURM_CONF", "PATH", "HETSLURM_REST_URL", "SLURM_JWT",
                                    "HETSLURM_TESTBED_DIR", "HETSLURM_ETC") if k in rest_env}
    docs = {}
    for name in ("cli", "rest"):
        res = CliRunner(env=env).invoke(cli, ["status", "--backend", name, "--format", "json"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        doc.pop("time", None)
        docs[name] = doc
    assert docs["rest"] == docs["cli"]
    res = CliRunner(env=env).invoke(cli, ["rebalance", "--backend", "rest", "--format", "json",
                                          "--only", "relax"])
    assert res.exit_code in (0, 9), res.output


if REST:
    test_status_same_through_rest = _status_same_through_rest
