"""The sidecar process: builds the object graph from settings, serves, and shuts down
in one ordered sequence on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

import grpc

from protos.rpc import MESSAGE_SIZE_OPTIONS
from sidecars.models import ModelManager
from sidecars.runtime import runtime_for
from sidecars.server import add_services
from sidecars.settings import ControlMode, SidecarSettings

log = logging.getLogger("sidecars")

READY_LINE = "TURNOUT_SIDECAR_READY grpc={host}:{port} framework={framework}"


async def serve(settings: SidecarSettings) -> int:
    """Run until a stop signal; the exit status is 1 when a start-up load failed under
    --exit-on-error, else 0."""
    runtime = runtime_for(settings.framework, settings.backend_config)
    manager = ModelManager(settings, runtime)
    server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS)
    add_services(server, manager)
    port = server.add_insecure_port(f"{settings.host}:{settings.port}")
    await server.start()

    failures = await manager.start()
    for failure in failures:
        log.error("%s", failure)
    if failures and settings.exit_on_error:
        log.error("exiting: %d model(s) failed to load and --exit-on-error is set", len(failures))
        manager.exiting = True
        await server.stop(0)
        await manager.close()
        return 1

    # Only this coroutine, on the main thread's loop, installs signal handlers.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    print(READY_LINE.format(host=settings.host, port=port, framework=settings.framework), flush=True)
    poller = None
    if settings.model_control_mode is ControlMode.POLL:
        poller = asyncio.create_task(manager.poll_forever())
    await stop.wait()

    # Shutdown: report not ready -> stop accepting and drain in-flight RPCs within the
    # grace period -> release the models.
    log.info("stopping: draining for up to %.0f s", settings.exit_timeout_secs)
    manager.exiting = True
    if poller is not None:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
    await server.stop(settings.exit_timeout_secs)
    try:
        await asyncio.wait_for(manager.close(), settings.exit_timeout_secs)
    except TimeoutError:
        log.warning("models did not release within the exit timeout")
    return 0


def run(settings: SidecarSettings) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if settings.log_verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(serve(settings))
