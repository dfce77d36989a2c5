"""Triton model-repository layout rules that gateway and sidecars share: which
framework serves a model, its default file, and which folders are versions."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from google.protobuf import text_format

from protos import model_config_pb2 as mc

# platform or backend name in config.pbtxt -> the sidecar framework that serves it
FRAMEWORK_OF: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "onnxruntime": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "libtorch": "pytorch",
    "torch_aoti": "pytorch",
    "pytorch": "pytorch",
    "python": "python",
    "tensorrt_plan": "tensorrt",
    "tensorrt": "tensorrt",
    # Ensembles: their configs live in the config-only ensemble sidecar; the gateway runs them.
    "ensemble": "ensemble",
}

# framework -> (backend, platform, default model file)
DEFAULTS: dict[str, tuple[str, str, str]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime_onnx", "model.onnx"),
    "pytorch": ("pytorch", "pytorch_libtorch", "model.pt"),
    "tensorrt": ("tensorrt", "tensorrt_plan", "model.plan"),
    "python": ("python", "", "model.py"),
    "ensemble": ("", "ensemble", ""),  # Triton: an ensemble has no backend and no model file
}

_SUFFIX_FRAMEWORK = {".onnx": "onnxruntime", ".pt": "pytorch", ".pt2": "pytorch", ".plan": "tensorrt", ".py": "python"}
# Where a config does not parse, its platform and backend lines still say who reports it.
_PLATFORM = re.compile(r'(?:^|[\s{}\]])(platform|backend)\s*:\s*"([^"]*)"')


def is_version_dir(name: str) -> bool:
    """Version folders are decimal numbers without a leading zero."""
    return name.isdigit() and not name.startswith("0")


def framework_of_name(platform_or_backend: str) -> str | None:
    return FRAMEWORK_OF.get(platform_or_backend)


# What turnout serves, for the refusal of a backend it has no sidecar for.
SERVED = "the onnxruntime, pytorch, tensorrt and python backends, and ensembles"


def framework_of_fields(backend: str, platform: str) -> str | None:
    """The framework of a configuration whose backend fields Triton's core completed."""
    return framework_of_name(backend) if backend else framework_of_name(platform)


def framework_of_file(filename: str) -> str | None:
    return _SUFFIX_FRAMEWORK.get(Path(filename).suffix)


CONFIG_FILE = "config.pbtxt"


def config_key(keys: Iterable[str], config_name: str = "") -> str | None:
    """Which of a model folder's files (keys relative to it) configures the model: with
    Triton's --model-config-name, configs/<name>.pbtxt where the folder holds it, else
    config.pbtxt; None when neither is there."""
    present = set(keys)
    if config_name and _custom_key(config_name) in present:
        return _custom_key(config_name)
    return CONFIG_FILE if CONFIG_FILE in present else None


def config_path(model_dir: Path, config_name: str = "") -> Path:
    """`config_key` for a local model folder: the file to read (config.pbtxt, which may be
    missing, unless the custom one exists)."""
    custom = model_dir / _custom_key(config_name)
    if config_name and custom.is_file():
        return custom
    return model_dir / CONFIG_FILE


def _custom_key(config_name: str) -> str:
    return f"configs/{config_name}.pbtxt"


def framework_of_model(model_dir: Path, config_text: str | None = None, config_name: str = "") -> str | None:
    """The framework of a model folder: config platform/backend first, then its files.

    Reads only the config and the listing, never a model file, so it is cheap
    enough for `turnout up` to scan a whole repository before starting sidecars.
    """
    if config_text is None:
        config_file = config_path(model_dir, config_name)
        config_text = config_file.read_text() if config_file.is_file() else ""
    versions = [p for p in model_dir.iterdir() if p.is_dir() and is_version_dir(p.name)]
    return framework_of_listing(config_text, {p.name: [e.name for e in p.iterdir()] for p in versions})


def _platform_and_backend(config_text: str) -> list[str]:
    config = mc.ModelConfig()
    try:
        text_format.Parse(config_text, config)
    except text_format.ParseError:
        return [name for _, name in _PLATFORM.findall(config_text)]
    return [config.platform, config.backend]


def framework_of_listing(config_text: str, version_entries: Mapping[str, Iterable[str]]) -> str | None:
    """The same rule for a folder known from a listing (a remote repository): its config
    text and the entry names in each version folder."""
    for name in _platform_and_backend(config_text):
        framework = framework_of_name(name)
        if framework:
            return framework
    for version in sorted(version_entries):
        for entry in sorted(version_entries[version]):
            framework = framework_of_file(entry)
            if framework:
                return framework
    return None
