"""The `python` framework on the sidecar's side: each model instance is a child process
(sidecars.python.stub) that runs the instance's `model.py`, as Triton's stub does, so a
model's crash, globals and imports stay its own. Batches cross a socket pair as pickled
numpy arrays; one thread per instance reads what the child sends back.

A child that dies fails the batch it was running with Triton's text, and the instance
starts a new one (running `initialize` again) for its next batch."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError, internal, unsupported
from protos.triton_metrics import Exposition
from protos.validation import Answer, ValidRequest
from sidecars.backend_checks import require_model_file
from sidecars.config import model_file
from sidecars.python.channel import Channel, ChannelClosed, GatewayTls, RequestData, ResponseData, Setup
from sidecars.python.custom_metrics import CustomMetrics
from sidecars.python.model_json import config_json, merge_completion, read_config_json
from sidecars.runtime import ModelInstance, Tensors

log = logging.getLogger(__name__)

# Triton's parameter for a packed conda environment; turnout runs models in its own interpreter.
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
# --backend-config gateway=HOST:PORT: the gateway's gRPC port, where BLS requests go; where
# it serves TLS, gateway-root-cert=PEM (the CA to trust), for mutual TLS gateway-cert=PEM and
# gateway-key=PEM, and gateway-server-name=NAME where its certificate names another host.
GATEWAY_OPTION = "gateway"
_FINALIZE_SECS = 30.0
_KIND_TEXT = {mc.ModelInstanceGroup.KIND_GPU: "GPU", mc.ModelInstanceGroup.KIND_MODEL: "MODEL"}
_LOG_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)  # Triton's INFO, WARNING, ERROR, VERBOSE

Sink = Callable[[Answer | TurnoutError | None, bool], None]


class PythonRuntime:
    """The `python` framework. Options come from `--backend-config` (`gateway=HOST:PORT`
    and the gateway-* TLS options above)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.gateway = options.get(GATEWAY_OPTION, "")
        cert, key = options.get("gateway-cert", ""), options.get("gateway-key", "")
        if bool(cert) != bool(key):
            raise ValueError("--backend-config gateway-cert and gateway-key go together")
        root = options.get("gateway-root-cert", "")
        if (cert or options.get("gateway-server-name")) and not root:
            raise ValueError("--backend-config gateway-cert and gateway-server-name need gateway-root-cert")
        for name, path in (("gateway-root-cert", root), ("gateway-cert", cert), ("gateway-key", key)):
            if path and not Path(path).is_file():
                raise ValueError(f"--backend-config {name}: no file at {path}")
        server_name = options.get("gateway-server-name", "")
        self.gateway_tls = GatewayTls(root, cert, key, server_name) if root else None
        self.metrics = CustomMetrics()

    def gpu_count(self) -> int:
        return 0  # a python model places itself; its instances are processes on this host

    def add_metrics(self, exposition: Exposition) -> None:
        self.metrics.add_to(exposition)

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        """Run the model's static `auto_complete_config` in a child of its own, as Triton does."""
        path = _model_path(config, version_dir)
        setup = Setup(
            model_file=str(path),
            version=version_dir.name,
            model_name=config.name,
            instance_name=config.name,
            args={},
            config_json=config_json(config),
            auto_complete_only=True,
        )
        child = _Child.start(setup, self.metrics)
        try:
            completed = child.setup()
        finally:
            child.stop()
        merge_completion(config, read_config_json(completed, config.name))

    def load(self, config: mc.ModelConfig, version_dir: Path, first: Sequence[int] = ()) -> list[ModelInstance]:
        if EXECUTION_ENV_PATH in config.parameters:
            raise unsupported(
                f"model '{config.name}' sets the {EXECUTION_ENV_PATH} parameter: turnout's python sidecar runs "
                "every model in its own Python environment; install the model's packages there instead"
            )
        path = _model_path(config, version_dir)
        text = config_json(config)
        instances: list[ModelInstance] = []
        try:
            for number, group in enumerate(config.instance_group):
                start = first[number] if number < len(first) else 0
                devices = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU and group.gpus else [0]
                for device in devices:
                    for index in range(start, group.count):
                        name = f"{group.name}_{index}" if len(devices) == 1 else f"{group.name}_{device}_{index}"
                        args = {
                            "model_config": text,
                            "model_instance_kind": _KIND_TEXT.get(group.kind, "CPU"),
                            "model_instance_name": name,
                            "model_instance_device_id": str(device),
                            "model_repository": str(version_dir.parent),
                            "model_version": version_dir.name,
                            "model_name": config.name,
                        }
                        setup = Setup(
                            model_file=str(path),
                            version=version_dir.name,
                            model_name=config.name,
                            instance_name=name,
                            args=args,
                            config_json=text,
                            decoupled=config.model_transaction_policy.decoupled,
                            gateway=self.gateway,
                            gateway_tls=self.gateway_tls,
                        )
                        instances.append(PythonInstance(setup, config, self.metrics))
        except BaseException:
            for instance in instances:
                instance.close()
            raise
        return instances


def _model_path(config: mc.ModelConfig, version_dir: Path) -> Path:
    path = model_file(config, version_dir) if config.default_model_filename else version_dir / "model.py"
    require_model_file(path, config.name)
    return path


class _Child:
    """One child process and the reading of what it sends."""

    def __init__(self, process: subprocess.Popen[bytes], channel: Channel, setup: Setup, metrics: CustomMetrics):
        self.process = process
        self.channel = channel
        self.setup_message = setup
        self.metrics = metrics
        self.is_cancelled: Callable[[int], bool] = lambda token: False
        self.dead = False  # set by the reader thread once the process is gone

    @classmethod
    def start(cls, setup: Setup, metrics: CustomMetrics) -> _Child:
        ours, theirs = socket.socketpair()
        try:
            # Its stdout goes to our stderr: our stdout carries the sidecar's ready line.
            process = subprocess.Popen(
                [sys.executable, "-m", "sidecars.python.stub", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),
            )
        except OSError as exc:
            ours.close()
            raise internal(f"failed to start the process of model instance '{setup.instance_name}': {exc}") from exc
        finally:
            theirs.close()
        return cls(process, Channel(ours), setup, metrics)

    def setup(self) -> Any:
        """Send the setup and wait until the child is ready; returns its answer (the completed
        config for auto-complete). Raises TurnoutError with the model's own error."""
        name = self.setup_message.instance_name
        try:
            self.channel.send(("setup", self.setup_message))
            while True:
                message = self.channel.receive()
                if message[0] == "done":
                    return message[1]
                if message[0] == "failed":
                    raise internal(message[1])
                self.handle(message)
        except ChannelClosed:
            code = self.process.wait()
            raise internal(f"the process of model instance '{name}' exited with status {code} while loading") from None

    def handle(self, message: tuple[Any, ...]) -> bool:
        """Log lines and metrics, whenever they come; False for any other message."""
        kind = message[0]
        if kind == "log":
            log.log(_LOG_LEVELS[message[1]] if 0 <= message[1] < 4 else logging.INFO, "%s", message[2])
        elif kind == "metric":
            self.metrics.apply(message[1])
        elif kind == "query":
            asked = message[2]
            answer = self.is_cancelled(asked) if isinstance(asked, int) else self.metrics.apply(asked)
            self.channel.send(("reply", message[1], answer))
        else:
            return False
        return True

    def stop(self, grace: float = 0.0) -> None:
        if grace:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.channel.close()


class PythonInstance:
    """One model instance: its child process, restarted after it dies. Takes whole
    requests (`execute_requests`), as Triton hands a python model a list of them."""

    def __init__(self, setup: Setup, config: mc.ModelConfig, metrics: CustomMetrics) -> None:
        self._setup = setup
        self._metrics = metrics
        self._outputs = [output.name for output in config.output]
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix=setup.instance_name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: asyncio.Future[tuple[Any, ...]] | None = None
        self._sinks: dict[int, Sink] = {}
        self._live: dict[int, ValidRequest] = {}  # requests the model may still ask about, by token
        self._tokens = itertools.count(1)
        self._closing = False
        self._child: _Child | None = None
        self._start()

    @property
    def name(self) -> str:
        return self._setup.instance_name

    def _start(self) -> None:
        """Blocking: a new child, initialized, with its reader thread."""
        child = _Child.start(self._setup, self._metrics)
        child.is_cancelled = self._is_cancelled
        try:
            child.setup()
        except BaseException:
            child.stop()
            raise
        self._child = child
        threading.Thread(target=self._read, args=(child,), name=f"{self.name}-reader", daemon=True).start()

    def _is_cancelled(self, token: int) -> bool:
        """Asked from the reader thread: a flag the event loop sets, read once."""
        request = self._live.get(token)
        return request is not None and request.cancelled

    def _unhealthy(self) -> TurnoutError:
        return internal(
            f"Failed to process the request(s) for model instance '{self.name}', "
            f"message: Stub process '{self.name}' is not healthy."
        )

    def _read(self, child: _Child) -> None:
        """The child's messages, until it exits: each on to the event loop."""
        try:
            while True:
                message = child.channel.receive()
                if child.handle(message):
                    continue
                if message[0] == "send":
                    self._post(self._deliver, message[1], message[2], message[3])
                elif message[0] == "done":  # finalize ran
                    return
                else:
                    self._post(self._finish_batch, message)
        except ChannelClosed:
            code = child.process.wait()
            child.dead = True
            if not self._closing:
                log.error("the process of model instance '%s' exited with status %s", self.name, code)
            self._post(self._child_died, child)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(callback, *args)

    def _finish_batch(self, message: tuple[Any, ...]) -> None:
        if self._batch is not None and not self._batch.done():
            self._batch.set_result(message)

    def _deliver(self, token: int, data: ResponseData | None, flags: int) -> None:
        sink = self._sinks.get(token)
        if sink is None:
            return
        final = bool(flags & 1)
        if final:
            del self._sinks[token]
            self._live.pop(token, None)
        sink(_answer(data) if data is not None else None, final)

    def _child_died(self, child: _Child) -> None:
        child.channel.close()
        if child is not self._child:
            return
        self._child = None
        error = self._unhealthy()
        if self._batch is not None and not self._batch.done():
            self._batch.set_exception(error)
        for sink in list(self._sinks.values()):
            sink(error, True)
        self._sinks.clear()
        self._live.clear()

    async def _ensure_child(self) -> None:
        if self._child is not None and not self._child.dead:
            return
        log.warning("restarting the process of model instance '%s'", self.name)
        try:
            await asyncio.get_running_loop().run_in_executor(self._sender, self._start)
        except TurnoutError as exc:
            raise internal(
                f"Failed to process the request(s) for model instance '{self.name}', message: {exc.message}"
            ) from None

    async def _run(self, batch: list[RequestData]) -> tuple[Any, ...]:
        """Send a batch and wait for the child's answer to it."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        await self._ensure_child()
        child = self._child
        assert child is not None
        self._batch = loop.create_future()
        try:
            await loop.run_in_executor(self._sender, child.channel.send, ("execute", batch))
        except ChannelClosed:
            self._batch = None
            if self._child is child:
                self._child = None
            raise self._unhealthy() from None
        try:
            return await self._batch
        finally:
            self._batch = None

    async def execute_requests(self, requests: Sequence[ValidRequest]) -> list[Answer | TurnoutError | None]:
        """Run requests as one `execute` call; each request's outputs or its own error.
        A decoupled model's responses go to each request's `responses` as the model sends
        them (None in the list), also after `execute` returned."""
        batch = []
        tokens = []
        for request in requests:
            token = next(self._tokens)
            tokens.append(token)
            batch.append(_request_data(request, token))
            self._live[token] = request
            if request.responses is not None:
                self._sinks[token] = request.responses
        try:
            answer = await self._run(batch)
        except BaseException:
            for token in tokens:
                self._sinks.pop(token, None)
                self._live.pop(token, None)
            raise
        kind = answer[0]
        for token in tokens:
            if token not in self._sinks:  # a decoupled request is live until its final response
                self._live.pop(token, None)
        if kind == "batch_error":
            for token in tokens:
                self._sinks.pop(token, None)
                self._live.pop(token, None)
            raise internal(answer[1])
        if kind == "executed":
            return [None] * len(requests)
        return [_answer(data) for data in answer[1]]

    async def execute(self, inputs: Tensors) -> dict[str, np.ndarray]:
        """A batch the sequence batcher or warm-up formed, as one request."""
        data = RequestData("", dict(inputs), list(self._outputs))
        answer = await self._run([data])
        if answer[0] == "batch_error":
            raise internal(answer[1])
        if answer[0] == "executed":  # a decoupled model warming up: its responses are dropped
            return {}
        result = _answer(answer[1][0])
        if isinstance(result, TurnoutError):
            raise result
        return result.outputs

    def close(self) -> None:
        """Blocking: run the model's `finalize` and end its process."""
        self._closing = True
        child = self._child
        self._child = None
        if child is not None:
            with contextlib.suppress(ChannelClosed):
                child.channel.send(("finalize",))
            child.stop(grace=_FINALIZE_SECS)
        self._sender.shutdown(wait=False)


def _request_data(request: ValidRequest, token: int) -> RequestData:
    sequence = request.sequence
    flags = 0
    correlation_id: int | str = 0
    if sequence is not None:
        correlation_id = sequence.id
        flags = (1 if sequence.start else 0) | (2 if sequence.end else 0)
    return RequestData(
        request.id,
        request.inputs,
        [output.name for output in request.outputs],
        dict(request.parameters),
        correlation_id,
        flags,
        token,
    )


def _answer(data: ResponseData) -> Answer | TurnoutError:
    if data.error is not None:
        code, message = data.error
        try:
            status = Status(code)
        except ValueError:
            status = Status.INTERNAL
        return TurnoutError(status, message)
    return Answer(data.outputs, data.parameters)
