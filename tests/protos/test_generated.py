"""The checked-in protos/*_pb2*.py are exactly what protos/generate.py writes today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = sorted(
    p.name for p in (ROOT / "protos").iterdir() if p.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))
)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    # A child process: generation must not load protobuf symbols into this test process.
    code = "import sys; from pathlib import Path; from protos.generate import generate; generate(Path(sys.argv[1]))"
    completed = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return out / "protos"


def test_every_module_is_generated() -> None:
    assert GENERATED == [
        "grpc_service_pb2.py",
        "grpc_service_pb2.pyi",
        "grpc_service_pb2_grpc.py",
        "model_config_pb2.py",
        "model_config_pb2.pyi",
        "model_config_pb2_grpc.py",
    ]


@pytest.mark.parametrize("name", GENERATED)
def test_checked_in_matches_regenerated(regenerated: Path, name: str) -> None:
    fresh = (regenerated / name).read_text()
    checked_in = (ROOT / "protos" / name).read_text()
    assert checked_in == fresh, f"protos/{name} differs from protos.generate output; run `make protos`"


def test_nothing_extra_is_generated(regenerated: Path) -> None:
    assert sorted(p.name for p in regenerated.iterdir() if p.suffix in {".py", ".pyi"}) == GENERATED
