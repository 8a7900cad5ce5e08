"""The slurmrestd backend: reads and job changes over HTTP with a JWT, the rest through the CLIs.

slurmrestd answers in the same data_parser schema the CLIs print with ``--json=v0.0.42``, so
its documents go through the parsers of :mod:`hetslurm.slurm.parse` (one reader per schema).
What it does over REST, and the path it uses (checked against the OpenAPI document the
server itself serves, :func:`missing_operations`):

========================  ====================================================
``nodes`` / ``node``      ``GET /slurm/v0.0.42/nodes/``, ``.../node/{name}``
``jobs`` / ``job``        ``GET /slurm/v0.0.42/jobs/``, ``.../job/{id}``
``partitions``            ``GET /slurm/v0.0.42/partitions/``
``update_job``            ``POST /slurm/v0.0.42/job/{id}`` (job_desc_msg fields)
``hold`` / ``release``    the same POST with ``{"hold": true|false}``
``cancel``                ``DELETE /slurm/v0.0.42/job/{id}``
``ping``                  ``GET /slurm/v0.0.42/ping/``
========================  ====================================================

Everything else (``submit``, ``requeue``, ``requeue_hold``, node state changes, accounting,
``sdiag``, ``sacctmgr``) stays on the CLI path of :class:`CliBackend`, which this class
extends: the API has no requeue, and submitting through it would bypass ``sbatch``'s own
reading of ``#SBATCH`` lines (docs/slurm-access.md, "REST").

The server is ``HETSLURM_REST_URL`` (``http://host:port``); the token is ``SLURM_JWT``, what
``scontrol token`` prints. One HTTP/1.1 connection is kept open and reused.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Unpack

from hetslurm.errors import BackendError
from hetslurm.slurm import parse
from hetslurm.slurm.backend import (
    JobChanges,
    JobInfo,
    JobRef,
    NodeInfo,
    NotFoundError,
    PartitionInfo,
)
from hetslurm.slurm.cli_backend import CliBackend

#: Where slurmrestd listens (``http://host:port``).
REST_URL_ENV = "HETSLURM_REST_URL"
#: The token ``scontrol token`` prints; Slurm's own name for it.
JWT_ENV = "SLURM_JWT"
#: The API version read and written: the data_parser the CLIs print on 24.11 and 26.05.
API = "v0.0.42"
#: Slurm's "Invalid job id specified".
ESLURM_INVALID_JOB_ID = 2017
#: Slurm's "Protocol authentication error" (a token it cannot verify, or expired).
ESLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
DEFAULT_TIMEOUT_S = 30.0


class RestError(BackendError):
    """slurmrestd could not be reached, or answered with an error (exit 4)."""


class RestAuthError(RestError):
    """slurmrestd or slurmctld refused the token: missing, expired, or signed with another
    key (exit 4)."""


@dataclass(frozen=True)
class Operation:
    """One REST call the backend makes: method, path template and the body fields it sets."""

    method: str
    path: str
    fields: tuple[str, ...] = ()


#: Every call this backend makes, for :func:`missing_operations`.
OPERATIONS: dict[str, Operation] = {
    "nodes": Operation("GET", f"/slurm/{API}/nodes/"),
    "node": Operation("GET", f"/slurm/{API}/node/{{node_name}}"),
    "jobs": Operation("GET", f"/slurm/{API}/jobs/"),
    "job": Operation("GET", f"/slurm/{API}/job/{{job_id}}"),
    "partitions": Operation("GET", f"/slurm/{API}/partitions/"),
    "update_job": Operation("POST", f"/slurm/{API}/job/{{job_id}}", (
        "tres_per_node", "constraints", "prefer", "required_switches", "wait_for_switch",
        "partition", "required_nodes", "admin_comment", "hold")),
    "cancel": Operation("DELETE", f"/slurm/{API}/job/{{job_id}}"),
    "ping": Operation("GET", f"/slurm/{API}/ping/"),
}


def missing_operations(openapi: Mapping[str, Any]) -> list[str]:
    """What :data:`OPERATIONS` uses that the server's OpenAPI document lacks (path, method,
    or a body field of the request schema), as readable lines; empty when all is served."""
    paths = openapi.get("paths") or {}
    schemas = (openapi.get("components") or {}).get("schemas") or {}
    out = []
    for name, op in OPERATIONS.items():
        entry = paths.get(op.path)
        if not isinstance(entry, Mapping) or op.method.lower() not in entry:
            out.append(f"{name}: {op.method} {op.path} is not served")
            continue
        if not op.fields:
            continue
        body = (entry[op.method.lower()].get("requestBody") or {}).get("content") or {}
        ref = ((body.get("application/json") or {}).get("schema") or {}).get("$ref", "")
        props = (schemas.get(ref.rsplit("/", 1)[-1]) or {}).get("properties") or {}
        out += [f"{name}: field {f!r} is not in {ref or 'the request schema'}"
                for f in op.fields if f not in props]
    return out


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT (not verified: slurmctld verifies; this only reads ``sun`` and
    ``exp`` for the user header and a clear message before the call)."""
    try:
        payload = token.split(".")[1]
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(raw)
    except (IndexError, ValueError) as exc:
        raise RestAuthError(f"{JWT_ENV} is not a JWT (scontrol token prints one)") from exc
    if not isinstance(claims, dict):
        raise RestAuthError(f"{JWT_ENV} is not a JWT (scontrol token prints one)")
    return claims


class RestBackend(CliBackend):
    """slurmrestd for reads and job changes, the CLIs for the rest (module docstring)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = 120.0, *,
                 url: str | None = None, token: str | None = None,
                 request_timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(env, timeout=timeout)
        merged = {**os.environ, **(env or {})}
        url = url or merged.get(REST_URL_ENV)
        if not url:
            raise RestError(f"--backend rest needs {REST_URL_ENV} (slurmrestd's http://host:port)")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise RestError(f"{REST_URL_ENV}={url!r}: only http://host:port is supported "
                            "(slurmrestd on loopback or behind a TLS proxy)")
        self.url = url.rstrip("/")
        self._host, self._port = parts.hostname, parts.port or 80
        self._prefix = parts.path.rstrip("/")
        token = token or merged.get(JWT_ENV)
        if not token:
            raise RestAuthError(f"--backend rest needs {JWT_ENV}: run `scontrol token` and "
                                "export what it prints")
        self._token = token
        claims = token_claims(token)
        self._user = claims.get("sun") if isinstance(claims.get("sun"), str) else None
        self._exp = claims.get("exp") if isinstance(claims.get("exp"), int) else None
        self._request_timeout = request_timeout
        self._conn: http.client.HTTPConnection | None = None
        self._threads: dict[str, int] | None = None
        self._default: str | None = None

    # ------------------------------------------------------------------ transport
    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _request(self, op: str, *, body: Mapping[str, Any] | None = None,
                 query: Mapping[str, str] | None = None, ok404: bool = False,
                 **path_args: str) -> dict[str, Any]:
        if self._exp is not None and self._exp < time.time():
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._exp))
            raise RestAuthError(f"{JWT_ENV} expired at {when}; get a new one with "
                                "`scontrol token`")
        spec = OPERATIONS[op]
        path = self._prefix + spec.path.format(
            **{k: urllib.parse.quote(v, safe="") for k, v in path_args.items()})
        if query:
            path += "?" + urllib.parse.urlencode(query)
        headers = {"X-SLURM-USER-TOKEN": self._token, "Accept": "application/json"}
        if self._user:
            headers["X-SLURM-USER-NAME"] = self._user
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        status, text = self._send(spec.method, path, data, headers)
        if status in (401, 403, 511):
            raise RestAuthError(f"slurmrestd at {self.url} refused the token (HTTP {status}): "
                                f"expired, or signed with another key; get a new one with "
                                "`scontrol token`")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            doc = None
        if status == 404 and not isinstance(doc, dict):
            # Not a missing object (that comes as a JSON document): the path is not served.
            raise RestError(f"slurmrestd at {self.url} does not serve {API} (Slurm 22.05's "
                            "serves v0.0.36-38 only; its /openapi/v3 lists what it has): use "
                            "--backend cli")
        if status == 404 and ok404:
            return {}
        if not isinstance(doc, dict):
            raise RestError(f"slurmrestd at {self.url}: HTTP {status} for {spec.method} {path} "
                            f"with no JSON document: {text[:160]!r}")
        errors = doc.get("errors") or []
        for err in errors if isinstance(errors, list) else ():
            num = err.get("error_number") if isinstance(err, Mapping) else None
            if num == ESLURM_PROTOCOL_AUTHENTICATION_ERROR:
                raise RestAuthError(f"slurmctld refused the token slurmrestd passed on "
                                    f"({err.get('error')}): expired, or signed with another "
                                    "key; get a new one with `scontrol token`")
            if num == ESLURM_INVALID_JOB_ID and "job_id" in path_args:
                raise NotFoundError(f"job {path_args['job_id']} not found")
        if status >= 400 or errors:
            what = "; ".join(
                ": ".join(str(e[k]) for k in ("description", "error") if e.get(k))
                for e in errors if isinstance(e, Mapping)) or f"HTTP {status}"
            raise RestError(f"slurmrestd {spec.method} {path}: {what}")
        return doc

    def _send(self, method: str, path: str, data: bytes | None,
              headers: Mapping[str, str]) -> tuple[int, str]:
        # One retry on a fresh connection: slurmrestd may close an idle keep-alive one.
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self._request_timeout)
            try:
                self._conn.request(method, path, body=data, headers=dict(headers))
                resp = self._conn.getresponse()
                text = resp.read().decode(errors="replace")
                if resp.getheader("Connection", "").lower() == "close":
                    self.close()
                return resp.status, text
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as exc:
                self.close()
                if attempt:
                    raise RestError(f"slurmrestd at {self.url} closed the connection: "
                                    f"{exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                why = "timed out" if isinstance(exc, socket.timeout | TimeoutError) else str(exc)
                raise RestError(f"slurmrestd at {self.url} is unreachable: {why}") from exc
        raise AssertionError("unreachable")

    def openapi(self) -> dict[str, Any]:
        """The OpenAPI document the server serves (``/openapi/v3``)."""
        headers = {"X-SLURM-USER-TOKEN": self._token}
        status, text = self._send("GET", self._prefix + "/openapi/v3", None, headers)
        if status != 200:
            raise RestError(f"slurmrestd at {self.url}: /openapi/v3 answered HTTP {status}")
        return parse.load_json_document(text, what="slurmrestd /openapi/v3")

    # ------------------------------------------------------------------ reading
    def nodes(self) -> list[NodeInfo]:
        doc = self._request("nodes")
        nodes = parse.parse_sinfo_json(json.dumps(doc), what=f"REST {OPERATIONS['nodes'].path}")
        self._threads = {n.name: n.threads_per_core or 1 for n in nodes}
        return nodes

    def node(self, name: str) -> NodeInfo:
        try:
            doc = self._request("node", node_name=name, ok404=True)
        except RestAuthError:
            raise
        except RestError as exc:
            # An unknown name: HTTP 200, no nodes, "Failure to query node <name>".
            if f"Failure to query node {name}" in str(exc):
                raise NotFoundError(f"node '{name}' not found") from None
            raise
        found = [n for n in parse.parse_sinfo_json(json.dumps(doc or {"nodes": []}),
                                                    what="REST node") if n.name == name]
        if not found:
            raise NotFoundError(f"node '{name}' not found")
        return found[0]

    def _node_threads(self) -> dict[str, int]:
        if self._threads is None:
            self.nodes()
        assert self._threads is not None
        return self._threads

    def _jobs_from(self, doc: Mapping[str, Any]) -> list[JobInfo]:
        raw = doc.get("jobs") or []
        jobs = parse.parse_squeue_json(json.dumps(doc))
        threads = self._node_threads() if any(j.nodes for j in jobs) else {}
        return [parse.with_core_cpu_ids(j, r, threads) for j, r in zip(jobs, raw, strict=True)]

    def jobs(self) -> list[JobInfo]:
        # /jobs/ lists every job the controller holds, finished ones included, as 22.05's
        # squeue --json did (the CLI backend's contract).
        return self._jobs_from(self._request("jobs"))

    def job(self, job_id: JobRef) -> JobInfo:
        ref = str(job_id)
        doc = self._request("job", job_id=ref, ok404=True)
        found = self._jobs_from(doc) if doc else []
        pick = next((j for j in found if j.display_id == ref or str(j.job_id) == ref),
                    found[0] if found else None)
        if pick is None:
            raise NotFoundError(f"job {ref} not found")
        return pick

    def partitions(self) -> list[PartitionInfo]:
        parts = parse.parse_partitions_json(json.dumps(self._request("partitions")))
        default = self._default_partition()
        return [replace(p, default=p.name == default) for p in parts]

    def _default_partition(self) -> str | None:
        """The Default=YES partition. data_parser v0.0.42 has no such flag, so it is read
        once per backend from ``scontrol show partition`` (it changes only with
        slurm.conf)."""
        if self._default is None:
            found = [p.name for p in super().partitions() if p.default]
            self._default = found[0] if found else ""
        return self._default or None

    def ping(self) -> str | None:
        try:
            doc = self._request("ping")
        except RestError as exc:
            return str(exc)
        pings = doc.get("pings") or []
        up = [p for p in pings if isinstance(p, Mapping)
              and str(p.get("pinged", "")).upper() in ("UP", "RESPONDING")]
        return None if up else f"slurmrestd: no controller answers ({pings})"

    # ------------------------------------------------------------------ changing
    def update_job(self, job_id: JobRef, **changes: Unpack[JobChanges]) -> None:
        change = self._check_update(changes)
        body: dict[str, Any] = {}
        release = self.slurm_release
        if (tres := change.get("tres_per_node")) is not None:
            body["tres_per_node"] = ",".join(
                f"{release.gres_prefix}{it.to_slurm()}" for it in tres)
        if (features := change.get("features")) is not None:
            body["constraints"] = features
        if (prefer := change.get("prefer")) is not None:
            body["prefer"] = prefer
        if (switches := change.get("switches")) is not None:
            body["required_switches"] = {"set": True, "infinite": False,
                                         "number": switches.count}
            if switches.max_wait_s is not None:
                body["wait_for_switch"] = switches.max_wait_s
        if (partition := change.get("partition")) is not None:
            body["partition"] = partition
        if (nodelist := change.get("nodelist")) is not None:
            body["required_nodes"] = list(nodelist)
        if (admin_comment := change.get("admin_comment")) is not None:
            body["admin_comment"] = admin_comment
        if body:
            self._request("update_job", body=body, job_id=str(job_id))

    def hold(self, job_id: JobRef) -> None:
        self._request("update_job", body={"hold": True}, job_id=str(job_id))

    def release(self, job_id: JobRef) -> None:
        self._request("update_job", body={"hold": False}, job_id=str(job_id))

    def cancel(self, job_id: JobRef) -> None:
        doc = self._request("cancel", job_id=str(job_id))
        for st in doc.get("status") or []:
            err = st.get("error") if isinstance(st, Mapping) else None
            code = err.get("code") if isinstance(err, Mapping) else None
            if code == ESLURM_INVALID_JOB_ID:
                raise NotFoundError(f"job {job_id} not found")
            if code and isinstance(err, Mapping):
                raise RestError(f"slurmrestd: cancelling job {job_id}: {err.get('string')}")

    def cancel_jobs(self, job_ids: Sequence[JobRef]) -> None:
        for j in job_ids:
            try:
                self.cancel(j)
            except NotFoundError:
                continue  # scancel of many ids also skips the ones gone meanwhile


__all__ = ["API", "JWT_ENV", "OPERATIONS", "REST_URL_ENV", "RestAuthError", "RestBackend",
           "RestError", "missing_operations", "token_claims"]
