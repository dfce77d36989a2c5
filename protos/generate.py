"""Compile protos/*.proto into the checked-in Python modules beside them.

Run from anywhere: `python -m protos.generate`. tests/protos/test_generated.py
regenerates into a temporary folder and diffs, so the checked-in code never drifts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ("protos/model_config.proto", "protos/grpc_service.proto")


def generate(out_dir: Path) -> None:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every proto under out_dir/protos/."""
    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    for proto in PROTOS:
        args = [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            proto,
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")
    for module in sorted((out_dir / "protos").glob("*_pb2.py")):
        _use_own_pool(module)


def _use_own_pool(module: Path) -> None:
    """Register the module's descriptors in protos.pool.POOL instead of the default pool."""
    text = module.read_text()
    text = text.replace("_descriptor_pool.Default().AddSerializedFile(", "_own_pool.POOL.AddSerializedFile(")
    text = text.replace(
        "from google.protobuf.internal import builder as _builder\n",
        "from google.protobuf.internal import builder as _builder\nfrom protos import pool as _own_pool\n",
    )
    module.write_text(text)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
