"""Client shared memory: the regions clients register, and copying tensors in and out.

System regions are files under /dev/shm that the client created (the key, without
its leading slash, names the file). CUDA regions are not available on this server.
Everything here runs on the event loop thread, so no lock guards the table.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from protos import grpc_service_pb2 as pb
from protos.status import Status, TurnoutError, internal, invalid_arg, not_found, unsupported

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
SHM_ROOT = Path("/dev/shm")


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    memory: mmap.mmap  # maps the file from 0 to offset + byte_size (mmap offsets must be page aligned)


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
        if key.lstrip("/").startswith(RESERVED_KEY_PREFIX):
            raise invalid_arg(
                f"failed to register shared memory region '{name}': "
                f"key '{key}' uses the reserved prefix '{RESERVED_KEY_PREFIX}'"
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
            if offset + byte_size > size or offset + byte_size == 0:
                raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
            try:
                memory = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
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

    def _locate(self, name: str, offset: int, byte_size: int) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        if offset < 0 or (region.byte_size > 0 and offset >= region.byte_size):
            raise invalid_arg(f"Invalid offset for shared memory region: '{name}'")
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region

    def read(self, name: str, offset: int, byte_size: int) -> bytes:
        """A copy of `byte_size` bytes at `offset` within region `name`."""
        region = self._locate(name, offset, byte_size)
        start = region.offset + offset
        return region.memory[start : start + byte_size]

    def check_output(self, name: str, offset: int, byte_size: int) -> None:
        """Validate an output's region before the request is sent."""
        self._locate(name, offset, byte_size)

    def write(self, output: str, name: str, offset: int, byte_size: int, data: bytes) -> None:
        """Copy an output's bytes into its region, which must be large enough."""
        if len(data) > byte_size:
            raise internal(
                f"shared memory size specified with the request for output '{output}' ({byte_size} bytes) "
                f"should be at least {len(data)} bytes to hold the results"
            )
        region = self._locate(name, offset, byte_size)
        start = region.offset + offset
        region.memory[start : start + len(data)] = data

    # --- CUDA shared memory -------------------------------------------------------

    def cuda_status(self, name: str) -> pb.CudaSharedMemoryStatusResponse:
        if name:
            raise not_found(f"Unable to find cuda shared memory region: '{name}'")
        return pb.CudaSharedMemoryStatusResponse()

    def cuda_register(self, name: str) -> None:
        self.check_enabled()
        raise unsupported(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")

    def cuda_unregister(self, name: str) -> None:
        self.check_enabled()  # nothing can be registered, so there is nothing to release
