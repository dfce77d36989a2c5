"""Runs of ONNX Runtime sessions through its C API (ctypes over the libonnxruntime that the
onnxruntime wheel ships), for models whose tensors hold strings.

ONNX Runtime's Python API hands string outputs back as str, decoding them strictly as
UTF-8, and takes a bytes element only up to its first NUL. Its C API reads and writes
each element's bytes by length, so through it BYTES reach a model and come back exactly
as sent, whatever they hold. (Triton's ONNX Runtime backend, on the same C API, returns
any bytes too; it fills inputs from C strings, so its elements end at their first NUL.)
Numeric tensors cross without a copy on the way in (the session reads the numpy arrays'
memory) and with one on the way out.

The OrtApi table is append-only across ONNX Runtime releases, so its entries are called
by their index in the version asked for (API_VERSION)."""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
from collections.abc import Sequence
from ctypes import POINTER, byref, c_char_p, c_int, c_int64, c_size_t, c_uint32, c_void_p
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

API_VERSION = 21  # the oldest OrtApi holding every entry below (ONNX Runtime 1.21)

# ONNXTensorElementDataType, for the numpy dtypes that cross as they are.
STRING = 8
_ELEMENT_TYPES: dict[np.dtype[Any], int] = {
    np.dtype(np.float32): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int8): 3,
    np.dtype(np.uint16): 4,
    np.dtype(np.int16): 5,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float64): 11,
    np.dtype(np.uint32): 12,
    np.dtype(np.uint64): 13,
}
_DTYPES = {code: dtype for dtype, code in _ELEMENT_TYPES.items()}
_ERROR_CODES = (
    "OK",
    "FAIL",
    "INVALID_ARGUMENT",
    "NO_SUCHFILE",
    "NO_MODEL",
    "ENGINE_ERROR",
    "RUNTIME_EXCEPTION",
    "INVALID_PROTOBUF",
    "MODEL_LOADED",
    "NOT_IMPLEMENTED",
    "INVALID_GRAPH",
    "EP_FAIL",
)

_FEW = 32  # string elements filled through a ctypes array; more, through numpy
_NAME_ARRAYS = 64  # C arrays of input or output names remembered per session

_Status = c_void_p
_P = c_void_p  # every opaque Ort* handle
_OUT = POINTER(c_void_p)

# (index in OrtApi, result type, argument types)
_ENTRIES: dict[str, tuple[int, Any, tuple[Any, ...]]] = {
    "GetErrorCode": (1, c_int, (_Status,)),
    "GetErrorMessage": (2, c_char_p, (_Status,)),
    "CreateEnv": (3, _Status, (c_int, c_char_p, _OUT)),
    "CreateSession": (7, _Status, (_P, c_char_p, _P, _OUT)),
    "Run": (9, _Status, (_P, _P, POINTER(c_char_p), POINTER(c_void_p), c_size_t, POINTER(c_char_p), c_size_t, _OUT)),
    "CreateSessionOptions": (10, _Status, (_OUT,)),
    "SetIntraOpNumThreads": (24, _Status, (_P, c_int)),
    "SetInterOpNumThreads": (25, _Status, (_P, c_int)),
    "CreateTensorAsOrtValue": (48, _Status, (_P, POINTER(c_int64), c_size_t, c_int, _OUT)),
    "CreateTensorWithDataAsOrtValue": (49, _Status, (_P, c_void_p, c_size_t, POINTER(c_int64), c_size_t, c_int, _OUT)),
    "GetTensorMutableData": (51, _Status, (_P, _OUT)),
    "FillStringTensor": (52, _Status, (_P, POINTER(c_char_p), c_size_t)),
    "GetStringTensorDataLength": (53, _Status, (_P, POINTER(c_size_t))),
    "GetStringTensorContent": (54, _Status, (_P, c_void_p, c_size_t, POINTER(c_size_t), c_size_t)),
    "GetTensorElementType": (60, _Status, (_P, POINTER(c_int))),
    "GetDimensionsCount": (61, _Status, (_P, POINTER(c_size_t))),
    "GetDimensions": (62, _Status, (_P, POINTER(c_int64), c_size_t)),
    "GetTensorShapeElementCount": (64, _Status, (_P, POINTER(c_size_t))),
    "GetTensorTypeAndShape": (65, _Status, (_P, _OUT)),
    "CreateCpuMemoryInfo": (69, _Status, (c_int, c_int, _OUT)),
    "GetAllocatorWithDefaultOptions": (78, _Status, (_OUT,)),
    "ReleaseStatus": (93, None, (_Status,)),
    "ReleaseMemoryInfo": (94, None, (_P,)),
    "ReleaseSession": (95, None, (_P,)),
    "ReleaseValue": (96, None, (_P,)),
    "ReleaseTensorTypeAndShapeInfo": (99, None, (_P,)),
    "ReleaseSessionOptions": (100, None, (_P,)),
    "AddSessionConfigEntry": (130, _Status, (_P, c_char_p, c_char_p)),
    "GetResizedStringTensorElementBuffer": (252, _Status, (_P, c_size_t, c_size_t, _OUT)),
}


class OrtError(Exception):
    """An error ONNX Runtime returned, worded as its Python API words it."""


def library_path() -> Path | None:
    """The libonnxruntime shipped beside the onnxruntime package's Python binding."""
    import onnxruntime

    folder = Path(onnxruntime.__file__).parent / "capi"
    pattern = "libonnxruntime.*dylib" if sys.platform == "darwin" else "libonnxruntime.so*"
    found = sorted(path for path in folder.glob(pattern) if "providers" not in path.name)
    return found[0] if found else None


class Api:
    """The OrtApi entries used here, as Python callables that raise OrtError."""

    def __init__(self, path: Path) -> None:
        self._lib = ctypes.CDLL(str(path))
        get_base = self._lib.OrtGetApiBase
        get_base.restype = POINTER(c_void_p)
        base = get_base()
        get_api = ctypes.CFUNCTYPE(c_void_p, c_uint32)(base[0])
        table_address = get_api(API_VERSION)
        if not table_address:
            raise OrtError(f"this ONNX Runtime does not offer its C API version {API_VERSION}")
        table = ctypes.cast(table_address, POINTER(c_void_p))
        for name, (index, result, arguments) in _ENTRIES.items():
            setattr(self, name, ctypes.CFUNCTYPE(result, *arguments)(table[index]))
        memory_info = c_void_p()
        self.check(self.CreateCpuMemoryInfo(1, 0, byref(memory_info)))  # arena allocator, default memory
        self.cpu = memory_info
        allocator = c_void_p()
        self.check(self.GetAllocatorWithDefaultOptions(byref(allocator)))
        self.allocator = allocator
        env = c_void_p()
        self.check(self.CreateEnv(3, b"turnout", byref(env)))  # errors only
        self.env = env

    def __getattr__(self, name: str) -> Any:  # the entries, set in __init__, for type checkers
        raise AttributeError(name)

    def check(self, status: int | None) -> None:
        if not status:
            return
        code = self.GetErrorCode(status)
        message = self.GetErrorMessage(status).decode("utf-8", errors="replace")
        self.ReleaseStatus(status)
        name = _ERROR_CODES[code] if 0 <= code < len(_ERROR_CODES) else str(code)
        raise OrtError(f"[ONNXRuntimeError] : {code} : {name} : {message}")


@functools.cache
def api() -> Api | None:
    """The C API, loaded once; None where the wheel ships no library to load."""
    path = library_path()
    if path is None:
        return None
    try:
        return Api(path)
    except (OSError, AttributeError, OrtError) as exc:
        log.warning("onnx runtime's C API could not be loaded from %s: %s", path, exc)
        return None


def supports(dtypes: Sequence[np.dtype[Any] | None]) -> bool:
    """Whether tensors of these dtypes (None: strings) can cross the C API here."""
    return all(dtype is None or dtype in _ELEMENT_TYPES for dtype in dtypes)


class Session:
    """One ONNX Runtime session opened and run through the C API."""

    def __init__(self, ort: Api, path: Path, intra_op: int, inter_op: int, config: dict[str, str]) -> None:
        self._api = ort
        options = c_void_p()
        ort.check(ort.CreateSessionOptions(byref(options)))
        try:
            ort.check(ort.SetIntraOpNumThreads(options, intra_op))
            ort.check(ort.SetInterOpNumThreads(options, inter_op))
            for key, value in config.items():
                ort.check(ort.AddSessionConfigEntry(options, key.encode(), value.encode()))
            session = c_void_p()
            ort.check(ort.CreateSession(ort.env, str(path).encode(), options, byref(session)))
        finally:
            ort.ReleaseSessionOptions(options)
        self._session: c_void_p | None = session
        self._names: dict[tuple[str, ...], Any] = {}  # C arrays of names, by the names

    def _c_names(self, names: tuple[str, ...]) -> Any:
        found = self._names.get(names)
        if found is None:
            if len(self._names) >= _NAME_ARRAYS:
                self._names.clear()
            found = self._names[names] = (c_char_p * len(names))(*(name.encode() for name in names))
        return found

    def run(self, output_names: Sequence[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        ort = self._api
        inputs: list[c_void_p] = []
        kept: list[np.ndarray] = []  # the arrays whose memory the session reads
        outputs = (c_void_p * len(output_names))()
        try:
            for array in feed.values():
                inputs.append(self._tensor(array, kept))
            names = self._c_names(tuple(feed))
            values = (c_void_p * len(inputs))(*(value.value for value in inputs))
            wanted = self._c_names(tuple(output_names))
            status = ort.Run(self._session, None, names, values, len(inputs), wanted, len(output_names), outputs)
            ort.check(status)
            return [self._array(output) for output in outputs]
        finally:
            for value in inputs:
                ort.ReleaseValue(value)
            for output in outputs:
                if output:
                    ort.ReleaseValue(output)

    def _tensor(self, array: np.ndarray, kept: list[np.ndarray]) -> c_void_p:
        ort = self._api
        shape = (c_int64 * array.ndim)(*array.shape)
        value = c_void_p()
        if array.dtype == np.object_ or array.dtype.kind in "SU":
            ort.check(ort.CreateTensorAsOrtValue(ort.allocator, shape, array.ndim, STRING, byref(value)))
            try:
                elements = [e if isinstance(e, bytes) else str(e).encode() for e in array.reshape(-1)]
                if elements and b"\0" not in b"".join(elements):  # C strings: one call fills them all
                    self._fill(value, elements)
                    return value
                buffer = c_void_p()
                for index, data in enumerate(elements):
                    ort.check(ort.GetResizedStringTensorElementBuffer(value, index, len(data), byref(buffer)))
                    ctypes.memmove(buffer, data, len(data))
            except BaseException:
                ort.ReleaseValue(value)
                raise
            return value
        rank = array.ndim
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # (which makes a scalar one-dimensional: rank is kept above)
        kept.append(array)
        code = _ELEMENT_TYPES[array.dtype]
        address = array.ctypes.data
        status = ort.CreateTensorWithDataAsOrtValue(ort.cpu, address, array.nbytes, shape, rank, code, byref(value))
        ort.check(status)
        return value

    def _fill(self, value: c_void_p, elements: list[bytes]) -> None:
        """FillStringTensor with the elements, which hold no NUL. Past a few elements, from
        one buffer of NUL-terminated elements, the pointers to them computed by numpy
        rather than built element by element by ctypes."""
        if len(elements) <= _FEW:
            self._api.check(self._api.FillStringTensor(value, (c_char_p * len(elements))(*elements), len(elements)))
            return
        joined = ctypes.create_string_buffer(b"\0".join(elements) + b"\0")
        lengths = np.fromiter(map(len, elements), dtype=np.uintp, count=len(elements)) + 1
        pointers = np.empty(len(elements), dtype=np.uintp)
        pointers[0] = ctypes.addressof(joined)
        np.cumsum(lengths[:-1], out=pointers[1:])
        pointers[1:] += pointers[0]
        table = ctypes.cast(pointers.ctypes.data, POINTER(c_char_p))
        self._api.check(self._api.FillStringTensor(value, table, len(elements)))

    def _array(self, value: int | None) -> np.ndarray:
        ort = self._api
        info = c_void_p()
        ort.check(ort.GetTensorTypeAndShape(value, byref(info)))
        try:
            code, rank, count = c_int(), c_size_t(), c_size_t()
            ort.check(ort.GetTensorElementType(info, byref(code)))
            ort.check(ort.GetDimensionsCount(info, byref(rank)))
            dims = (c_int64 * rank.value)()
            ort.check(ort.GetDimensions(info, dims, rank.value))
            ort.check(ort.GetTensorShapeElementCount(info, byref(count)))
        finally:
            ort.ReleaseTensorTypeAndShapeInfo(info)
        shape = tuple(dims)
        if code.value == STRING:
            return self._strings(value, count.value, shape)
        dtype = _DTYPES.get(code.value)
        if dtype is None:
            raise OrtError(f"[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : output element type {code.value}")
        data = c_void_p()
        ort.check(ort.GetTensorMutableData(value, byref(data)))
        size = count.value * dtype.itemsize
        raw = ctypes.string_at(data, size) if size else b""
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()

    def _strings(self, value: int | None, count: int, shape: tuple[int, ...]) -> np.ndarray:
        ort = self._api
        result = np.empty(count, dtype=np.object_)
        if not count:
            return result.reshape(shape)
        total = c_size_t()
        ort.check(ort.GetStringTensorDataLength(value, byref(total)))
        content = ctypes.create_string_buffer(max(total.value, 1))
        offsets = (c_size_t * count)()
        ort.check(ort.GetStringTensorContent(value, content, total.value, offsets, count))
        raw = content.raw[: total.value]
        ends = [*offsets[1:count], total.value]
        result[:] = [raw[start:end] for start, end in zip(offsets[:count], ends, strict=True)]
        return result.reshape(shape)

    def close(self) -> None:
        if self._session is not None:
            self._api.ReleaseSession(self._session)
            self._session = None
