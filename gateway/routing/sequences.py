"""Sequence placement: every request of a stateful model's sequence goes to the replica
and version that took its START, since only that replica holds the sequence's slot and
state, whichever gateway the request reaches.

No gateway needs to have seen the START. Its replica is the first of the sequence's
rendezvous order (`in_rendezvous_order`: replicas ranked by a hash of the sequence and
the replica's address, the same on every gateway), so a later request asks the replicas
in that order, and one that does not hold the sequence says so (its error's cause is
`Cause.UNKNOWN_SEQUENCE`) and the next is asked; a replica joining or leaving between
START and a later request costs a refusal or two, never a moved sequence.

A gateway that saw the START, or found the sequence, keeps a pin (this module's
`SequencePins`), so the sequence's next requests go straight there: a pin is set when
the START request leaves, before any await, so the sequence's next requests (a stream
sends them without waiting) find it; it goes with the END request, or once the sequence
has been idle longer than the model's max_sequence_idle_microseconds. A pin is a cache:
one that cannot be followed (its replica gone, unreachable, or saying it does not hold
the sequence) is dropped and the order followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.upstream import SidecarClient
from protos import grpc_service_pb2 as pb
from protos.sequence import SequenceFlags
from protos.status import TurnoutError

logger = logging.getLogger(__name__)

# Until a model's own idle time is known (asked for at its first START after a load), pins
# last Triton's default; the sidecar's own timeout decides either way.
DEFAULT_IDLE_SECS = 1.0
# A pin outlives the sidecar's idle timeout a little, so a late request still reaches
# the replica that timed the sequence out and gets Triton's answer from it.
PIN_GRACE_SECS = 1.0
CONFIG_TIMEOUT_SECS = 5.0


def placement_key(model: str, sequence: SequenceFlags) -> str:
    """What a sequence's placement hashes: its model and its typed id (7 and "7" are
    different sequences)."""
    kind = "string" if isinstance(sequence.id, str) else "uint64"
    return f"{model}\0{kind}\0{sequence.id}"


def _rank(key: str, replica: SidecarClient) -> bytes:
    # blake2b, not hash(): Python salts str hashes per process, and every gateway must agree.
    return hashlib.blake2b(f"{replica.address}\0{key}".encode(), digest_size=8).digest()


def in_rendezvous_order(key: str, replicas: Sequence[SidecarClient]) -> list[SidecarClient]:
    """`replicas` ranked for the sequence `key` (highest random weight first): the same
    order on every gateway that knows the same replicas, and a replica's joining or
    leaving moves only the sequences it ranks (or ranked) first."""
    return sorted(replicas, key=lambda replica: _rank(key, replica), reverse=True)


@dataclass
class Pin:
    version: str  # "" only when no READY version was known at START
    replica: SidecarClient
    expires: float  # time.monotonic()


class SequencePins:
    """(model, sequence id) -> (version, replica); changed on the event loop thread only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pins: OrderedDict[tuple[str, int | str], Pin] = OrderedDict()  # least recently used first
        self._idle_secs: dict[str, float] = {}
        self._lookups: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._pins)

    def get(self, model: str, sequence: SequenceFlags) -> Pin | None:
        """The live pin of a sequence; using it keeps it alive."""
        key = (model, sequence.id)
        pin = self._pins.get(key)
        if pin is None:
            return None
        now = self._clock()
        if pin.expires <= now:
            del self._pins[key]
            return None
        pin.expires = now + self._lifetime(model)
        self._pins.move_to_end(key)
        return pin

    def bind(self, model: str, sequence: SequenceFlags, version: str, replica: SidecarClient) -> None:
        """Pin a starting sequence (again, when its START fails over to another replica),
        or one whose later request found it where this gateway had no pin."""
        self._drop_expired()
        key = (model, sequence.id)
        self._pins[key] = Pin(version, replica, self._clock() + self._lifetime(model))
        self._pins.move_to_end(key)
        if model not in self._idle_secs and model not in self._lookups:
            task = asyncio.get_running_loop().create_task(self._learn_idle(model, version, replica))
            self._lookups[model] = task

    def end(self, model: str, sequence: SequenceFlags) -> None:
        self._pins.pop((model, sequence.id), None)

    def forget_idle_times(self) -> None:
        """After a load or unload a model's idle time may differ: learn it again at its next START."""
        self._idle_secs.clear()

    def _lifetime(self, model: str) -> float:
        return self._idle_secs.get(model, DEFAULT_IDLE_SECS) + PIN_GRACE_SECS

    def _drop_expired(self) -> None:
        now = self._clock()
        while self._pins:
            key, pin = next(iter(self._pins.items()))
            if pin.expires > now:
                return
            del self._pins[key]

    async def _learn_idle(self, model: str, version: str, replica: SidecarClient) -> None:
        try:
            request = pb.ModelConfigRequest(name=model, version=version)
            answer = await replica.call("ModelConfig", request, pb.ModelConfigResponse, timeout=CONFIG_TIMEOUT_SECS)
            idle_us = answer.config.sequence_batching.max_sequence_idle_microseconds
            self._idle_secs[model] = idle_us / 1e6 if idle_us else DEFAULT_IDLE_SECS
        except TurnoutError as exc:
            logger.warning(
                "idle time of sequence model '%s' unknown (%s); pins last %.1fs",
                model,
                exc.message,
                DEFAULT_IDLE_SECS + PIN_GRACE_SECS,
            )
        finally:
            self._lookups.pop(model, None)
