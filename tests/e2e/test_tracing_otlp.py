"""Spans exported over real OTLP/HTTP from ``sie serve`` processes (docs/observability.md
"Traces"): a gateway process and a worker process on a nats-server, both with
``SIE_TRACING_ENABLED=true`` and ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a receiver
this test runs; one encode request with the client's ``traceparent`` arrives there as
a gateway span and a worker span of the client's trace, from the two services. Also:
``SIE_LOG_JSON=true`` writes JSON lines, among them the request's access line with
its trace id, and no progress bar reaches the log."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import BUNDLES, CONFIGS, MINILM, ROOT, wait_for
from tests.e2e.test_serve import sie_bin
from tests.natsserver import NatsServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


class Receiver:
    """An OTLP/HTTP traces receiver: ``POST /v1/traces`` with a protobuf
    ``ExportTraceServiceRequest``; keeps (service name, span) pairs."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        received = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        received.extend((attrs.get("service.name", ""), s) for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list[tuple[str, str]]:
        return [(svc, s.name) for svc, s in self.spans if s.trace_id.hex() == trace_id]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.server.shutdown()


def test_spans_reach_an_otlp_receiver_and_logs_are_json(tmp_path: Path, receiver: Receiver) -> None:
    nats = NatsServer(tmp_path / "nats")
    nats.start()
    port, cfg_port, metrics_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "SIE_TRACING_ENABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "SIE_LOG_JSON": "true",
    }
    common = ["serve", "--bus=nats", "--nats-url", nats.url, "--host", "127.0.0.1"]
    logs = {n: tmp_path / f"{n}.log" for n in ("gateway", "worker")}
    procs = [
        subprocess.Popen(
            [
                sie_bin(),
                *common,
                "--roles=gateway,config",
                *("--port", str(port), "--config-port", str(cfg_port)),
                *("--models-dir", str(CONFIGS), "--bundles-dir", str(BUNDLES)),
            ],
            cwd=ROOT,
            env=env,
            stdout=logs["gateway"].open("w"),
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [sie_bin(), *common, "--roles=worker", "--preload", MINILM],
            cwd=ROOT,
            env={
                **env,
                "SIE_CONFIG_SERVICE_URL": f"http://127.0.0.1:{cfg_port}",
                "SIE_METRICS_PORT": str(metrics_port),
                "SIE_WORKER_ID": "otlp-worker",
            },
            stdout=logs["worker"].open("w"),
            stderr=subprocess.STDOUT,
        ),
    ]
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            for p in procs:
                assert p.poll() is None, "\n".join(f.read_text()[-3000:] for f in logs.values())
            try:
                workers = httpx.get(f"{base}/health", timeout=1).json()["workers"]
            except (httpx.HTTPError, ValueError, KeyError):
                return False
            return any(w["ready"] for w in workers)

        wait_for(ready, 120)
        r = httpx.post(
            f"{base}/v1/encode/{MINILM}",
            json={"items": [{"text": "traced across processes"}]},
            headers={"traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-sie-trace-id"] == TRACE_ID
        want = {
            ("sie-server", "gateway.request"),
            ("sie-server", "gateway.publish"),
            ("sie-worker", "worker.run_batch"),
        }
        wait_for(lambda: want <= set(receiver.of_trace(TRACE_ID)), 15)
        by_name = {s.name: s for _, s in receiver.spans if s.trace_id.hex() == TRACE_ID}
        assert by_name["worker.run_batch"].parent_span_id == by_name["gateway.publish"].span_id

        # JSON log lines: the access line carries the request's ids; no progress bars
        def access_line() -> dict[str, Any] | None:
            for line in logs["gateway"].read_text().splitlines():
                if line.startswith("{"):
                    rec = json.loads(line)
                    if rec.get("logger") == "sie.access" and rec.get("trace_id") == TRACE_ID:
                        return dict(rec)
            return None

        wait_for(lambda: access_line() is not None, 10)
        rec = access_line()
        assert rec is not None
        assert rec["status"] == 200 and rec["model"] == MINILM and rec["items"] == 1
        assert (
            rec["path"] == f"/v1/encode/{MINILM}"
            and rec["request_id"] == r.headers["x-sie-request-id"]
        )
        for name, path in logs.items():
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            not_json = [ln for ln in lines if not ln.startswith("{")]
            assert not_json == [], (name, not_json[:5])
            assert all("level" in json.loads(ln) for ln in lines)
            assert "it/s]" not in path.read_text()  # no tqdm bars
        messages = [json.loads(ln)["message"] for ln in logs["worker"].read_text().splitlines()]
        assert any("ready" in m and MINILM in m for m in messages), messages
        assert any("worker listening on http://127.0.0.1:" in m for m in messages), messages
    finally:
        for p in procs:
            p.terminate()
        deadline = time.monotonic() + 30
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        nats.stop()
