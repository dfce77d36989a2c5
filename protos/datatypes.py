"""The tensor datatypes of the v2 protocol: names, config enums, numpy types and sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

try:  # BF16 travels as ml_dtypes.bfloat16, as tritonclient sends it; optional here.
    import ml_dtypes

    _BF16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes ships with tritonclient and onnx
    _BF16 = None


@dataclass(frozen=True)
class DataType:
    """One protocol datatype. `size` is bytes per element, 0 for variable-size BYTES."""

    name: str  # as in requests and metadata: "INT32"
    config_name: str  # as in config.pbtxt: "TYPE_INT32"
    numpy: np.dtype | None
    size: int
    contents_field: str | None  # InferTensorContents field for typed gRPC contents
    json: bool  # may travel as JSON `data`
    # `numpy` as raw contents hold it (little-endian), made once: newbyteorder builds a
    # new dtype at every call.
    wire: np.dtype | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        wire = None if self.numpy is None or self.size == 0 else self.numpy.newbyteorder("<")
        object.__setattr__(self, "wire", wire)


_TABLE = [
    DataType("BOOL", "TYPE_BOOL", np.dtype(np.bool_), 1, "bool_contents", True),
    DataType("UINT8", "TYPE_UINT8", np.dtype(np.uint8), 1, "uint_contents", True),
    DataType("UINT16", "TYPE_UINT16", np.dtype(np.uint16), 2, "uint_contents", True),
    DataType("UINT32", "TYPE_UINT32", np.dtype(np.uint32), 4, "uint_contents", True),
    DataType("UINT64", "TYPE_UINT64", np.dtype(np.uint64), 8, "uint64_contents", True),
    DataType("INT8", "TYPE_INT8", np.dtype(np.int8), 1, "int_contents", True),
    DataType("INT16", "TYPE_INT16", np.dtype(np.int16), 2, "int_contents", True),
    DataType("INT32", "TYPE_INT32", np.dtype(np.int32), 4, "int_contents", True),
    DataType("INT64", "TYPE_INT64", np.dtype(np.int64), 8, "int64_contents", True),
    DataType("FP16", "TYPE_FP16", np.dtype(np.float16), 2, None, False),
    DataType("FP32", "TYPE_FP32", np.dtype(np.float32), 4, "fp32_contents", True),
    DataType("FP64", "TYPE_FP64", np.dtype(np.float64), 8, "fp64_contents", True),
    DataType("BF16", "TYPE_BF16", _BF16, 2, None, False),
    DataType("BYTES", "TYPE_STRING", np.dtype(np.object_), 0, "bytes_contents", True),
]

BY_NAME: dict[str, DataType] = {t.name: t for t in _TABLE}
BY_CONFIG_NAME: dict[str, DataType] = {t.config_name: t for t in _TABLE}


def from_name(name: str) -> DataType | None:
    return BY_NAME.get(name)


def from_config_name(config_name: str) -> DataType | None:
    return BY_CONFIG_NAME.get(config_name)


def from_numpy(dtype: np.dtype) -> DataType | None:
    """The protocol datatype of a numpy dtype (str and bytes arrays are BYTES)."""
    if dtype.kind in ("O", "S", "U"):
        return BY_NAME["BYTES"]
    for t in _TABLE:
        if t.numpy is not None and t.numpy == dtype and t.name != "BYTES":
            return t
    return None
