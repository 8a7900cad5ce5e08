"""The REST backend against a scripted HTTP server (no Slurm): requests it sends, how it
reads answers, and one clear error for each way slurmrestd can fail. The real slurmrestd is
tests/cluster/test_backend_contract.py."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.slurm import GresItem, NotFoundError, Switches
from hetslurm.slurm.rest_backend import (
    OPERATIONS,
    RestAuthError,
    RestBackend,
    RestError,
    missing_operations,
    token_claims,
)


def jwt(**claims: Any) -> str:
    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")
    return f"{b64({'alg': 'HS256', 'typ': 'JWT'})}.{b64(claims)}.c2ln"


TOKEN = jwt(sun="alice", exp=int(time.time()) + 3600, iat=int(time.time()))
META = {"plugin": {"type": "openapi/slurmctld", "data_parser": "data_parser/v0.0.42"}}


class Server:
    """Answers each (method, path) from ``routes``; records every request."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], tuple[int, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                server.requests.append({"method": self.command, "path": self.path,
                                        "headers": dict(self.headers), "body": body})
                status, doc = server.routes.get((self.command, self.path.split("?")[0]),
                                                (404, "Unable find requested URL."))
                text = doc if isinstance(doc, str) else json.dumps(doc)
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def ok(self, method: str, op: str, doc: dict[str, Any], **args: str) -> None:
        path = OPERATIONS[op].path.format(**args)
        self.routes[(method, path)] = (200, {"meta": META, "errors": [], "warnings": [], **doc})


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()


@pytest.fixture
def rest(server: Server) -> Iterator[RestBackend]:
    b = RestBackend({}, url=server.url, token=TOKEN)
    # The CLI half (gres prefix) is asked of scontrol; here the release is 24.11's.
    from hetslurm.slurm import versions
    b.__dict__["slurm_release"] = versions.release("24.11")
    yield b
    b.close()


NODE = {"name": "gpu1", "state": ["IDLE"], "features": ["h100"], "active_features": ["h100"],
        "weight": 10, "cpus": 8, "alloc_cpus": 0, "real_memory": 16384, "alloc_memory": 0,
        "partitions": ["gpu"], "gres": "gpu:h100:8", "gres_used": "gpu:h100:0(IDX:N/A)",
        "threads": 1}


def test_reads_nodes_with_user_and_token_over_one_connection(server: Server,
                                                            rest: RestBackend) -> None:
    server.ok("GET", "nodes", {"nodes": [NODE]})
    assert [n.name for n in rest.nodes()] == ["gpu1"]
    assert rest.nodes()[0].gres_total == {("gpu", "h100"): 8}
    req = server.requests[0]
    assert req["headers"]["X-SLURM-USER-TOKEN"] == TOKEN
    assert req["headers"]["X-SLURM-USER-NAME"] == "alice"
    assert len(server.requests) == 2


def test_update_hold_release_cancel_bodies(server: Server, rest: RestBackend) -> None:
    server.ok("POST", "update_job", {}, job_id="7")
    server.ok("DELETE", "cancel", {"status": []}, job_id="7")
    rest.update_job(7, tres_per_node=(GresItem("gpu", "a100", 1),), features="a100",
                    prefer="h100", switches=Switches(1, 60), partition="gpu",
                    nodelist=("gpu3", "gpu4"), admin_comment="why")
    rest.hold(7)
    rest.release(7)
    rest.cancel(7)
    bodies = [r["body"] for r in server.requests]
    assert bodies[0] == {"tres_per_node": "gres/gpu:a100:1", "constraints": "a100",
                         "prefer": "h100", "partition": "gpu",
                         "required_switches": {"set": True, "infinite": False, "number": 1},
                         "wait_for_switch": 60, "required_nodes": ["gpu3", "gpu4"],
                         "admin_comment": "why"}
    assert bodies[1:3] == [{"hold": True}, {"hold": False}]
    assert server.requests[3]["method"] == "DELETE"


def test_unknown_job_and_node_are_not_found(server: Server, rest: RestBackend) -> None:
    path = OPERATIONS["job"].path.format(job_id="9")
    server.routes[("GET", path)] = (404, {"jobs": [], "errors": [], "meta": META})
    with pytest.raises(NotFoundError, match="job 9"):
        rest.job(9)
    server.routes[("POST", path)] = (200, {"errors": [{
        "error_number": 2017, "error": "Invalid job id specified"}], "meta": META})
    with pytest.raises(NotFoundError):
        rest.hold(9)
    server.ok("DELETE", "cancel", {"status": [{"error": {"code": 2017, "string": "Invalid"}}]},
              job_id="9")
    with pytest.raises(NotFoundError):
        rest.cancel(9)
    server.routes[("GET", OPERATIONS["node"].path.format(node_name="x"))] = (200, {
        "nodes": [], "meta": META, "errors": [{
            "description": "Failure to query node x", "error_number": 0, "error": "No error"}]})
    with pytest.raises(NotFoundError, match="node 'x'"):
        rest.node("x")


@pytest.mark.parametrize("status", [401, 511])
def test_refused_token_is_one_line(server: Server, rest: RestBackend, status: int) -> None:
    server.routes[("GET", OPERATIONS["nodes"].path)] = (status, {"errors": []})
    with pytest.raises(RestAuthError, match=r"refused the token.*scontrol token"):
        rest.nodes()


def test_controller_refusing_the_token(server: Server, rest: RestBackend) -> None:
    server.routes[("GET", OPERATIONS["nodes"].path)] = (200, {"errors": [{
        "error_number": 1007, "error": "Protocol authentication error"}], "meta": META})
    with pytest.raises(RestAuthError, match="slurmctld refused the token"):
        rest.nodes()


def test_expired_token_is_refused_before_any_call(server: Server) -> None:
    old = jwt(sun="alice", exp=int(time.time()) - 10)
    with pytest.raises(RestAuthError, match="expired at"):
        RestBackend({}, url=server.url, token=old).nodes()
    assert server.requests == []


def test_unreachable_wrong_url_and_not_a_token() -> None:
    with pytest.raises(RestError, match="unreachable"):
        RestBackend({}, url="http://127.0.0.1:9", token=TOKEN).nodes()
    with pytest.raises(RestError, match="only http"):
        RestBackend({}, url="ftp://x", token=TOKEN)
    with pytest.raises(RestError, match="HETSLURM_REST_URL"):
        RestBackend({"HETSLURM_REST_URL": ""}, token=TOKEN)
    with pytest.raises(RestAuthError, match="not a JWT"):
        token_claims("nonsense")


def test_api_not_served_says_use_cli(server: Server, rest: RestBackend) -> None:
    # 22.05's slurmrestd: every v0.0.42 path is a plain-text 404.
    with pytest.raises(RestError, match=r"does not serve v0\.0\.42.*--backend cli"):
        rest.job(1)


def test_missing_operations_reads_the_openapi_document() -> None:
    body = {"requestBody": {"content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/desc"}}}}}
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS.values():
        paths.setdefault(op.path, {})[op.method.lower()] = body
    full: dict[str, Any] = {"paths": paths, "components": {"schemas": {"desc": {"properties": {
        f: {} for f in OPERATIONS["update_job"].fields}}}}}
    assert missing_operations(full) == []
    del full["paths"][OPERATIONS["ping"].path]
    del full["components"]["schemas"]["desc"]["properties"]["hold"]
    assert missing_operations(full) == [
        "update_job: field 'hold' is not in #/components/schemas/desc",
        "ping: GET /slurm/v0.0.42/ping/ is not served"]


def test_cli_error_is_one_line_and_exit_4(tmp_path: Any) -> None:
    res = CliRunner(env={"HETSLURM_REST_URL": "http://127.0.0.1:9", "SLURM_JWT": TOKEN}).invoke(
        cli, ["status", "--backend", "rest", "--format", "json"])
    assert res.exit_code == 4, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unreachable" in lines[0], res.output
