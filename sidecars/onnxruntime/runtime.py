"""ONNX Runtime models: one InferenceSession per instance, each run on its own thread, on
the execution providers its instance group and accelerators ask for."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from protos import model_config_pb2 as mc
from protos.status import internal
from sidecars.backend_checks import config_dims, require_model_file
from sidecars.config import model_file
from sidecars.onnxruntime import capi
from sidecars.onnxruntime.autocomplete import auto_complete
from sidecars.onnxruntime.checks import check_session
from sidecars.onnxruntime.providers import (
    CPU,
    CUDA,
    Placement,
    Provider,
    cuda_device_count,
    instance_devices,
    place,
)
from sidecars.runtime import ModelInstance, Tensors, ThreadedInstance
from sidecars.sequence_config import sequence_inputs, state_outputs

log = logging.getLogger(__name__)

# Triton's onnxruntime_backend parameter names, honoured from config `parameters`.
_INTRA_OP = "intra_op_thread_count"
_INTER_OP = "inter_op_thread_count"


class OnnxRuntime:
    """The `onnxruntime` framework. Options come from `--backend-config` (unused so far)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self._available = set(ort.get_available_providers())

    def gpu_count(self) -> int:
        # A CPU-only build cannot use a GPU even where one is present.
        return cuda_device_count() if CUDA in self._available else 0

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        def read_signature() -> tuple[list[Any], list[Any]]:
            session = _open(_model_path(config, version_dir), ort.SessionOptions(), [CPU])
            return session.get_inputs(), session.get_outputs()

        auto_complete(config, read_signature, default_max_batch_size)

    def load(self, config: mc.ModelConfig, version_dir: Path, first: Sequence[int] = ()) -> list[ModelInstance]:
        path = _model_path(config, version_dir)
        options = _session_options(config)
        instances: list[ModelInstance] = []
        for number, group in enumerate(config.instance_group):
            start = first[number] if number < len(first) else 0
            for index, device in enumerate(instance_devices(group)):
                if index % group.count < start:
                    continue
                name = f"{group.name}_{index}"
                placement = place(config, device, self._available)
                for warning in placement.warnings:
                    log.warning("model '%s' instance '%s' (cuda:%s): %s", config.name, name, device, warning)
                if placement.device != "cpu":
                    preload_gpu_libraries()
                session = _open(path, options, placement.providers)
                _warn_on_fallback(config.name, name, placement, session)
                check_session(config, session)
                strings = _string_session(config, path) if placement.device == "cpu" else None
                instances.append(OnnxInstance(name, session, config, strings))
        return instances


@functools.cache
def preload_gpu_libraries() -> None:
    """Load CUDA and cuDNN from the nvidia-* wheels (onnxruntime-gpu[cuda,cudnn]) before
    the first GPU session, as onnxruntime-gpu asks of pip installs; system-wide CUDA
    libraries are still found the usual way when the wheels are absent."""
    if not hasattr(ort, "preload_dlls"):  # before onnxruntime 1.21
        return
    try:
        ort.preload_dlls()
    except Exception as exc:  # a missing wheel is fine: the loader then searches the system
        log.info("onnxruntime could not preload CUDA libraries from wheels: %s", exc)


def _warn_on_fallback(model: str, instance: str, placement: Placement, session: ort.InferenceSession) -> None:
    """ONNX Runtime drops a provider it cannot start (missing CUDA or TensorRT libraries)
    with only its own log line; say which instance that left on which providers."""
    wanted = [provider if isinstance(provider, str) else provider[0] for provider in placement.providers]
    used = session.get_providers()
    missing = [provider for provider in wanted if provider not in used]
    if missing:
        log.warning(
            "model '%s' instance '%s' (%s): %s could not start; running on %s",
            model,
            instance,
            placement.device,
            ", ".join(missing),
            ", ".join(used),
        )


def _model_path(config: mc.ModelConfig, version_dir: Path) -> Path:
    path = model_file(config, version_dir)
    if path.is_dir():  # Triton accepts a folder holding model.onnx (external data)
        path = path / "model.onnx"
    require_model_file(path, config.name)
    return path


def _session_options(config: mc.ModelConfig) -> ort.SessionOptions:
    options = ort.SessionOptions()
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    # As Triton's backend: ONNX Runtime's own default (one thread per core) unless set.
    options.intra_op_num_threads = _int_parameter(parameters, _INTRA_OP, 0)
    options.inter_op_num_threads = _int_parameter(parameters, _INTER_OP, 1)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Idle pool threads would spin on cores the gateway and the other instances need;
    # on a shared machine that costs more throughput than the wake-up it saves.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


# The config types whose tensors cross ONNX Runtime's C API (capi); BF16 does not.
_C_API_TYPES = {
    mc.TYPE_BOOL,
    mc.TYPE_UINT8,
    mc.TYPE_UINT16,
    mc.TYPE_UINT32,
    mc.TYPE_UINT64,
    mc.TYPE_INT8,
    mc.TYPE_INT16,
    mc.TYPE_INT32,
    mc.TYPE_INT64,
    mc.TYPE_FP16,
    mc.TYPE_FP32,
    mc.TYPE_FP64,
    mc.TYPE_STRING,
}


def _string_session(config: mc.ModelConfig, path: Path) -> capi.Session | None:
    """A CPU model with string tensors runs through ONNX Runtime's C API, where every
    element's bytes cross by length (capi); None for any other model, or where the C API
    cannot be loaded (its Python API then runs it, UTF-8 and NUL limits and all)."""
    tensors = [*config.input, *config.output]
    types = {tensor.data_type for tensor in tensors} | {data_type for _, data_type in sequence_inputs(config)}
    if mc.TYPE_STRING not in types or not types <= _C_API_TYPES:
        return None
    ort_api = capi.api()
    if ort_api is None:
        return None
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    try:
        return capi.Session(
            ort_api,
            path,
            intra_op=_int_parameter(parameters, _INTRA_OP, 0),
            inter_op=_int_parameter(parameters, _INTER_OP, 1),
            config={"session.intra_op.allow_spinning": "0"},
        )
    except capi.OrtError as exc:
        raise internal(f"onnx runtime error: {exc}") from exc


def _int_parameter(parameters: dict[str, str], key: str, default: int) -> int:
    value = parameters.get(key, "")
    try:
        number = int(value)
    except ValueError:
        return default
    return number if number > 0 else default


def _open(path: Path, options: ort.SessionOptions, providers: list[Provider]) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types for bad models
        raise internal(f"onnx runtime error: {exc}") from exc


class OnnxInstance(ThreadedInstance):
    def __init__(
        self, name: str, session: ort.InferenceSession, config: mc.ModelConfig, strings: capi.Session | None = None
    ) -> None:
        super().__init__(name)
        self._session: ort.InferenceSession | None = session
        # The binding's own run: InferenceSession.run checks the feed's names against the
        # model's (ours are the config's, checked already) before it calls this.
        self._run: Any = getattr(session, "_sess", session).run
        self._c_session = strings
        # Implicit state outputs come back beside the config's, for the sequence batcher.
        self._outputs = [output.name for output in config.output] + [name for name, _ in state_outputs(config)]
        inputs = [(tensor.name, tensor.data_type) for tensor in config.input] + sequence_inputs(config)
        self._strings = {name for name, data_type in inputs if data_type == mc.TYPE_STRING}
        # As Triton's backend: a rank-0 model input takes its one element whatever dims the
        # config gives it (all ones), and a rank-0 model output comes back in the config's.
        self._scalar_inputs = {arg.name for arg in session.get_inputs() if not arg.shape}
        scalar_outputs = {arg.name for arg in session.get_outputs() if not arg.shape}
        self._scalar_outputs = {t.name: config_dims(t) for t in config.output if t.name in scalar_outputs}
        if strings is not None:  # runs through the C API: the Python session is not needed
            self._run = lambda names, feed, _options: strings.run(names, feed)
            self._strings = set()  # elements cross as the bytes they are
            self._session = None

    def run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        feed: dict[str, Any] = dict(inputs)
        for name in self._strings:
            if name in feed:
                feed[name] = _as_strings(feed[name])
        for name in self._scalar_inputs:
            if name in feed and feed[name].size == 1:
                feed[name] = feed[name].reshape(())
        try:
            results = self._run(self._outputs, feed, None)
        except UnicodeDecodeError as exc:
            raise internal(f"onnx runtime error: {_NOT_UTF8_OUTPUT}") from exc
        except Exception as exc:  # ORT's errors carry its own message
            raise internal(f"onnx runtime error: {exc}") from exc
        outputs = dict(zip(self._outputs, results, strict=True))
        for name, dims in self._scalar_outputs.items():
            if outputs[name].ndim == 0:
                outputs[name] = outputs[name].reshape(dims)
        return outputs

    def close(self) -> None:
        super().close()
        del self._session, self._run
        if self._c_session is not None:
            self._c_session.close()


# ONNX Runtime's Python API hands string outputs back as str, decoding them strictly.
_NOT_UTF8_OUTPUT = "a string output holds bytes that are not valid UTF-8, which ONNX Runtime's Python API cannot return"


def _as_strings(array: np.ndarray) -> np.ndarray:
    """BYTES as ONNX Runtime's string tensors, holding the bytes the client sent.

    Its Python API takes a str element as its UTF-8 (NUL bytes kept), a bytes element of a
    numpy "S" array as a C string (up to its first NUL), and would take a bytes object in
    an object array as its repr ("b'..'"). So UTF-8 tensors travel as str, exactly; any
    other tensor travels as "S" elements one byte wider than the longest, each ending in
    a NUL: every byte reaches the model up to an element's first NUL, which is where
    Triton's own ONNX Runtime backend ends an element too (it fills string tensors from
    NUL-terminated C strings)."""
    flat = array.reshape(-1)
    elements = [e if isinstance(e, bytes) else str(e).encode() for e in flat]
    try:
        text = [e.decode("utf-8") for e in elements]
    except UnicodeDecodeError:
        width = max((len(e) for e in elements), default=0) + 1
        return np.array(elements, dtype=f"S{width}").reshape(array.shape)
    strings = np.empty(flat.shape, dtype=np.object_)
    strings[:] = text
    return strings.reshape(array.shape)
