"""A model instance's process (`python -m sidecars.python.stub FD`), as Triton's stub: it
imports the instance's `model.py` with `triton_python_backend_utils` importable, calls
`initialize`, then runs each batch the sidecar sends through `execute` and checks what it
returns, with Triton's texts; `finalize` on the way out.

Threads: the main thread runs the model; a receiver thread reads the sidecar's messages
(batches to the main thread, replies to whoever asked); an event loop on a thread of its
own runs `async def execute` (and, for decoupled models, keeps running it after execute
returned, as Triton's stub does)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import os
import queue
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from protos.memory import keep_freed_memory
from sidecars.python import backend_utils as pb
from sidecars.python.channel import Channel, ChannelClosed, MetricOp, RequestData, ResponseData, Setup

MODULE_NAME = "triton_python_backend_utils"
ORPHAN_GRACE_SECS = 10.0  # how long finalize may run once the sidecar is gone


class StubError(Exception):
    """What the stub itself refuses (a wrong return from execute), in Triton's words alone."""


def error_text(exc: BaseException) -> str:
    """An exception as Triton's stub reports a Python one: type and message, then the frames."""
    if isinstance(exc, StubError):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}"
    # The model's frames only: Triton's stub calling it is C++, ours would be noise.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return text


class ModelProcess:
    """The link `backend_utils` uses, and the model's driver."""

    def __init__(self, channel: Channel, setup: Setup) -> None:
        self.channel = channel
        self.setup = setup
        self.model_dir = str(Path(setup.model_file).parent.parent)
        self._work: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._replies: dict[int, queue.Queue[Any]] = {}
        self._query_ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sent: dict[int, ResponseData] = {}  # non-decoupled responses sent through a sender
        self._bls: Any = None

    # -- the link backend_utils uses ---------------------------------------------------------

    def log(self, level: int, message: str) -> None:
        self.channel.send(("log", level, message))

    def metric(self, op: str, family: pb.MetricFamily, labels: tuple[tuple[str, str], ...], value: float) -> float:
        metric_op = MetricOp(op, family.name, family.kind, family.description, labels, value)
        if op != "value":
            self.channel.send(("metric", metric_op))
            return 0.0
        answer: float = self._ask(metric_op)
        return answer

    def _ask(self, payload: Any) -> Any:
        query_id = next(self._query_ids)
        box: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._replies[query_id] = box
        try:
            self.channel.send(("query", query_id, payload))
            return box.get()
        finally:
            self._replies.pop(query_id, None)

    def is_cancelled(self, request: pb.InferenceRequest) -> bool:
        """Whether the request's client gave up: asked of the sidecar each time (a BLS
        request, which has no token, never is)."""
        if not request.token:
            return False
        answer: bool = self._ask(request.token)
        return answer

    def send(self, request: pb.InferenceRequest, response: pb.InferenceResponse | None, flags: int) -> None:
        data = response_data(response) if response is not None else None
        if not self.setup.decoupled:
            if data is not None:
                self._sent[request.index] = data
            return
        self.channel.send(("send", request.token, data, flags))

    def execute_bls(self, request: pb.InferenceRequest, decoupled: bool) -> Any:
        if self._bls is None:
            from sidecars.python.bls import BlsClient

            self._bls = BlsClient(self.setup.gateway, self.setup.gateway_tls)
        return self._bls.execute(request, decoupled)

    # -- the model -------------------------------------------------------------------------

    def load_module(self) -> Any:
        model_file = Path(self.setup.model_file)
        if not model_file.is_file():
            raise StubError(f"Python model file not found in '{model_file}'")
        if model_file.suffix != ".py":
            raise StubError(f"Model name must end with '.py'. Model name is \"{model_file.name}\".")
        # As Triton's stub: the version folder and the model folder are importable, and the
        # model is imported as <version>.<file name>.
        sys.path.append(str(model_file.parent))
        sys.path.append(str(model_file.parent.parent))
        module = importlib.import_module(f"{self.setup.version}.{model_file.stem}")
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            raise StubError(f"'{model_file}' defines no class TritonPythonModel")
        return model_class

    def auto_complete(self, model_class: Any) -> str:
        config = pb.ModelConfig(self.setup.config_json)
        if hasattr(model_class, "auto_complete_config"):
            config = model_class.auto_complete_config(config)
        if not isinstance(config, pb.ModelConfig):
            raise StubError(
                f"auto_complete_config function in model '{self.setup.model_name}' must return a valid "
                "pb.ModelConfig object."
            )
        return json.dumps(config.as_dict())

    def serve(self, model_class: Any) -> None:
        self._start_loop()
        threading.Thread(target=self._receive, name="receiver", daemon=True).start()
        model = model_class()
        if hasattr(model, "initialize"):
            self._run(model.initialize(dict(self.setup.args)))
        self.channel.send(("done", None))
        while (message := self._work.get()) is not None:
            kind = message[0]
            if kind == "execute":
                self._execute(model, message[1])
            elif kind == "finalize":
                break
        if hasattr(model, "finalize"):
            try:
                self._run(model.finalize())
            except Exception as exc:
                self.log(pb.Logger.ERROR, f"finalize of model '{self.setup.instance_name}' failed: {error_text(exc)}")
        self.channel.send(("done", None))

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="model-loop", daemon=True).start()
        self._loop = loop

    def _run(self, result: Any) -> Any:
        """A coroutine's value, run on the model's loop; anything else as it is."""
        if asyncio.iscoroutine(result):
            assert self._loop is not None
            return asyncio.run_coroutine_threadsafe(result, self._loop).result()
        return result

    def _receive(self) -> None:
        try:
            while True:
                message = self.channel.receive()
                if message[0] == "reply":
                    box = self._replies.get(message[1])
                    if box is not None:
                        box.put(message[2])
                else:
                    self._work.put(message)
        except ChannelClosed:
            self._work.put(None)  # the sidecar is gone: finish as if told to
            for box in list(self._replies.values()):
                box.put(0.0)
            # A model stuck in execute never gets to finish: end the process regardless.
            reaper = threading.Timer(ORPHAN_GRACE_SECS, os._exit, args=(1,))
            reaper.daemon = True
            reaper.start()

    def _execute(self, model: Any, batch: list[RequestData]) -> None:
        requests = [request_of(index, data) for index, data in enumerate(batch)]
        self._sent.clear()
        try:
            returned = model.execute(requests)
            if self.setup.decoupled:
                if asyncio.iscoroutine(returned):
                    assert self._loop is not None
                    future = asyncio.run_coroutine_threadsafe(returned, self._loop)
                    future.add_done_callback(lambda done: self._background_done(done, requests))
                    returned = None
                elif returned is not None:
                    raise StubError(
                        f"Python model '{self.setup.instance_name}' is using the decoupled mode and the execute "
                        "function must return None."
                    )
                self.channel.send(("executed", None))
                return
            responses = self._check(requests, self._run(returned))
        except Exception as exc:
            text = f"Failed to process the request(s) for model '{self.setup.instance_name}', message: "
            self.channel.send(("batch_error", text + error_text(exc)))
            return
        self.channel.send(("responses", responses))

    def _background_done(self, done: Any, requests: list[pb.InferenceRequest]) -> None:
        """A decoupled model's async execute ended; an exception ends its open requests."""
        exc = done.exception()
        if exc is None:
            return
        text = f"Failed to process the request(s) for model '{self.setup.instance_name}', message: {error_text(exc)}"
        for request in requests:
            sender = request.get_response_sender()
            if not sender.is_closed():
                error = pb.InferenceResponse(error=pb.TritonError(text))
                sender.send(error, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _check(self, requests: list[pb.InferenceRequest], returned: Any) -> list[ResponseData]:
        """The responses `execute` returned, checked as Triton's stub checks them."""
        if returned is None:
            returned = [None] * len(requests)
        if not isinstance(returned, list):
            raise StubError(f"Expected a list in the execute return, found type '{type(returned)}'.")
        if len(returned) != len(requests):
            raise StubError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(returned)}\n"
            )
        responses = []
        for index, response in enumerate(returned):
            if response is None:
                sent = self._sent.get(index)
                if sent is None:
                    sent = ResponseData({}, ("INTERNAL", "the model sent no response for this request"))
                responses.append(sent)
                continue
            if not isinstance(response, pb.InferenceResponse):
                raise StubError(
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(response)}'."
                )
            responses.append(response_data(response))
        return responses


def request_of(index: int, data: RequestData) -> pb.InferenceRequest:
    request = pb.InferenceRequest(
        request_id=data.id,
        correlation_id=data.correlation_id,
        inputs=[pb.Tensor(name, array) for name, array in data.inputs.items()],
        requested_output_names=data.requested_outputs,
        flags=data.flags,
        parameters=json.dumps(data.parameters),
    )
    request.index = index
    request.token = data.token
    return request


def response_data(response: pb.InferenceResponse) -> ResponseData:
    error = response.error()
    outputs = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
    parameters = json.loads(response.parameters() or "{}")
    if error is not None:
        return ResponseData({}, (error.code().name, error.message()), parameters)
    return ResponseData(outputs, None, parameters)


def _stdout_to_stderr() -> None:
    """The sidecar's stdout carries its ready line; a model's prints go to the log stream."""
    sys.stdout = sys.stderr


def main(argv: list[str]) -> int:
    # The sidecar alone ends this process (finalize first); a signal sent to the whole
    # process group (Ctrl-C, a container stop) reaches the sidecar, which drains first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _stdout_to_stderr()
    keep_freed_memory()  # a model's tensors cross this process as large buffers too
    channel = Channel(socket.socket(fileno=int(argv[1])))
    kind, setup = channel.receive()
    assert kind == "setup"
    process = ModelProcess(channel, setup)
    pb._process = process
    sys.modules[MODULE_NAME] = pb
    try:
        model_class = process.load_module()
        if setup.auto_complete_only:
            channel.send(("done", process.auto_complete(model_class)))
            return 0
        process.serve(model_class)
    except ChannelClosed:
        return 1
    except Exception as exc:
        with contextlib.suppress(ChannelClosed):
            channel.send(("failed", error_text(exc)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
