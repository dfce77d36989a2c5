"""`triton_python_backend_utils` as python-backend models use it (`import
triton_python_backend_utils as pb_utils`): tensors, requests, responses, errors, the
logger, custom metrics, BLS and the auto-complete config helpers, with Triton's names,
signatures and error texts.

Imported only in a model instance's process (sidecars.python.stub), which registers it
under Triton's module name and sets `_process` to the link back to the sidecar; one
process serves one model instance, so that link is the process's own."""

from __future__ import annotations

import contextlib
import enum
import json
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

# Re-exported: models reach them as pb_utils.<name>.
from sidecars.python.auto_complete import ModelConfig as ModelConfig
from sidecars.python.numpy_types import TRITON_STRING_TO_NUMPY as TRITON_STRING_TO_NUMPY
from sidecars.python.numpy_types import deserialize_bytes_tensor as deserialize_bytes_tensor
from sidecars.python.numpy_types import numpy_to_triton_type as numpy_to_triton_type
from sidecars.python.numpy_types import serialize_byte_tensor as serialize_byte_tensor
from sidecars.python.numpy_types import triton_string_to_numpy as triton_string_to_numpy
from sidecars.python.numpy_types import triton_to_numpy_type as triton_to_numpy_type

# -- the link to the sidecar, set by the stub ----------------------------------------------


class _Process(Protocol):
    model_dir: str

    def log(self, level: int, message: str) -> None: ...
    def metric(self, op: str, family: MetricFamily, labels: tuple[tuple[str, str], ...], value: float) -> float: ...
    def send(self, request: InferenceRequest, response: InferenceResponse | None, flags: int) -> None: ...
    def is_cancelled(self, request: InferenceRequest) -> bool: ...
    def execute_bls(self, request: InferenceRequest, decoupled: bool) -> Any: ...


_process: _Process | None = None


def _link() -> _Process:
    if _process is None:
        raise TritonModelException("triton_python_backend_utils is only usable inside a model instance's process")
    return _process


TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# -- errors ---------------------------------------------------------------------------------


class TritonModelException(Exception):
    """Raised by the backend's functions on misuse; a model may raise it too."""


class _ErrorCode(enum.IntEnum):
    """Triton's TRITONSERVER_Error_Code, shown as the python backend's pybind11 enum shows it."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __str__(self) -> str:
        return f"__ErrorCode.{self.name}"

    def __repr__(self) -> str:
        return f"<__ErrorCode.{self.name}: {self.value}>"


class TritonError:
    """An error a response carries: a message and one of Triton's codes (INTERNAL by default)."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: _ErrorCode | str = _ErrorCode.INTERNAL) -> None:
        if message is None:
            raise TypeError("TritonError(): message must not be None")
        self._message = str(message)
        # The sidecar's own callers name a code by its name (protos.status.Status values).
        self._code = _ErrorCode[code] if isinstance(code, str) else _ErrorCode(code)

    def code(self) -> _ErrorCode:
        return self._code

    def message(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code.name})"


# -- tensors, requests, responses -----------------------------------------------------------


class Tensor:
    """A named tensor, held as a numpy array in this process's memory."""

    def __init__(self, name: str, data: Any) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(f"Tensor '{name}': the data must be a numpy array, got {type(data).__name__}")
        if data.dtype.type == np.str_:
            data = data.astype(np.object_)
        self._name = name
        self._array: np.ndarray = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype.type)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        device: tuple[int, int] = self._array.__dlpack_device__()
        return device

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor from any DLPack producer (a torch tensor, a numpy array) or a DLPack capsule."""
        if hasattr(capsule, "__dlpack__"):
            return Tensor(name, np.from_dlpack(capsule))
        try:
            from torch.utils import dlpack as torch_dlpack
        except ImportError as exc:
            raise TritonModelException("Tensor.from_dlpack: a raw DLPack capsule needs torch installed") from exc
        return Tensor(name, torch_dlpack.from_dlpack(capsule).cpu().numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


def _parameters_json(parameters: Any) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        return parameters
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
            raise TritonModelException("Expect parameters keys to have type str, values to have type bool/int/str")
    return json.dumps(parameters)


class InferenceResponse:
    """One response: output tensors, or an error."""

    def __init__(
        self, output_tensors: Sequence[Tensor] = (), error: TritonError | None = None, parameters: Any = None
    ) -> None:
        self._outputs = list(output_tensors)
        for tensor in self._outputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(f"InferenceResponse: output_tensors must be Tensors, got {type(tensor)}")
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """Sends a decoupled model's responses for one request, any number, the last flagged final."""

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if response is None and flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is not final."
            )
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        _link().send(self._request, response, flags)

    def is_cancelled(self) -> bool:
        return _link().is_cancelled(self._request)

    def is_closed(self) -> bool:
        return self._closed


class InferenceRequest:
    """A request: the ones `execute` gets, or one a model builds to run another model (BLS)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: Any = None,
    ) -> None:
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self.model_name = model_name
        self.model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = _parameters_json(parameters)
        self._sender: InferenceResponseSender | None = None
        self.index = -1  # its position in the batch `execute` got; -1 for a BLS request
        self.token = 0  # the sidecar's handle on it, for a decoupled model's responses

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested

    def trace(self) -> None:
        return None

    def is_cancelled(self) -> bool:
        """Whether the client gave up on this request (its deadline passed, it cancelled)."""
        return _link().is_cancelled(self)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            self._sender = InferenceResponseSender(self)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException("turnout does not reschedule requests: only TRITONSERVER_REQUEST_RELEASE_ALL")

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on the model it names, through the gateway's routing; returns an
        InferenceResponse (errors in it), or with `decoupled` an iterator of them."""
        return _link().execute_bls(self, decoupled)

    async def async_exec(self, decoupled: bool = False) -> Any:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t["name"] == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t["name"] == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def get_model_dir() -> str:
    return _link().model_dir


# -- logging --------------------------------------------------------------------------------


class Logger:
    """Log lines go to the sidecar's log, at Triton's levels."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        _link().log(int(level), str(message))

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.LogLevel.VERBOSE)


# -- custom metrics -------------------------------------------------------------------------


class MetricFamily:
    """A custom metric family, served on the sidecar's metrics port with Triton's own. As
    in Triton, the family lives as long as this object: once it is garbage collected, its
    metrics leave the metrics port and refuse every operation (keep it, e.g. on `self`)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"

    def __init__(self, name: str, description: str, kind: str) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException("MetricFamily kind must be COUNTER, GAUGE or HISTOGRAM")
        self.name = name
        self.description = description
        self.kind = kind

    def Metric(self, labels: dict[str, str] | None = None, buckets: Sequence[float] | None = None) -> Metric:
        if self.kind == self.HISTOGRAM and buckets is None:
            raise TritonModelException("Missing required buckets for histogram metrics.")
        if self.kind != self.HISTOGRAM and buckets is not None:
            raise TritonModelException("Unexpected buckets found for non-histogram metrics.")
        return Metric(self, labels or {}, tuple(buckets or ()))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a process on its way out has no link left
            _link().metric("delete", self, (), 0.0)


_FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' object "
    "should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)


class Metric:
    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: tuple[float, ...]) -> None:
        self._family = weakref.ref(family)  # a metric does not keep its family alive, as in Triton
        self._kind = family.kind
        self._labels = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        self.buckets = buckets
        _link().metric("create", family, self._labels, 0.0)

    def _apply(self, op: str, value: float, failure: str) -> float:
        family = self._family()
        if family is None:
            raise TritonModelException(f"{failure}: {_FAMILY_DELETED}")
        return _link().metric(op, family, self._labels, value)

    def increment(self, value: float) -> None:
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("Failed to increment metric value: counters cannot be decreased")
        self._apply("increment", float(value), "Failed to increment metric value")

    def set(self, value: float) -> None:
        if self._kind != MetricFamily.GAUGE:
            raise TritonModelException("Failed to set metric value: only gauges can be set")
        self._apply("set", float(value), "Failed to set metric value")

    def observe(self, value: float) -> None:
        if self._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to observe metric value: only histograms observe values")
        self._apply("observe", float(value), "Failed to observe metric value")

    def value(self) -> float:
        return self._apply("value", 0.0, "Failed to get metric value")


# -- BLS responses of a decoupled model -----------------------------------------------------


class ResponseIterator:
    """The responses a decoupled model sends for one BLS request, in order."""

    def __init__(self, responses: Iterator[InferenceResponse]) -> None:
        self._responses = responses

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        return next(self._responses)

    def cancel(self) -> None:
        close = getattr(self._responses, "close", None)
        if close is not None:
            close()


def load_model(model_name: str, config: str = "", files: Any = None) -> None:
    raise TritonModelException("turnout: load models through the gateway's repository API, not from a model")


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    raise TritonModelException("turnout: unload models through the gateway's repository API, not from a model")
