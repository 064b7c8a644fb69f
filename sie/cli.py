"""``sie`` command line. Reads flags and ``SIE_*`` env vars once, into frozen settings.

    sie serve [--roles gateway,config,worker] [--bus memory|nats] [--host H] [--port P]
              [--config-port P] [--models-dir D] [--bundles-dir D] [--preload MODEL ...]
    sie version
    sie models | encode | score | config apply|status | pools list|get|create|delete
                                    client commands on the SDK (sie.cli_client, docs/sdk.md)

SIGINT/SIGTERM: stop accepting, drain in-flight requests (``SIE_DRAIN_TIMEOUT_S``),
exit 0. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Sequence

import anyio

from sie import __version__, gc_policy
from sie.cli_client import CLIENT_COMMANDS, add_client_commands, run_client
from sie.core.errors import SieError
from sie.logs import configure_logging
from sie.settings import ServeSettings, apply_library_env_defaults, otel_env
from sie.tracing import configure_tracing

__all__ = ["main"]

log = logging.getLogger("sie")


def parser() -> argparse.ArgumentParser:
    """The `sie` command line (`serve`, `version`, and the client commands)."""
    p = argparse.ArgumentParser(prog="sie", description="SIE inference engine")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run roles (gateway, config, worker) in this process")
    s.add_argument("--roles", help="comma-separated subset of gateway,config,worker [SIE_ROLES]")
    s.add_argument(
        "--bus", choices=["memory", "nats"], help="message bus [SIE_BUS, default memory]"
    )
    s.add_argument("--nats-url", help="NATS URL [SIE_NATS_URL]")
    s.add_argument("--host", help="listen address [SIE_HOST, default 127.0.0.1]")
    s.add_argument("--port", type=int, help="gateway port [SIE_PORT, default 8080]")
    s.add_argument(
        "--config-port",
        type=int,
        help="config role port [SIE_CONFIG_PORT, default the gateway port + 1]",
    )
    s.add_argument("--models-dir", help="model config YAML dir or fsspec URL [SIE_MODELS_DIR]")
    s.add_argument("--bundles-dir", help="bundle YAML dir or fsspec URL [SIE_BUNDLES_DIR]")
    s.add_argument(
        "--preload",
        nargs="+",
        action="extend",
        metavar="MODEL",
        help="load at start [SIE_PRELOAD_MODELS]",
    )
    s.add_argument("--pool", help="worker pool [SIE_POOL, default default]")
    s.add_argument(
        "--machine-profile", help="worker machine profile [SIE_MACHINE_PROFILE, default default]"
    )
    s.add_argument("--bundle", help="worker bundle [SIE_BUNDLE, default default]")
    s.add_argument("--device", help="torch device [SIE_DEVICE, default cpu]")
    s.add_argument("--log-level", help="[SIE_LOG_LEVEL, default INFO]")
    s.add_argument(
        "--log-json",
        action="store_const",
        const=True,
        help="one JSON object per log line [SIE_LOG_JSON]",
    )
    s.add_argument(
        "--config-store-dir",
        help="config role: durable store, local path or fsspec URL [SIE_CONFIG_STORE_DIR]",
    )
    s.add_argument(
        "--config-service-url",
        help="gateway/worker: config role base URL [SIE_CONFIG_SERVICE_URL]",
    )
    sub.add_parser("version", help="print the version")
    add_client_commands(sub)
    return p


#: A second SIGINT/SIGTERM this soon after the first is a duplicate delivery (seconds).
SIGNAL_REPEAT_S = 1.0


async def _serve(settings: ServeSettings) -> None:
    from sie.container import Container  # imports starlette/hypercorn only when serving

    container = Container(settings)
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def on_signals() -> None:
            first_at = 0.0
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    if shutdown.is_set():
                        # `make run` forwards the signal its process group already got:
                        # a repeat within a second is that copy, not a second request
                        if time.monotonic() - first_at < SIGNAL_REPEAT_S:
                            continue
                        log.warning("second signal: exiting now")
                        tg.cancel_scope.cancel()
                        return
                    log.info(
                        "%s: draining (up to %.0fs)",
                        signal.Signals(signum).name,
                        settings.drain_timeout_s,
                    )
                    first_at = time.monotonic()
                    shutdown.set()
                    tg.start_soon(deadline)

        async def deadline() -> None:
            await anyio.sleep(settings.drain_timeout_s + 5.0)
            log.warning("drain did not finish in time: exiting")
            tg.cancel_scope.cancel()

        tg.start_soon(on_signals)
        await container.run(shutdown)
        log.info("stopped: every role has shut down")
        tg.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    if args.command in CLIENT_COMMANDS:
        return run_client(args)
    overrides = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    try:
        settings = ServeSettings.from_env(**overrides)
    except ValueError as exc:
        print(f"sie serve: invalid settings: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_json)
    apply_library_env_defaults()  # offline: weights come from paths, packages or caches
    gc_policy.configure()  # short, rare collector pauses (docs/security.md "Liveness")
    if "worker" in settings.roles:
        # Engines run on threads that need the GIL between tensor ops; a short switch
        # interval hands it back quickly while the event loop is busy (bench_encode.py).
        sys.setswitchinterval(settings.gil_switch_interval_ms / 1000)
    tracing = configure_tracing(settings.tracing_enabled, settings.roles, otel_env())
    try:
        anyio.run(_serve, settings)
    except KeyboardInterrupt:
        return 0
    except BaseException as exc:
        cause = _first_leaf(exc)
        if isinstance(cause, SieError):
            print(f"sie serve: {cause.code}: {cause.message}", file=sys.stderr)
            return 2
        if isinstance(cause, OSError):
            print(f"sie serve: {cause}", file=sys.stderr)
            return 2
        raise
    finally:
        if tracing is not None:
            tracing.shutdown()  # bounded flush of what is queued
    return 0


def _first_leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside (possibly nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
