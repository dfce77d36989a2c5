"""Model configuration: config.pbtxt and load-time overrides into `inference.ModelConfig`,
the defaults Triton's core fills in, and its first stage for a model folder (the rules
themselves are in `config_rules`)."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format, text_format

from protos import model_config_pb2 as mc
from protos.layout import config_path
from protos.status import TurnoutError, internal, invalid_arg
from sidecars.config_rules import complete_backend_fields, validate_io_config, validate_model_config
from sidecars.sequence_config import fill_sequence_defaults


def load_failure(model: str, reason: str) -> TurnoutError:
    """Triton's wording for a model that could not be read or loaded."""
    return internal(f"failed to load '{model}', {reason}")


def poll_failure(model: str, reason: str) -> TurnoutError:
    """Triton's answer to a load its repository poll refused; its log gives the reason,
    turnout's answer gives it too."""
    return load_failure(model, f"failed to poll from model repository: {reason}")


def parse_text(path: Path) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        # Triton's status names the file; the parser's own words say where it stopped.
        raise internal(f"failed to read text proto from {path}: {exc}") from exc
    return config


def parse_override(text: str) -> mc.ModelConfig:
    """A load request's `config` parameter: protobuf JSON, possibly partial, ints as strings."""
    if not text.lstrip(" \t\n\r").startswith("{"):  # protobuf's parser takes an empty array as no fields
        raise invalid_arg("Invalid config override: a model configuration is a JSON object.")
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise invalid_arg(f"Invalid config override: {exc}") from exc
    return config


def poll_config(
    model_dir: Path, model: str, override: mc.ModelConfig | None, auto_complete: bool, config_name: str = ""
) -> mc.ModelConfig:
    """Triton's first stage for a model folder, before any version is looked at: read the
    config (or take a load request's), derive the backend fields, fill the defaults and
    check the configuration on its own; without auto-complete, its inputs and outputs too.
    `config_name`: Triton's --model-config-name (layout.config_path)."""
    config = mc.ModelConfig()
    if override is not None:
        config.CopyFrom(override)
    else:
        path = config_path(model_dir, config_name)
        if path.is_file():
            config = parse_text(path)
        elif not auto_complete:
            raise internal(f"failed to open text file for read {path}: No such file or directory")
    complete_backend_fields(config, model_dir)
    normalize(config)
    validate_model_config(config)
    if not auto_complete:
        validate_io_config(config)
    if config.name != model:
        raise invalid_arg(
            f"unexpected directory name '{model}' for model '{config.name}', directory name must equal model name"
        )
    return config


def normalize(config: mc.ModelConfig) -> None:
    """Triton's NormalizeModelConfig, run again after a framework completed the config."""
    policy = config.version_policy
    if not config.HasField("version_policy") or (policy.HasField("latest") and policy.latest.num_versions == 0):
        policy.latest.num_versions = 1
    batching = config.dynamic_batching
    if config.HasField("dynamic_batching") and not batching.preferred_batch_size and config.max_batch_size > 0:
        # Triton's core: without preferred sizes, max_batch_size is the one.
        batching.preferred_batch_size.append(config.max_batch_size)
    fill_sequence_defaults(config)
    if not config.HasField("ensemble_scheduling") and not config.HasField("optimization"):
        # Triton's core defaults: pinned host buffers for inputs and outputs.
        config.optimization.input_pinned_memory.enable = True
        config.optimization.output_pinned_memory.enable = True


def model_file(config: mc.ModelConfig, version_dir: Path) -> Path:
    return version_dir / config.default_model_filename
