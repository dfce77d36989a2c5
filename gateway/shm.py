"""Client shared memory: the regions clients register, and an inference's tensors
resolved against them (inputs read into the request, outputs written from the response).

System regions are files under /dev/shm that the client created (the key, without
its leading slash, names the file). CUDA regions are not available on this server.
Everything here runs on the event loop thread, so no lock guards the table.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protos import grpc_service_pb2 as pb
from protos.status import Status, TurnoutError, internal, invalid_arg, not_found, unsupported

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
SHM_ROOT = Path("/dev/shm")
CUDA_IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)

SHM_REGION = "shared_memory_region"
SHM_BYTE_SIZE = "shared_memory_byte_size"
SHM_OFFSET = "shared_memory_offset"
_SHM_KEYS = (SHM_REGION, SHM_BYTE_SIZE, SHM_OFFSET)


# A serialized request up to this long is searched for the region parameter's key first:
# bytes that never name it carry no such parameter, and the search is a tenth of the walk.
_SEARCHED_BYTES = 1 << 16
_SHM_REGION_KEY = SHM_REGION.encode()


def uses_shared_memory(request: pb.ModelInferRequest, encoded: bytes | None = None) -> bool:
    """Whether any input or requested output names a shared-memory region. `encoded`, the
    request as it came serialized, if there is one, answers most requests at once."""
    if encoded is not None and len(encoded) <= _SEARCHED_BYTES and _SHM_REGION_KEY not in encoded:
        return False
    # Sliced, not iterated: protobuf's repeated fields end an iteration by raising IndexError.
    for tensor in request.inputs[:]:
        if SHM_REGION in tensor.parameters:
            return True
    return any(SHM_REGION in tensor.parameters for tensor in request.outputs[:])


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64)
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


class Mapping:
    """A shared-memory file mapped read-write, holding no file descriptor: as Triton, which
    closes the region's descriptor once it is mapped. (Python's mmap keeps a duplicate of
    it until closed, so every region a client leaves registered would hold one, and enough
    of them would leave the gateway no descriptor to accept a connection with.)"""

    def __init__(self, fd: int, length: int) -> None:
        address = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self._address: int | None = address
        self._length = length

    def read(self, start: int, size: int) -> bytes:
        return ctypes.string_at(self._at(start, size), size)

    def write(self, start: int, data: bytes) -> None:
        target = (ctypes.c_char * len(data)).from_address(self._at(start, len(data)))
        memoryview(target).cast("B")[:] = data

    def close(self) -> None:
        if self._address is not None:
            _libc.munmap(self._address, self._length)
            self._address = None

    def _at(self, start: int, size: int) -> int:
        """The address of `size` bytes at `start`; never one outside the mapping."""
        if self._address is None:
            raise ValueError("the shared memory region is unmapped")
        if start < 0 or size < 0 or start + size > self._length:
            raise ValueError(f"{size} bytes at {start} lie outside a {self._length}-byte mapping")
        return self._address + start


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    memory: Mapping  # the file from 0 to offset + byte_size (mmap offsets must be page aligned)


class SharedMemory:
    """The system shared-memory regions registered with this gateway."""

    def __init__(self, enabled: bool, root: Path = SHM_ROOT) -> None:
        self.enabled = enabled
        self._root = root
        self._regions: dict[str, Region] = {}

    def check_enabled(self) -> None:
        if not self.enabled:
            raise unsupported(DISABLED)

    # --- system shared memory -------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_enabled()
        if not key.lstrip("/"):
            raise invalid_arg(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
        if key.lstrip("/").startswith(RESERVED_KEY_PREFIX):
            raise invalid_arg(
                f"cannot register shared memory region '{name}' with key '{key}' as the key contains "
                f"the reserved prefix '{RESERVED_KEY_PREFIX}'"
            )
        if name in self._regions:
            raise TurnoutError(Status.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        # A POSIX shm name is one path component under the shm root: no folder, no "..".
        leaf = key.lstrip("/")
        if not leaf or "/" in leaf or "\0" in leaf or leaf in (".", ".."):
            raise internal(f"Unable to open shared memory region: '{key}'")
        path = self._root / leaf
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise internal(f"Unable to open shared memory region: '{key}'") from exc
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
            if byte_size == 0 or offset % mmap.PAGESIZE:
                # Triton maps the region itself, from `offset`: mmap refuses no bytes, and
                # an offset off a page boundary.
                raise invalid_arg(
                    f"failed to register shared memory region '{name}': unable to process address space"
                    f"{os.strerror(errno.EINVAL)}"
                )
            try:
                memory = Mapping(fd, offset + byte_size)
            except OSError as exc:
                raise invalid_arg(
                    f"failed to register shared memory region '{name}': unable to process address space{exc.strerror}"
                ) from exc
        finally:
            os.close(fd)
        self._regions[name] = Region(name, key, offset, byte_size, memory)

    def status(self, name: str) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        if name:
            region = self._regions.get(name)
            if region is None:
                raise not_found(f"Unable to find system shared memory region: '{name}'")
            regions = [region]
        else:
            regions = list(self._regions.values())
        for region in regions:
            entry = response.regions[region.name]
            entry.name = region.name
            entry.key = region.key
            entry.offset = region.offset
            entry.byte_size = region.byte_size
        return response

    def unregister(self, name: str) -> None:
        """Unregister one region, or all with an empty name; unknown names are no error."""
        self.check_enabled()
        names = [name] if name else list(self._regions)
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                region.memory.close()

    def close(self) -> None:
        for region in self._regions.values():
            region.memory.close()
        self._regions.clear()

    # --- tensors ----------------------------------------------------------------

    def locate(self, name: str, offset: int, byte_size: int) -> Region:
        """The region `name`, if it holds `byte_size` bytes at `offset`; Triton's errors otherwise."""
        region = self._regions.get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        if offset < 0 or (region.byte_size > 0 and offset >= region.byte_size):
            raise invalid_arg(f"Invalid offset for shared memory region: '{name}'")
        if byte_size > _SIZE_MAX - offset:
            raise invalid_arg(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value "
                f"({_SIZE_MAX}) for region '{name}'"
            )
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region

    def read(self, name: str, offset: int, byte_size: int) -> bytes:
        """A copy of `byte_size` bytes at `offset` within region `name`."""
        region = self.locate(name, offset, byte_size)
        return region.memory.read(region.offset + offset, byte_size)

    def write(self, output: str, name: str, offset: int, byte_size: int, data: bytes) -> None:
        """Copy an output's bytes into its region, which must be large enough."""
        if len(data) > byte_size:
            raise internal(
                f"shared memory size specified with the request for output '{output}' ({byte_size} bytes) "
                f"should be at least {len(data)} bytes to hold the results"
            )
        region = self.locate(name, offset, byte_size)
        region.memory.write(region.offset + offset, data)

    # --- an inference's tensors ----------------------------------------------------

    def resolve_request(
        self, request: pb.ModelInferRequest, version: str
    ) -> tuple[pb.ModelInferRequest, dict[str, tuple[str, int, int]]]:
        """A copy of `request` for `version` with its input regions read into raw contents
        and its output regions stripped; returns it and the output regions, by output name.
        As in current Triton, nothing asks whether client shared memory is allowed here:
        without it no region exists, so a request naming one is told it is not found."""
        forward = pb.ModelInferRequest()
        forward.CopyFrom(request)
        forward.model_version = version
        del forward.raw_input_contents[:]
        received = request.raw_input_contents
        next_raw = 0
        # Raw contents belong, in order, to the inputs that have neither contents nor
        # shared memory; a region's bytes take the slot of the input they fill.
        for tensor in forward.inputs:
            params = tensor.parameters
            if SHM_REGION in params:
                if tensor.HasField("contents"):
                    raise invalid_arg(
                        f"unexpected 'content' provided when using shared memory for input tensor "
                        f"'{tensor.name}' for model '{request.model_name}'"
                    )
                region, offset, byte_size = _shm_parameters(tensor.name, params)
                forward.raw_input_contents.append(self.read(region, offset, byte_size))
                _strip_shm(params)
            elif tensor.HasField("contents"):
                continue
            elif next_raw < len(received):
                forward.raw_input_contents.append(received[next_raw])
                next_raw += 1
        # Surplus raw contents stay, so the sidecar words the error.
        forward.raw_input_contents.extend(received[next_raw:])

        targets: dict[str, tuple[str, int, int]] = {}
        for output in forward.outputs:
            params = output.parameters
            if SHM_REGION in params:
                region, offset, byte_size = _shm_parameters(output.name, params)
                if "classification" in params:
                    raise invalid_arg("output can't set both 'shared_memory_region' and 'classification'")
                self.locate(region, offset, byte_size)  # before the request is sent
                targets[output.name] = (region, offset, byte_size)
                _strip_shm(params)
        return forward, targets

    def write_outputs(self, encoded: bytes, targets: dict[str, tuple[str, int, int]]) -> bytes:
        """Write the outputs that have a region there, leaving their raw contents empty."""
        if not targets:
            return encoded
        response = pb.ModelInferResponse.FromString(encoded)
        raw = response.raw_output_contents
        for index, output in enumerate(response.outputs):
            target = targets.get(output.name)
            if target is None or index >= len(raw):
                continue
            region, offset, byte_size = target
            self.write(output.name, region, offset, byte_size, raw[index])
            raw[index] = b""
        serialized: bytes = response.SerializeToString()
        return serialized

    # --- CUDA shared memory -------------------------------------------------------

    def cuda_status(self, name: str) -> pb.CudaSharedMemoryStatusResponse:
        if name:
            raise not_found(f"Unable to find cuda shared memory region: '{name}'")
        return pb.CudaSharedMemoryStatusResponse()

    def cuda_register(self, name: str, raw_handle: bytes) -> None:
        """Refuse as Triton does, arguments first: a handle that is no cudaIpcMemHandle_t
        is what a GPU build fails to open ("invalid args"); a well-formed one meets the
        answer of a build without GPUs, as this server is one for client CUDA memory."""
        self.check_enabled()
        if len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise invalid_arg("failed to register shared memory region: invalid args")
        raise invalid_arg(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")

    def cuda_unregister(self, name: str) -> None:
        self.check_enabled()  # nothing can be registered, so there is nothing to release


_SIZE_MAX = 2**64 - 1


def _shm_parameters(tensor: str, params: Any) -> tuple[str, int, int]:
    """A tensor's region, offset and byte size, read as Triton's gRPC front reads them."""
    region = params[SHM_REGION]
    if region.WhichOneof("parameter_choice") != "string_param":
        raise invalid_arg(
            f"invalid value type for '{SHM_REGION}' parameter for tensor '{tensor}', expected string_param."
        )
    offset = _shm_int(params, SHM_OFFSET, tensor)
    byte_size = _shm_int(params, SHM_BYTE_SIZE, tensor)
    if byte_size is None:
        raise invalid_arg(
            f"'{SHM_BYTE_SIZE}' must be specified along with '{SHM_REGION}' parameter for tensor '{tensor}'"
        )
    return str(region.string_param), offset or 0, byte_size


def _shm_int(params: Any, key: str, tensor: str) -> int | None:
    if key not in params:
        return None
    if params[key].WhichOneof("parameter_choice") != "int64_param":
        raise invalid_arg(f"invalid value type for '{key}' parameter for tensor '{tensor}', expected int64_param.")
    return int(params[key].int64_param)


def _strip_shm(params: Any) -> None:
    for key in _SHM_KEYS:
        if key in params:
            del params[key]
