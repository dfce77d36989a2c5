"""Request validation against a model's signature, with Triton's texts, and the one
decode of each input into numpy (typed `contents` or `raw_input_contents`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protos import codec
from protos import grpc_service_pb2 as pb
from protos import model_config_pb2 as mc
from protos.datatypes import BY_CONFIG_NAME, BY_NAME, DataType
from protos.input_order import core_order
from protos.memo import Memo
from protos.sequence import SequenceFlags, read_sequence
from protos.status import TurnoutError, invalid_arg, unsupported

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class TensorSpec:
    """One config input or output: protocol datatype, dims (no batch dim), reshape."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None
    optional: bool = False
    label_filename: str = ""


def _spec(tensor: mc.ModelInput | mc.ModelOutput) -> TensorSpec:
    datatype = BY_CONFIG_NAME[mc.DataType.Name(tensor.data_type)]
    reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
    return TensorSpec(
        name=tensor.name,
        datatype=datatype,
        dims=tuple(tensor.dims),
        reshape=reshape,
        optional=getattr(tensor, "optional", False),
        label_filename=getattr(tensor, "label_filename", ""),
    )


# Request forms remembered per signature (validate), and output metadata serialized per
# signature (sidecars.responses.encode_response): past these, forgotten and learned again.
FORMS_PER_SIGNATURE = 64
ENCODED_OUTPUTS_PER_SIGNATURE = 256


class Signature:
    """What a model version accepts and returns, precomputed once per load."""

    def __init__(self, config: mc.ModelConfig) -> None:
        self.model = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs = {t.name: _spec(t) for t in config.input}
        self.outputs = {t.name: _spec(t) for t in config.output}
        self.required = [name for name, spec in self.inputs.items() if not spec.optional]
        # The forms of requests found valid, with what checking them found (validate's
        # fast path): a client sends one form on every request.
        self.forms: Memo[tuple[Any, ...], _Form] = Memo(FORMS_PER_SIGNATURE)
        # Each output's response metadata, serialized, by (name, datatype, shape)
        # (sidecars.responses.encode_response).
        self.encoded_outputs: Memo[tuple[str, str, tuple[int, ...]], tuple[bytes, bytes | None]] = Memo(
            ENCODED_OUTPUTS_PER_SIGNATURE
        )

    def full_dims(self, spec: TensorSpec) -> list[int]:
        return [-1, *spec.dims] if self.max_batch_size > 0 else list(spec.dims)


@dataclass(frozen=True)
class Answer:
    """One request's outputs from a model instance, and the response parameters its model set."""

    outputs: dict[str, np.ndarray]
    parameters: Mapping[str, bool | int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    class_count: int  # 0 = the tensor itself, k > 0 = top-k classification strings


@dataclass
class ValidRequest:
    """A request ready for the batcher: model-shaped inputs and what to send back."""

    id: str
    inputs: dict[str, np.ndarray]
    batch_size: int  # rows along dim 0; 1 for models without batching
    key: tuple[Any, ...]  # requests with equal keys may share a batch
    outputs: list[RequestedOutput]
    priority: int
    timeout_us: int | None
    sequence: SequenceFlags | None = None
    # The request's own parameters, for frameworks that hand them to the model (python):
    # those Triton's core reads itself (sequence, priority, timeout) are left out.
    parameters: dict[str, bool | int | float | str] = field(default_factory=dict)
    # A decoupled model's responses, as its instance sends them: each response (or error)
    # and whether it is the last; None with True ends the request without one.
    responses: Callable[[Answer | TurnoutError | None, bool], None] | None = None
    cancelled: bool = False  # its client gave up on it (set on the event loop, read by any thread)
    # Its batcher took it. A request refused before (by these checks, a full queue, the
    # sequence rules) never reached the model, and Triton leaves it out of its statistics.
    queued: bool = False


def _names_text(names: Any) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _uint_parameter(parameter: pb.InferParameter) -> int:
    which = parameter.WhichOneof("parameter_choice")
    if which == "int64_param":
        return parameter.int64_param
    if which == "uint64_param":
        return parameter.uint64_param
    return 0


@dataclass(frozen=True)
class _Decode:
    """One input of a remembered form: where its bytes are, how many, and the array they make."""

    position: int
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # as the request gives it (the batch dim included)
    size: int  # its bytes
    model_shape: tuple[int, ...] | None  # the config's reshape, if any


@dataclass(frozen=True)
class _Form:
    """What checking a request of one form found, all but its data: each input's decode
    in core's order, the batch size and key, and the outputs to send."""

    decodes: tuple[_Decode, ...]
    batch_size: int
    key: tuple[Any, ...]
    outputs: tuple[RequestedOutput, ...]


def form_of(request: pb.ModelInferRequest) -> tuple[Any, ...] | None:
    """Everything Triton's checks read in a request but its id and its data (each input's
    name, datatype and shape, the number of raw buffers, the outputs' names), when that is
    all they read: no parameters on the request, its inputs or its outputs, and no typed
    contents. None for any other request."""
    if request.parameters:
        return None
    inputs = []
    for tensor in request.inputs[:]:
        if tensor.parameters or tensor.HasField("contents"):
            return None
        inputs.append((tensor.name, tensor.datatype, tuple(tensor.shape[:])))  # sliced: no IndexError
    outputs = []
    for output in request.outputs[:]:
        if output.parameters:
            return None
        outputs.append(output.name)
    return tuple(inputs), tuple(outputs), len(request.raw_input_contents)


def _decoded(raw: Sequence[bytes | memoryview], request_id: str, form: _Form) -> ValidRequest | None:
    """A request of a form found valid before, its inputs decoded from its raw buffers;
    None when a buffer's size is not the form's (the full check then words the mismatch)."""
    inputs: dict[str, np.ndarray] = {}
    for decode in form.decodes:
        buffer = raw[decode.position]
        if len(buffer) != decode.size:
            return None
        array = np.frombuffer(buffer, decode.dtype).reshape(decode.shape)
        inputs[decode.name] = array if decode.model_shape is None else array.reshape(decode.model_shape)
    return ValidRequest(request_id, inputs, form.batch_size, form.key, list(form.outputs), 0, None)


def validate_known(raw: Sequence[memoryview], form_key: tuple[Any, ...], signature: Signature) -> ValidRequest | None:
    """validate for a request known only by its form (`form_of` of a request like it: no
    id, no parameters) and its raw buffers, read where they lie in the serialized request;
    None unless that form was found valid and each buffer has the form's size (validate
    of the parsed request then checks it in full)."""
    form = signature.forms.get(form_key)
    if form is None or len(raw) != form_key[2]:
        return None
    return _decoded(raw, "", form)


def validate(request: pb.ModelInferRequest, signature: Signature) -> ValidRequest:
    """Check a request as Triton's core does and decode its inputs once.

    In Triton's order: what building the request checks (repeated names, each input's
    data, in request order), then core's Normalize: requested outputs, the input count,
    the batch size, and each input's data type, shape and byte size, walking the inputs
    in the order core's map of them does (`protos.input_order`).

    The checks read nothing of a request without parameters or typed contents but its
    form (`form_of`) and its buffers' sizes, so once a form is found valid, the next
    request of that form only has its buffers' sizes checked and its inputs decoded."""
    form_key = form_of(request)
    if form_key is not None:
        form = signature.forms.get(form_key)
        if form is not None:
            valid = _decoded(request.raw_input_contents, request.id, form)
            if valid is not None:
                return valid
    valid, decodes = _validate(request, signature)
    if form_key is not None and decodes is not None:
        form = _Form(tuple(decodes), valid.batch_size, valid.key, tuple(valid.outputs))
        signature.forms.remember(form_key, form)
    return valid


def _validate(request: pb.ModelInferRequest, signature: Signature) -> tuple[ValidRequest, list[_Decode] | None]:
    """validate's checks in full; with the request, how each input was decoded (None
    where a BYTES input's elements, not its size, decide)."""
    model = signature.model
    prefix = f"[request id: {request.id or '<id_unknown>'}] "
    parameters = request.parameters
    plain = bool(parameters) and PLAIN_PARAMETERS in parameters
    if parameters and not plain:
        _check_parameters(parameters)
    # Triton refuses a repeated name as it builds the request, before checking it.
    _refuse_repeats((tensor.name for tensor in request.inputs), "input", prefix)
    _refuse_repeats((output.name for output in request.outputs), "output", prefix)
    tensors = request.inputs
    raw = request.raw_input_contents
    for position, tensor in enumerate(tensors):  # each input's data, as the request is built
        if tensor.parameters:
            _check_no_region(tensor.name, tensor.parameters, model)
        if raw and tensor.HasField("contents"):
            raise invalid_arg(
                f"contents field must not be specified when using raw_input_contents for '{tensor.name}' "
                f"for model '{model}'"
            )
        if tensor.HasField("contents"):
            _check_contents(tensor, model)
        elif position >= len(raw):
            raise _no_data(tensor.name, model)
    outputs = _requested_outputs(request, signature)
    walk = _walk(tuple([tensor.name for tensor in tensors]))
    if not len(signature.required) <= len(walk) <= len(signature.inputs):
        _refuse_count([tensors[i].name for i in walk], signature, prefix)
    specs: dict[int, TensorSpec] = {}  # each input's config, looked up in core's order

    batched = signature.max_batch_size > 0
    batch_size = 1
    if batched:
        batch_size = 0  # the first input with rows sets it, as in core
        for position in walk:
            tensor = tensors[position]
            specs[position] = _spec_of(tensor.name, signature)
            if not tensor.shape:
                raise invalid_arg(
                    f"{prefix}input '{tensor.name}' has no shape but model requires batch dimension for '{model}'"
                )
            if batch_size == 0:
                batch_size = tensor.shape[0] % 2**32  # core keeps it in a uint32
            elif tensor.shape[0] != batch_size:
                raise invalid_arg(f"{prefix}input '{tensor.name}' batch size does not match other inputs for '{model}'")
        if batch_size > signature.max_batch_size:
            raise invalid_arg(
                f"{prefix}inference request batch-size must be <= {signature.max_batch_size} for '{model}'"
            )
    else:
        specs = {position: _spec_of(tensors[position].name, signature) for position in walk}

    inputs: dict[str, np.ndarray] = {}
    key: list[Any] = []
    decodes: list[_Decode] | None = []
    unbatched = ""  # the first input with data for a batch of 0 rows
    for position, spec in specs.items():
        tensor = tensors[position]
        if tensor.datatype != spec.datatype.name:
            declared = tensor.datatype if tensor.datatype in BY_NAME else "<invalid>"  # as Triton prints one it lacks
            raise invalid_arg(
                f"{prefix}inference input '{tensor.name}' data-type is '{declared}', "
                f"but model '{model}' expects '{spec.datatype.name}'"
            )
        shape = list(tensor.shape)
        element_shape = shape[1:] if batched else shape
        _check_dims(tensor.name, spec, element_shape, shape, signature, prefix)
        # Core's shape with the batch dim: none at all while the batch size is 0.
        full_shape = [batch_size, *element_shape] if batched and batch_size else element_shape
        size = _core_size(spec.datatype, full_shape, tensor.name)
        if tensor.HasField("contents"):
            array = _from_contents(tensor.contents, spec, full_shape, size, prefix, model)
        else:
            array = _from_raw(raw[position], spec, full_shape, size, prefix, model)
        if batched and not batch_size:
            # Data for rows the shape does not hold: Triton would hand the model a tensor
            # without its batch dim; no batch can carry that. Refused once every input
            # passed Triton's own checks, so their errors come first.
            unbatched = unbatched or tensor.name
            continue
        model_shape = None
        if spec.reshape is not None:
            model_shape = (batch_size, *spec.reshape) if batched else spec.reshape
            array = array.reshape(model_shape)
        if spec.datatype.name == "BYTES":
            decodes = None  # its elements, not its size, decide
        elif decodes is not None:
            assert spec.datatype.wire is not None  # as codec.from_raw has just asserted
            decodes.append(_Decode(position, tensor.name, spec.datatype.wire, tuple(full_shape), size, model_shape))
        inputs[tensor.name] = array
        key.append((tensor.name, array.shape[1:] if batched else array.shape))

    if unbatched:
        raise invalid_arg(f"{prefix}input '{unbatched}' holds data but a batch size of 0 for '{model}'")
    key.sort()
    if plain:
        own = {name: value for name, value in _values(parameters) if name != PLAIN_PARAMETERS}
        return ValidRequest(request.id, inputs, max(batch_size, 1), tuple(key), outputs, 0, None, None, own), None
    priority = _uint_parameter(parameters["priority"]) if "priority" in parameters else 0
    # A negative int64 timeout is a uint64 to Triton: no timeout to speak of.
    timeout = _uint_parameter(parameters["timeout"]) % 2**64 if "timeout" in parameters else None
    sequence = read_sequence(parameters) if "sequence_id" in parameters or "sequence_start" in parameters else None
    own = _own_parameters(parameters) if parameters else {}
    valid = ValidRequest(request.id, inputs, max(batch_size, 1), tuple(key), outputs, priority, timeout, sequence, own)
    return valid, decodes


@functools.lru_cache(maxsize=1024)
def _walk(names: tuple[str, ...]) -> list[int]:
    return core_order(names)


def _spec_of(name: str, signature: Signature) -> TensorSpec:
    spec = signature.inputs.get(name)
    if spec is None:
        raise invalid_arg(f"unexpected inference input '{name}' for model '{signature.model}'")
    return spec


def _refuse_count(walked: list[str], signature: Signature, prefix: str) -> None:
    """Core's ValidateRequestInputs refusing a number of inputs, its texts to the letter
    (the names given in the order it walks them; with nothing missing, its list of
    missing names comes out as a lone ']')."""
    given, total, required = len(walked), len(signature.inputs), len(signature.required)
    present = set(walked)
    missing = [name for name in signature.required if name not in present]
    missing_text = _names_text(missing) if missing else "]"
    if required == total:
        expected = f"expected {total} inputs"
    else:
        expected = f"expected number of inputs between {required} and {total}"
    raise invalid_arg(
        f"{prefix}{expected} but got {given} inputs for model '{signature.model}'. "
        f"Got input(s) {_names_text(walked)}, but missing required input(s) {missing_text}. "
        "Please provide all required input(s)."
    )


def _check_dims(
    name: str, spec: TensorSpec, element_shape: list[int], shape: list[int], signature: Signature, prefix: str
) -> None:
    model = signature.model
    matches = len(spec.dims) == len(element_shape)
    if matches:
        for expected, got in zip(spec.dims, element_shape, strict=True):
            if got == -1:
                raise invalid_arg(
                    f"{prefix}All input dimensions should be specified for input '{name}' for model '{model}', "
                    f"got {codec.shape_text(shape)}"
                )
            if expected != -1 and expected != got:
                matches = False
                break
    if matches:
        return
    note = ""  # without it the text still ends in ". ", as Triton's does
    if signature.max_batch_size > 0:
        note = (
            "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be"
            " prepended to each input shape. If you want to specify the full shape including the batch dim"
            " in your input dims config, try setting max_batch_size to zero. See the model configuration"
            " docs for more info on max_batch_size."
        )
    raise invalid_arg(
        f"{prefix}unexpected shape for input '{name}' for model '{model}'. "
        f"Expected {codec.shape_text(signature.full_dims(spec))}, got {codec.shape_text(shape)}. {note}"
    )


# What Triton's gRPC front lets each request parameter hold (its own checks and words);
# uint64 ids and timeouts come from the HTTP front, for values past int64.
_PARAMETER_KINDS = {
    "sequence_id": (("int64_param", "string_param"), "int64_param or string_param"),
    "sequence_start": (("bool_param",), "bool_param"),
    "sequence_end": (("bool_param",), "bool_param"),
    "priority": (("int64_param", "uint64_param"), "int64_param or uint64_param"),
    "timeout": (("int64_param",), "int64_param"),
    "triton_enable_empty_final_response": (("bool_param",), "bool_param"),
}
_ANY_KIND = (("int64_param", "bool_param", "string_param", "double_param"), "int64_param, bool_param, or string_param")
_TRITON_PARAMETERS = ("triton_enable_empty_final_response",)


def _check_parameters(parameters: Any) -> None:
    for key, parameter in parameters.items():
        if key.startswith("triton_") and key not in _TRITON_PARAMETERS:
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
                "starting with 'triton_' are allowed: " + " ".join(_TRITON_PARAMETERS)
            )
        kinds, words = _PARAMETER_KINDS.get(key, _ANY_KIND)
        if parameter.WhichOneof("parameter_choice") not in kinds:
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected {words}.")
        if key == "priority" and parameter.HasField("int64_param") and parameter.int64_param < 0:
            raise invalid_arg("invalid value for 'priority', expected value >= 0.")


# Set by the gateway on a generate request: as Triton passes the generate extension's keys,
# every parameter is the model's own, none checked or read as priority, timeout or sequence.
PLAIN_PARAMETERS = "turnout_plain_parameters"

# Parameters Triton's core consumes; a model never sees them.
_CORE_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output", "headers"}
)


def _own_parameters(parameters: Any) -> dict[str, bool | int | float | str]:
    return {
        key: value
        for key, value in _values(parameters)
        if key not in _CORE_PARAMETERS and not key.startswith("triton_")
    }


def _values(parameters: Any) -> Iterator[tuple[str, bool | int | float | str]]:
    for key, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        if which is not None:
            yield key, getattr(parameter, which)


def _refuse_repeats(names: Iterable[str], kind: str, prefix: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise invalid_arg(f"{prefix}{kind} '{name}' already exists in request")
        seen.add(name)


def _core_size(datatype: DataType, shape: list[int], name: str) -> int:
    """What core's GetByteSize makes of a shape (GetElementCount for BYTES): the bytes
    (elements) it holds, -1 for a wildcard dim; an invalid dim or a size past int64 is
    refused in its words."""
    count, first = 0, True  # an empty shape holds 0, as in core
    for dim in shape:
        if dim == -1:
            count = -1
            break
        if dim < 0:
            where = " in shape " if datatype.name == "BYTES" else " "
            raise invalid_arg(f"tensor '{name}' contains an invalid dimension{where}{codec.shape_text(shape)}")
        if first:
            count, first = dim, False
        elif dim and count > _INT64_MAX // dim:
            kind = "element count" if datatype.name == "BYTES" else "byte size"
            raise invalid_arg(f"{kind} for tensor '{name}' exceeds maximum size of {_INT64_MAX}")
        else:
            count *= dim
    if count == -1:
        return -1
    unit = datatype.size or 4  # BYTES: the 4-byte length of each element at least
    if count > _INT64_MAX // unit:
        raise invalid_arg(f"byte size for tensor '{name}' exceeds maximum size of {_INT64_MAX}")
    return count if datatype.name == "BYTES" else count * datatype.size


# Typed contents, in the order Triton's gRPC front reads them, with the datatype each
# holds (int_contents and uint_contents also carry the narrower integers).
_CONTENTS = (
    ("bool_contents", ("BOOL",)),
    ("int_contents", ("INT8", "INT16", "INT32")),
    ("int64_contents", ("INT64",)),
    ("uint_contents", ("UINT8", "UINT16", "UINT32")),
    ("uint64_contents", ("UINT64",)),
    ("fp32_contents", ("FP32",)),
    ("fp64_contents", ("FP64",)),
    ("bytes_contents", ("BYTES",)),
)


def _check_contents(tensor: pb.ModelInferRequest.InferInputTensor, model: str) -> None:
    """Triton's gRPC front on typed contents: one list at most, of the datatype the
    input declares."""
    declared = tensor.datatype if tensor.datatype in BY_NAME else "<invalid>"
    supplied = False
    for field_name, holds in _CONTENTS:
        if not getattr(tensor.contents, field_name):
            continue
        where = f"unexpected explicit tensor data for input tensor '{tensor.name}' for model '{model}'"
        if supplied:
            raise invalid_arg(f"{where}, binary data was already supplied.")
        if declared not in holds:
            raise invalid_arg(f"{where} of type '{holds[-1]}', expected datatype '{declared}'")
        supplied = True


def _check_no_region(tensor: str, parameters: Any, model: str) -> None:
    """The gateway resolves a tensor's shared memory region before the request comes here;
    what is left of one is Triton's error."""
    if "shared_memory_region" in parameters:
        raise unsupported(f"shared memory tensor '{tensor}' must be resolved by the gateway before model '{model}'")
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key in parameters:
            raise invalid_arg(
                f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{tensor}'"
            )


def _no_data(name: str, model: str) -> TurnoutError:
    return invalid_arg(f"unable to find data for input tensor '{name}' for model '{model}' in request.")


def _requested_outputs(request: pb.ModelInferRequest, signature: Signature) -> list[RequestedOutput]:
    """The outputs to send back. Triton's gRPC front reads each one's `classification`
    (an int64 above 0) before its core checks the names."""
    counts = []
    for output in request.outputs:
        if output.parameters:
            _check_no_region(output.name, output.parameters, signature.model)
        count = 0
        if "classification" in output.parameters:
            parameter = output.parameters["classification"]
            if parameter.WhichOneof("parameter_choice") != "int64_param":
                raise invalid_arg("invalid value type for 'classification' parameter, expected int64_param")
            count = parameter.int64_param
            if count <= 0:
                raise invalid_arg("invalid value for 'classification' parameter, expected >= 0")
        counts.append(count)
    if not request.outputs:
        return [RequestedOutput(name, 0) for name in signature.outputs]
    requested = []
    for output, count in zip(request.outputs, counts, strict=True):
        if output.name not in signature.outputs:
            raise invalid_arg(f"unexpected inference output '{output.name}' for model '{signature.model}'")
        requested.append(RequestedOutput(output.name, count))
    return requested


def _from_raw(buffer: bytes, spec: TensorSpec, shape: list[int], size: int, prefix: str, model: str) -> np.ndarray:
    """`size`: the bytes the shape holds (its elements for BYTES), from `_core_size`."""
    datatype = spec.datatype
    if datatype.name == "BYTES":
        try:
            if size < 0:
                raise codec.CodecError("a wildcard dim")
            return codec.from_raw(buffer, datatype, shape)
        except codec.CodecError:
            raise invalid_arg(prefix + _bytes_problem(buffer, size, spec.name, model)) from None
    if len(buffer) != size:
        raise invalid_arg(
            f"{prefix}input byte size mismatch for input '{spec.name}' for model '{model}'. "
            f"Expected {size}, got {len(buffer)}"
        )
    return codec.from_raw(buffer, datatype, shape)


def _bytes_problem(buffer: bytes, expected: int, name: str, model: str) -> str:
    """Word why a BYTES buffer does not hold `expected` elements, as Triton does."""
    offset, count = 0, 0
    while offset < len(buffer):
        remaining = len(buffer) - offset
        if remaining < 4:
            return (
                f"incomplete string length indicator for inference input '{name}' for model '{model}', "
                f"expecting 4 bytes but only {remaining} bytes available. "
                "Please make sure the string length indicator is in one buffer."
            )
        length = int.from_bytes(buffer[offset : offset + 4], "little")
        offset += 4
        if len(buffer) - offset < length:
            return (
                f"incomplete string data for inference input '{name}' for model '{model}', "
                f"expecting string of length {length} but only {len(buffer) - offset} bytes available."
            )
        offset += length
        count += 1
    return f"expected {expected} string elements for inference input '{name}' for model '{model}', got {count}"


def _from_contents(
    contents: pb.InferTensorContents, spec: TensorSpec, shape: list[int], size: int, prefix: str, model: str
) -> np.ndarray:
    datatype = spec.datatype
    # FP16 and BF16 have no list: contents for them can only be empty.
    values = getattr(contents, datatype.contents_field) if datatype.contents_field else []
    if datatype.name == "BYTES":
        if len(values) != size:
            raise invalid_arg(
                f"{prefix}expected {size} string elements for inference input '{spec.name}' for model '{model}', "
                f"got {len(values)}"
            )
    elif len(values) * datatype.size != size:
        raise invalid_arg(
            f"{prefix}input byte size mismatch for input '{spec.name}' for model '{model}'. "
            f"Expected {size}, got {len(values) * datatype.size}"
        )
    return codec.from_contents(values, datatype, shape)
