"""Model warm-up, as Triton's `model_warmup`: the config's samples, built once and run on
every instance of a version before that version reports ready, for any framework."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protos import codec
from protos import model_config_pb2 as mc
from protos.datatypes import BY_CONFIG_NAME
from protos.status import TurnoutError, invalid_arg
from sidecars.runtime import ModelInstance

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"  # input_data_file names are relative to <model>/warmup/
_SEED = 0  # random_data is seeded, so every start warms up with the same values


@dataclass(frozen=True)
class Sample:
    name: str
    inputs: dict[str, np.ndarray]
    count: int


def samples(config: mc.ModelConfig, model_dir: Path) -> list[Sample]:
    """The config's warm-up samples as model-shaped arrays; raises TurnoutError when
    one names an unknown input, the wrong datatype, or an unreadable data file."""
    inputs = {tensor.name: tensor for tensor in config.input}
    rng = np.random.default_rng(_SEED)
    built = []
    for warmup in config.model_warmup:
        arrays = {}
        for name, spec in warmup.inputs.items():
            tensor = inputs.get(name)
            if tensor is None:
                raise _failure(config, warmup, f"unexpected input '{name}'")
            if spec.data_type != tensor.data_type:
                expected, got = mc.DataType.Name(tensor.data_type), mc.DataType.Name(spec.data_type)
                raise _failure(config, warmup, f"input '{name}' is {got} but the model expects {expected}")
            arrays[name] = _array(config, warmup, name, spec, tensor, model_dir, rng)
        missing = [t.name for t in config.input if t.name not in arrays and not t.optional]
        if missing:
            raise _failure(config, warmup, f"no data for input(s) {', '.join(missing)}")
        built.append(Sample(warmup.name, arrays, max(warmup.count, 1)))
    return built


def _array(
    config: mc.ModelConfig,
    warmup: mc.ModelWarmup,
    name: str,
    spec: mc.ModelWarmup.Input,
    tensor: mc.ModelInput,
    model_dir: Path,
    rng: np.random.Generator,
) -> np.ndarray:
    datatype = BY_CONFIG_NAME[mc.DataType.Name(spec.data_type)]
    batch = [max(warmup.batch_size, 1)] if config.max_batch_size > 0 else []
    shape = [*batch, *spec.dims]
    count = codec.element_count(shape)
    source = spec.WhichOneof("input_data_type")
    if source == "input_data_file":
        path = model_dir / WARMUP_FOLDER / spec.input_data_file
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise _failure(config, warmup, f"cannot read '{spec.input_data_file}': {exc.strerror}") from exc
        if datatype.name != "BYTES" and len(data) != count * datatype.size:
            reason = f"'{spec.input_data_file}' holds {len(data)} bytes, input '{name}' needs {count * datatype.size}"
            raise _failure(config, warmup, reason)
        try:
            array = codec.from_raw(data, datatype, shape).copy()
        except codec.CodecError as exc:
            raise _failure(config, warmup, f"'{spec.input_data_file}' is not {count} strings: {exc}") from exc
    elif datatype.name == "BYTES":
        array = np.full(shape, b"", dtype=np.object_)  # Triton warms strings up with empty ones too
    elif source == "random_data" and datatype.numpy is not None and datatype.numpy.kind in "fiu":
        if datatype.numpy.kind == "f":
            array = rng.standard_normal(shape).astype(datatype.numpy)
        else:
            array = rng.integers(0, 10, shape).astype(datatype.numpy)
    else:
        assert datatype.numpy is not None
        array = np.zeros(shape, dtype=datatype.numpy)
    if tensor.HasField("reshape"):
        array = array.reshape([*batch, *tensor.reshape.shape])
    return array


def _failure(config: mc.ModelConfig, warmup: mc.ModelWarmup, reason: str) -> TurnoutError:
    return invalid_arg(f"failed to warm up model '{config.name}' with sample '{warmup.name}': {reason}")


async def warm_up(config: mc.ModelConfig, instances: list[ModelInstance], model_dir: Path) -> None:
    """Run every sample `count` times on every instance, one instance after another, so
    each instance's framework has done its first-call work before a request arrives."""
    if not config.model_warmup:
        return
    # Off the event loop: sample files are read from disk.
    prepared = await asyncio.to_thread(samples, config, model_dir)
    for instance in instances:
        for sample in prepared:
            for _ in range(sample.count):
                try:
                    await instance.execute(sample.inputs)
                except TurnoutError as exc:
                    raise invalid_arg(
                        f"failed to warm up model '{config.name}' with sample '{sample.name}': {exc.message}"
                    ) from exc
    names = ", ".join(f"'{s.name}' x{s.count}" for s in prepared)
    log.info("model '%s' warmed up on %d instance(s) with sample(s) %s", config.name, len(instances), names)
