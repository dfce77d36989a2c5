"""Client system shared memory: Triton's texts, and shm tensors through a real gateway."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gateway.shm import DISABLED, SHM_REGION, SHM_ROOT, Mapping, SharedMemory, uses_shared_memory
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pbg
from protos.status import Status, TurnoutError
from tests.gateway.gateway_harness import gateway_settings, running_gateway


@pytest.fixture
def shm_file() -> Iterator[tuple[str, Path]]:
    key = f"/turnout_test_{uuid.uuid4().hex}"
    path = SHM_ROOT / key[1:]
    path.write_bytes(bytes(256))
    yield key, path
    path.unlink(missing_ok=True)


def raises(status: Status, message: str):
    class Check:
        def __enter__(self) -> None:
            return None

        def __exit__(self, kind, error, tb) -> bool:
            assert isinstance(error, TurnoutError), error
            assert (error.status, error.message) == (status, message)
            return True

    return Check()


def test_disabled_refuses_with_triton_text(shm_file) -> None:
    memory = SharedMemory(enabled=False)
    with raises(Status.UNSUPPORTED, DISABLED):
        memory.register("r", shm_file[0], 0, 64)
    with raises(Status.UNSUPPORTED, DISABLED):
        memory.unregister("")
    assert len(memory.status("").regions) == 0


def test_register_status_unregister(shm_file) -> None:
    key, _ = shm_file
    memory = SharedMemory(enabled=True)
    memory.register("r", key, 0, 128)
    status = memory.status("r").regions["r"]
    assert (status.name, status.key, status.offset, status.byte_size) == ("r", key, 0, 128)
    with raises(Status.ALREADY_EXISTS, "shared memory region 'r' already in manager"):
        memory.register("r", key, 0, 64)
    with raises(Status.INTERNAL, "Unable to open shared memory region: '/turnout_no_such_key'"):
        memory.register("s", "/turnout_no_such_key", 0, 64)
    with raises(Status.INVALID_ARG, "failed to register shared memory region 's': invalid args"):
        memory.register("s", key, 200, 100)
    with raises(Status.NOT_FOUND, "Unable to find system shared memory region: 'x'"):
        memory.status("x")
    with raises(Status.INVALID_ARG, "Invalid offset + byte size for shared memory region: 'r'"):
        memory.read("r", 64, 100)
    memory.unregister("")
    assert len(memory.status("").regions) == 0


def test_mapping_shares_the_file_and_stays_in_bounds(shm_file) -> None:
    _, path = shm_file
    with open(path, "r+b") as file:
        mapping = Mapping(file.fileno(), 256)
    path.write_bytes(bytes(range(256)))  # the file, written after its descriptor closed
    assert mapping.read(250, 6) == bytes(range(250, 256))
    mapping.write(0, b"\xff\x00turnout")
    mapping.write(9, b"")
    assert path.read_bytes()[:9] == b"\xff\x00turnout"
    for start, size in ((250, 7), (-1, 1), (0, -1)):
        with pytest.raises(ValueError):
            mapping.read(start, size)
    with pytest.raises(ValueError):
        mapping.write(255, b"ab")
    mapping.close()
    mapping.close()  # once is enough; again is no error
    with pytest.raises(ValueError, match="unmapped"):
        mapping.read(0, 1)


def test_registrations_triton_cannot_map_are_refused(shm_file) -> None:
    """Triton checks the key, then maps the region itself from its offset: no bytes, or
    an offset off a page boundary, is what mmap refuses."""
    key, _ = shm_file
    memory = SharedMemory(enabled=True)
    with raises(Status.INVALID_ARG, "cannot register shared memory region 's' - invalid shm key '//'"):
        memory.register("s", "//", 0, 64)
    reserved = "/triton_python_backend_shm_region_1"
    with raises(
        Status.INVALID_ARG,
        f"cannot register shared memory region 's' with key '{reserved}' as the key contains the reserved "
        "prefix 'triton_python_backend_shm_region_'",
    ):
        memory.register("s", reserved, 0, 64)
    unmappable = "failed to register shared memory region 's': unable to process address spaceInvalid argument"
    for offset, byte_size in ((64, 128), (0, 0)):
        with raises(Status.INVALID_ARG, unmappable):
            memory.register("s", key, offset, byte_size)
    assert len(memory.status("").regions) == 0


def test_cuda_shared_memory_is_not_available() -> None:
    memory = SharedMemory(enabled=True)
    assert len(memory.cuda_status("").regions) == 0
    memory.cuda_unregister("")
    # Arguments first: an empty or short handle is what a GPU build of Triton cannot open.
    for handle in (b"", bytes(63)):
        with raises(Status.INVALID_ARG, "failed to register shared memory region: invalid args"):
            memory.cuda_register("", handle)
    with raises(Status.INVALID_ARG, "failed to register CUDA shared memory region: 'c', GPUs not supported"):
        memory.cuda_register("c", bytes(64))
    with raises(Status.UNSUPPORTED, DISABLED):
        SharedMemory(enabled=False).cuda_register("", b"")


async def test_infer_reads_and_writes_regions(sidecars, shm_file) -> None:
    key, path = shm_file
    out_path = path.with_name(path.name + "_out")
    out_path.write_bytes(bytes(128))
    a = np.arange(16, dtype="<i4")
    b = np.full(16, 3, dtype="<i4")
    with path.open("r+b") as f:
        f.write(a.tobytes() + b.tobytes())
    async with running_gateway(gateway_settings(sidecars, allow_client_shm=True)) as gw:
        stub = pbg.GRPCInferenceServiceStub(gw.channel)
        await stub.SystemSharedMemoryRegister(
            pb.SystemSharedMemoryRegisterRequest(name="in", key=key, offset=0, byte_size=128)
        )
        await stub.SystemSharedMemoryRegister(
            pb.SystemSharedMemoryRegisterRequest(name="out", key=key + "_out", offset=0, byte_size=128)
        )
        request = pb.ModelInferRequest(model_name="simple")
        for index, name in enumerate(("INPUT0", "INPUT1")):
            tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            tensor.parameters["shared_memory_region"].string_param = "in"
            tensor.parameters["shared_memory_byte_size"].int64_param = 64
            if index:
                tensor.parameters["shared_memory_offset"].int64_param = 64
        for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
            output = request.outputs.add(name=name)
            output.parameters["shared_memory_region"].string_param = "out"
            output.parameters["shared_memory_byte_size"].int64_param = 64
            if index:
                output.parameters["shared_memory_offset"].int64_param = 64
        response = await stub.ModelInfer(request)
        assert list(response.raw_output_contents) == [b"", b""]
        written = np.frombuffer(out_path.read_bytes(), dtype="<i4")
        assert written[:16].tolist() == (a + b).tolist()
        assert written[16:].tolist() == (a - b).tolist()
        await stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())
    out_path.unlink()


def _infer_request(region_on: str | None, raw: bytes = b"") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    for name in ("IN0", "IN1"):
        request.inputs.add(name=name, datatype="UINT8", shape=[len(raw)])
    request.outputs.add(name="OUT0")
    tensors = {"input": request.inputs[1], "output": request.outputs[0]}
    if region_on is not None:
        tensors[region_on].parameters[SHM_REGION].string_param = "region"
    request.raw_input_contents.extend([raw, raw])
    return request


@pytest.mark.parametrize("region_on", [None, "input", "output"])
@pytest.mark.parametrize("raw", [b"", SHM_REGION.encode(), bytes(1 << 17)], ids=["empty", "the key as data", "128 KiB"])
def test_a_request_s_bytes_say_whether_it_names_a_region_as_its_tensors_do(region_on: str | None, raw: bytes) -> None:
    request = _infer_request(region_on, raw)
    named = region_on is not None
    assert uses_shared_memory(request) is named
    assert uses_shared_memory(request, request.SerializeToString()) is named
