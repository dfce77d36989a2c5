"""The gateway's decisions: which sidecar answers a request, and what the gateway
answers itself (server metadata, shared memory, trace and log settings).

Front ends translate their protocol into the v2 protobuf messages, call one method
here and map TurnoutError once. Nothing here knows HTTP or gRPC servers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from google.protobuf.message import Message

from gateway.context import NO_CONTEXT, RequestContext
from gateway.ensemble import ENSEMBLE_FRAMEWORK, Ensembles
from gateway.fleet import combine_indexes, combine_statistics, on_replicas
from gateway.metrics import GatewayMetrics
from gateway.readiness import unready_reasons
from gateway.registry import ModelRegistry
from gateway.routing.dispatch import Dispatcher, relabelled, with_model, with_version
from gateway.routing.policy_sources import PolicyStore
from gateway.routing.replicas import Balancer
from gateway.routing.shadows import ShadowMirror
from gateway.routing.versions import Reason
from gateway.settings import GatewaySettings
from gateway.shm import SharedMemory, uses_shared_memory
from gateway.tracing.trace import REQUEST_END
from gateway.tracing.tracer import Tracer
from gateway.upstream import READY_TIMEOUT_SECS, SidecarClient
from gateway.workers import (
    CUDA_SHM_REGISTER,
    CUDA_SHM_UNREGISTER,
    DEPENDENCIES,
    LOG_SETTINGS,
    MODELS_CHANGED,
    SHM_REGISTER,
    SHM_UNREGISTER,
    TRACE_SETTING,
    Siblings,
)
from protos import codec
from protos import grpc_service_pb2 as pb
from protos.cnum import parse_version
from protos.identity import GATEWAY_EXTENSIONS, server_metadata
from protos.logs import (
    REQUEST_ID,
    REQUEST_ID_PARAMETER,
    LogSettings,
    fill_log_response,
    log_updates,
    request_id_parameter,
)
from protos.sequence import sequence_of
from protos.status import Status, TurnoutError, invalid_arg, load_failed, model_not_found, unavailable, unsupported
from protos.validation import PLAIN_PARAMETERS

logger = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=Message)
Asked = TypeVar("Asked", pb.ModelMetadataRequest, pb.ModelConfigRequest)  # named by model and version

SERVER_EXITING = "Server exiting"
LOAD_NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"
REPOSITORY_NAME_UNSUPPORTED = "'repository_name' specification is not supported"


class Gateway:
    """The internal call both front ends make; see docs/architecture.md."""

    def __init__(
        self,
        settings: GatewaySettings,
        registry: ModelRegistry,
        shared_memory: SharedMemory,
        metrics: GatewayMetrics,
        tracer: Tracer | None = None,
        logs: LogSettings | None = None,
        dispatcher: Dispatcher | None = None,
        siblings: Siblings | None = None,
    ) -> None:
        """`siblings`: the other workers of a gateway run with --gateway-workers, which
        hold what a client changes here too (gateway.workers)."""
        self._settings = settings
        self._registry = registry
        self._dispatcher = dispatcher or Dispatcher(
            registry, PolicyStore(), Balancer(random.Random(0), metrics), metrics, random.Random(0)
        )
        self._shadows = ShadowMirror(self._dispatcher, metrics)
        self.ensembles = Ensembles(registry, self._dispatcher)
        self._shm = shared_memory
        self._metrics = metrics
        self.tracer = tracer or Tracer()
        self._logs = logs or LogSettings.of(settings)
        self._draining = False
        self._request_prefix = os.urandom(4).hex()  # ids unique to this gateway process
        self._request_count = 0
        self._metadata = server_metadata(GATEWAY_EXTENSIONS)
        self.siblings = siblings or Siblings()
        # Triton's dependency graph, for loads and unloads through this gateway: the models
        # loaded only as an ensemble's steps, and the ensembles unloaded because a step went
        # away (with their steps), which load again once every step is back.
        self._implicit: set[str] = set(settings.startup_steps)
        self._held: dict[str, list[str]] = {}

    # --- lifecycle --------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    async def close(self) -> None:
        """Cancel shadow requests still running; call after the front ends drained."""
        await self._shadows.close()

    def start_draining(self) -> None:
        """From now on: not ready, and new inference and repository requests are refused."""
        self._draining = True

    # --- health and metadata ----------------------------------------------------

    async def server_live(self) -> bool:
        return True

    async def server_ready(self) -> bool:
        """Whether this gateway can serve, from what discovery already knows: a probe
        never waits on a sidecar (gateway.readiness has the rule)."""
        return not self._draining and not self.unready_reasons()

    def unready_reasons(self) -> list[str]:
        """Why the gateway is not ready now, in words; empty when it is (draining aside)."""
        return unready_reasons(
            self._registry.health, strict=self._settings.strict_readiness, need_replica=bool(self._settings.consul)
        )

    async def model_ready(self, request: pb.ModelReadyRequest) -> bool:
        self._check_version(request.name, request.version)
        experiments = self._dispatcher.experiments
        if experiments.get(request.name) is not None:
            # An experiment's called name is as ready as the arm that answers for it.
            try:
                served, version = experiments.front(request.name, request.version) or (request.name, "")
            except TurnoutError:  # a version that is no arm of it
                return False
            request = pb.ModelReadyRequest(name=served, version=version)
        client = await self._registry.find(request.name)
        if client is None:
            return False
        try:
            response = await client.call("ModelReady", request, pb.ModelReadyResponse, timeout=READY_TIMEOUT_SECS)
        except TurnoutError as exc:
            # A sidecar that is gone (killed, paused) cannot serve its models: not ready.
            if exc.status in (Status.NOT_FOUND, Status.UNAVAILABLE):
                return False
            raise
        if response.ready and self.ensembles.runs(request.name):
            return not await self.ensembles.refusal(request.name, request.version)
        return bool(response.ready)

    def _check_version(self, model: str, version: str) -> None:
        """Triton reads a request's version before it looks the model up; an experiment's
        called name takes its arms' names as versions instead."""
        if version and self._dispatcher.experiments.get(model) is None:
            parse_version(version)

    def server_metadata(self) -> pb.ServerMetadataResponse:
        return self._metadata

    async def _ask_owner(self, method: str, request: Asked, response_type: type[M]) -> tuple[M, bool]:
        """`method` answered by the sidecar serving the model `request` names, and whether
        an experiment's arm answered for that name (the request then asks the arm that
        stands for it, and the caller puts the called name back)."""
        self._check_version(request.name, request.version)
        front = self._dispatcher.experiments.front(request.name, request.version)
        if front is None:
            client = await self._owner(request.name)
            return await client.call(method, request, response_type), False
        served, version = front
        client = await self._owner(served)
        return await client.call(method, type(request)(name=served, version=version), response_type), True

    async def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        answer, fronted = await self._ask_owner("ModelMetadata", request, pb.ModelMetadataResponse)
        return self._dispatcher.experiments.as_called(answer, request.name, request.version) if fronted else answer

    async def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        answer, fronted = await self._ask_owner("ModelConfig", request, pb.ModelConfigResponse)
        if self.ensembles.runs(answer.config.name):
            await self.ensembles.complete_config(answer.config, request.version)
        if fronted:
            answer.config.name = request.name
        return answer

    # --- inference ----------------------------------------------------------------

    async def infer(
        self, request: pb.ModelInferRequest, encoded: bytes | None = None, context: RequestContext = NO_CONTEXT
    ) -> bytes:
        """Route one inference. `encoded` is the request exactly as received over gRPC
        (only the gRPC front passes it), forwarded as is unless the gateway must change it."""
        if self._draining:
            raise unavailable(SERVER_EXITING)
        if request.model_version:
            self._check_version(request.model_name, request.model_version)
        started = time.perf_counter()
        model = request.model_name
        protocol = "grpc" if encoded is not None else "http"
        # The client's id, else ours; every log line about this request carries it. It
        # reaches the sidecar in the lane frame's header; only a sidecar without a lane
        # gets it as a parameter, at verbose level: appending it copies the payload, which
        # the fast path does not pay.
        request_id = request.id
        verbose = logger.isEnabledFor(logging.DEBUG)
        carry = False
        if not request_id:
            self._request_count += 1
            request_id = f"{self._request_prefix}-{self._request_count}"
            carry = verbose
        REQUEST_ID.set(request_id)
        trace = context.trace
        virtual = False  # an experiment's called name that serves nothing itself
        if not self._registry.replicas(model, ""):
            virtual = self._dispatcher.experiments.get(model) is not None
            if not virtual:
                await self._owner(model)  # an unknown model fails here, before it counts as a request
        if trace is not None:
            trace.start_request(request.model_version, request.id)
        sequence = sequence_of(request)
        if sequence is not None and PLAIN_PARAMETERS not in request.parameters:
            context = replace(context, sequence=sequence)  # its requests stay on one replica and version
        decision = self._dispatcher.decide(model, request.model_version, context)
        version, served, arm = decision.version, decision.model, decision.arm
        if virtual and not served and decision.reason is not Reason.SEQUENCE:  # a version that is no arm
            raise model_not_found(model, request.model_version)
        if verbose:
            logger.debug("infer model '%s' version '%s' over %s", model, arm, protocol)
        try:
            if encoded is None and codec.is_raw_binary(request):
                # A raw binary body (HTTP) has no shape: Triton deduces it from the config.
                name, asked = (served, version) if served else (model, request.model_version)
                answer = await self.model_config(pb.ModelConfigRequest(name=name, version=asked))
                codec.deduce_raw_input(request, answer.config)
            if served:
                # An experiment's arm of another model answers; dispatch names the called
                # model and the arm in its response.
                request.model_name = served
            if self.ensembles.runs(served or model):
                response = await self._infer_ensemble(request, version, context)
                if served:  # an ensemble runs here, not through dispatch
                    response = relabelled(response, model, arm)
            else:
                # The bytes to forward, which also say at once whether a region is named.
                payload = request.SerializeToString() if encoded is None else encoded
                if uses_shared_memory(request, payload):
                    if carry:
                        request.parameters[REQUEST_ID_PARAMETER].string_param = request_id
                    response = await self._infer_resolved(request, version, context, model, served)
                else:
                    if version != request.model_version:
                        payload = with_version(payload, version)
                    if served and encoded is not None:
                        payload = with_model(payload, served)
                    if carry:
                        payload += request_id_parameter(request_id)
                    response = await self._dispatcher.forward(model, version, payload, context, served)
                    if decision.shadow_policy is not None:
                        # After the primary answered, so the copy can neither delay nor fail it.
                        self._shadows.mirror(model, decision.shadow_policy, payload, response)
        except TurnoutError as exc:
            self._metrics.observe_request(model, arm or "default", protocol, False, time.perf_counter() - started)
            logger.info("infer failed: %s", exc.message)
            raise
        finally:
            if trace is not None:
                trace.stamp(REQUEST_END)
        self._metrics.observe_request(model, arm or "default", protocol, True, time.perf_counter() - started)
        if verbose:
            logger.debug("infer answered in %d us", (time.perf_counter() - started) * 1e6)
        return response

    async def _infer_resolved(
        self, request: pb.ModelInferRequest, version: str, context: RequestContext, model: str, served: str
    ) -> bytes:
        """Infer with shared-memory tensors resolved: input regions become raw contents,
        output regions receive the raw outputs, which leave the response empty."""
        forward, targets = self._shm.resolve_request(request, version)
        encoded = await self._dispatcher.forward(model, version, forward.SerializeToString(), context, served)
        return self._shm.write_outputs(encoded, targets)

    async def _infer_ensemble(self, request: pb.ModelInferRequest, version: str, context: RequestContext) -> bytes:
        """An ensemble runs in the gateway; its boundary tensors may be in shared memory."""
        if not uses_shared_memory(request):
            return await self.ensembles.infer(request, version, context)
        forward, targets = self._shm.resolve_request(request, version)
        return self._shm.write_outputs(await self.ensembles.infer(forward, version, context), targets)

    # --- statistics and repository --------------------------------------------------

    async def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        """Every replica's counters, summed per model version (the fleet as one Triton)."""
        if request.name:
            self._check_version(request.name, request.version)
            client = await self._registry.find(request.name)
            if client is None:
                raise invalid_arg(f"requested model '{request.name}' is not available")
            replicas = self._registry.peers(client) or (client,)
            if len(replicas) == 1:
                answer = await client.call("ModelStatistics", request, pb.ModelStatisticsResponse)
                return await self._with_ensembles(answer)
            answers = await asyncio.gather(
                *(r.call("ModelStatistics", request, pb.ModelStatisticsResponse) for r in replicas),
                return_exceptions=True,
            )
            reached = [a for a in answers if isinstance(a, pb.ModelStatisticsResponse)]
            if not reached:
                raise next(a for a in answers if isinstance(a, BaseException))
            return await self._with_ensembles(combine_statistics(reached))

        async def statistics(client: SidecarClient) -> tuple[str, pb.ModelStatisticsResponse]:
            return client.framework, await client.call("ModelStatistics", request, pb.ModelStatisticsResponse)

        # Replicas (one framework's sidecars) add up; different frameworks stay apart.
        by_framework: dict[str, list[pb.ModelStatisticsResponse]] = {}
        for framework, answer in await self._all(statistics):
            by_framework.setdefault(framework, []).append(answer)
        merged = pb.ModelStatisticsResponse()
        for group in by_framework.values():
            merged.model_stats.extend(combine_statistics(group).model_stats)
        return await self._with_ensembles(merged)

    async def _with_ensembles(self, answer: pb.ModelStatisticsResponse) -> pb.ModelStatisticsResponse:
        """`answer` with its ensembles' counters: ensembles run in the gateway, so theirs
        are this worker's plus its siblings' (gateway.workers)."""
        self.ensembles.fill_statistics(answer)
        theirs = await self.siblings.ensemble_statistics()
        if not theirs:
            return answer
        listed = {(entry.name, entry.version) for entry in answer.model_stats}
        counted = pb.ModelStatisticsResponse(
            model_stats=[e for t in theirs for e in t.model_stats if (e.name, e.version) in listed]
        )
        return combine_statistics([answer, counted])

    async def repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        if request.repository_name:
            raise unsupported(REPOSITORY_NAME_UNSUPPORTED)

        async def listing(client: SidecarClient) -> tuple[str, Any]:
            answer = await client.call("RepositoryIndex", request, pb.RepositoryIndexResponse)
            return client.framework, answer.models

        models = combine_indexes(await self._all(listing))
        # A model version the fleet lists but no replica answered for (every one failing
        # its health check) still shows, with the reason it cannot be served.
        listed = {(entry.name, entry.version) for entry in models}
        for health in self._registry.health.unavailable():
            if (health.model, health.version) not in listed:
                models.append(
                    pb.RepositoryIndexResponse.ModelIndex(
                        name=health.model, version=health.version, state="UNAVAILABLE", reason=health.reason()
                    )
                )
        models = self._dispatcher.experiments.in_index(models)  # a called name lists its arms
        models.sort(key=lambda m: m.name)  # stable: each model's versions keep their order
        for entry in models:
            if entry.state == "READY" and self.ensembles.runs(entry.name):
                reason = await self.ensembles.refusal(entry.name, entry.version)
                if reason:
                    entry.state, entry.reason = "UNAVAILABLE", reason
        if request.ready:
            models = [entry for entry in models if entry.state == "READY"]
        return pb.RepositoryIndexResponse(models=models)

    async def refused_ensembles(self) -> dict[str, str]:
        """The ensembles their sidecar loaded whose steps cannot run, with the reason; the
        start fails on them under --exit-on-error, as Triton's does."""

        async def ready(client: SidecarClient) -> Any:
            answer = await client.call(
                "RepositoryIndex", pb.RepositoryIndexRequest(ready=True), pb.RepositoryIndexResponse
            )
            return answer.models

        refused = {}
        for models in await self._all(ready):
            for entry in models:
                if self.ensembles.runs(entry.name):
                    reason = await self.ensembles.refusal(entry.name, entry.version)
                    if reason:
                        refused[entry.name] = reason
        return refused

    async def load_model(self, request: pb.RepositoryModelLoadRequest) -> None:
        """A client's load. As in Triton, a model it names stops being one loaded only as a
        step (unless it was loaded already), and the ensembles held for it load again."""
        if request.model_name in self._implicit and not await self.model_ready(
            pb.ModelReadyRequest(name=request.model_name)
        ):
            self._implicit.discard(request.model_name)
        try:
            await self._load(request)
        finally:
            await self._share_dependencies()

    async def _load(self, request: pb.RepositoryModelLoadRequest) -> None:
        self._check_repository_request(request.repository_name, request.parameters)
        self._held.pop(request.model_name, None)  # loaded now, held no more
        client = await self._registry.find(request.model_name)
        if client is None:
            parameters: dict[str, str | bytes] = {}
            for key, value in request.parameters.items():
                choice = value.WhichOneof("parameter_choice")
                if choice in ("string_param", "bytes_param"):
                    parameters[key] = getattr(value, choice)
            client = self._registry.placement(request.model_name, parameters)
        if client is None:
            raise unavailable(f"failed to load '{request.model_name}', no sidecar is configured")
        try:
            await on_replicas(self._registry.peers(client) or (client,), "RepositoryModelLoad", request)
        finally:
            await self._models_changed(request.model_name)
        if client.framework == ENSEMBLE_FRAMEWORK:
            await self._load_composing_models(request.model_name)
        await self._load_held(request.model_name)

    async def _load_composing_models(self, ensemble: str) -> None:
        """As Triton, loading an ensemble loads its step models that are not loaded and
        checks its steps against them; when either fails, the ensemble is unloaded again
        and the failure answers."""
        try:
            for model in await self.ensembles.composing_models(ensemble):
                if not await self.model_ready(pb.ModelReadyRequest(name=model)):
                    await self._load(pb.RepositoryModelLoadRequest(model_name=model))
                    self._implicit.add(model)
            try:
                await self.ensembles.check(ensemble)
            except TurnoutError as exc:
                raise load_failed(ensemble, exc.message) from None
        except TurnoutError:
            await self._unload(ensemble, dependents=False)
            raise

    async def _load_held(self, model: str) -> None:
        """The ensembles held for `model` whose steps are all back load again (a failure
        leaves one held and unloaded, as Triton leaves it unavailable)."""
        for ensemble, steps in list(self._held.items()):
            if model not in steps or ensemble not in self._held:  # a load above took it already
                continue
            if not all([await self.model_ready(pb.ModelReadyRequest(name=step)) for step in steps]):
                continue
            try:
                await self._load(pb.RepositoryModelLoadRequest(model_name=ensemble))
            except TurnoutError as exc:
                logger.warning("ensemble '%s' did not load again with '%s': %s", ensemble, model, exc.message)
                self._held[ensemble] = steps

    async def unload_model(self, request: pb.RepositoryModelUnloadRequest) -> None:
        """A client's unload. As in Triton, the loaded ensembles with a step running the
        model are unloaded with it (held, to load again when it is back); with
        `unload_dependents`, so are the step models an ensemble loaded that nothing else
        loaded uses any more."""
        self._check_repository_request(request.repository_name)
        parameters = request.parameters
        cascade = "unload_dependents" in parameters and parameters["unload_dependents"].bool_param
        name = request.model_name
        self._held.pop(name, None)
        self._implicit.discard(name)
        try:
            await self._unload(name, cascade, request)
        finally:
            await self._share_dependencies()

    async def _share_dependencies(self) -> None:
        """The sibling workers take this worker's dependency state (best effort: a worker
        that missed it holds its own until the next load or unload)."""
        state = pb.RepositoryModelLoadRequest()
        state.parameters["implicit"].string_param = json.dumps(sorted(self._implicit))
        state.parameters["held"].string_param = json.dumps(self._held)
        try:
            await self.siblings.share(DEPENDENCIES, state)
        except TurnoutError as exc:
            logger.warning("%s", exc.message)

    async def _unload(
        self, model: str, dependents: bool, request: pb.RepositoryModelUnloadRequest | None = None
    ) -> None:
        client = await self._registry.find(model)
        if client is None and self._registry.sidecars:
            client = self._registry.sidecars[0]  # answers Triton's own failure text
        if client is None:
            raise model_not_found(model)
        steps = await self._steps(model) if dependents and client.framework == ENSEMBLE_FRAMEWORK else []
        users = {ensemble: await self._steps(ensemble) for ensemble in await self._users(model)}
        unload = request or pb.RepositoryModelUnloadRequest(model_name=model)
        try:
            await on_replicas(self._registry.peers(client) or (client,), "RepositoryModelUnload", unload)
        finally:
            await self._models_changed(model)
        for ensemble, its_steps in users.items():
            if ensemble not in self._held:
                self._held[ensemble] = its_steps
                await self._unload(ensemble, dependents=False)
        if dependents:
            for step in steps:
                if step in self._implicit and not await self._users(step):
                    self._implicit.discard(step)
                    await self._unload(step, dependents=True)

    async def _steps(self, ensemble: str) -> list[str]:
        """The step models of a loaded ensemble; none for one that is not loaded."""
        try:
            return await self.ensembles.composing_models(ensemble)
        except TurnoutError:
            return []

    async def _users(self, model: str) -> list[str]:
        """The loaded ensembles with a step running `model`; none where an ensemble sidecar
        cannot say (the unload itself goes on)."""
        try:
            return await self.ensembles.dependents(model)
        except TurnoutError as exc:
            logger.warning("the ensembles using '%s' are unknown: %s", model, exc.message)
            return []

    async def _models_changed(self, model: str) -> None:
        """A load or unload of `model` went through here: relearn, here and in the
        sibling workers (best effort there: each relearns on its next miss anyway)."""
        changed = pb.RepositoryModelLoadRequest(model_name=model)
        await self.apply_shared(MODELS_CHANGED, changed)
        try:
            await self.siblings.share(MODELS_CHANGED, changed)
        except TurnoutError as exc:
            logger.warning("%s", exc.message)

    def _check_repository_request(self, repository_name: str, load_parameters: Any = None) -> None:
        """In Triton's order: the repository name, a load's parameters (read by its front
        end), then whether the mode lets a client load and unload at all."""
        if self._draining:
            raise unavailable(SERVER_EXITING)
        if repository_name:
            raise unsupported(REPOSITORY_NAME_UNSUPPORTED)
        for key, value in (load_parameters or {}).items():
            wanted = "string_param" if key == "config" else "bytes_param" if key.startswith("file:") else None
            if wanted is None:
                raise invalid_arg(f"unrecognized load parameter '{key}'.")
            if value.WhichOneof("parameter_choice") != wanted:
                raise invalid_arg(f"invalid value type for load parameter '{key}', expected {wanted}.")
        if self._settings.model_control_mode != "explicit":
            raise unavailable(LOAD_NOT_ALLOWED)

    # --- shared memory -----------------------------------------------------------------

    def system_shm_status(self, request: pb.SystemSharedMemoryStatusRequest) -> pb.SystemSharedMemoryStatusResponse:
        return self._shm.status(request.name)

    def locate_shared_memory(self, name: str, offset: int, byte_size: int) -> None:
        """Raise Triton's error unless region `name` holds `byte_size` bytes at `offset`."""
        self._shm.locate(name, offset, byte_size)

    def check_client_shm(self) -> None:
        """Refuse with Triton's text unless clients may register shared memory (checked
        before a request's arguments, as Triton does)."""
        self._shm.check_enabled()

    async def system_shm_register(self, request: pb.SystemSharedMemoryRegisterRequest) -> None:
        await self._shared(SHM_REGISTER, request)

    async def system_shm_unregister(self, request: pb.SystemSharedMemoryUnregisterRequest) -> None:
        await self._shared(SHM_UNREGISTER, request)

    def cuda_shm_status(self, request: pb.CudaSharedMemoryStatusRequest) -> pb.CudaSharedMemoryStatusResponse:
        return self._shm.cuda_status(request.name)

    async def cuda_shm_register(self, request: pb.CudaSharedMemoryRegisterRequest) -> None:
        await self._shared(CUDA_SHM_REGISTER, request)

    async def cuda_shm_unregister(self, request: pb.CudaSharedMemoryUnregisterRequest) -> None:
        await self._shared(CUDA_SHM_UNREGISTER, request)

    # --- trace and log settings ------------------------------------------------------------

    async def check_trace_model(self, model: str) -> None:
        """Triton keeps trace settings only for a model that is ready ("" = the global ones)."""
        if model and not await self.model_ready(pb.ModelReadyRequest(name=model)):
            raise invalid_arg(f"Request for unknown model : {model}")

    async def trace_setting(self, request: pb.TraceSettingRequest, checked: bool = False) -> pb.TraceSettingResponse:
        """Read, or update then read, the trace settings; `checked` when the caller has
        already checked the model (the HTTP front does, before it reads the body)."""
        if not checked:
            await self.check_trace_model(request.model_name)
        if request.settings:
            await self._shared(TRACE_SETTING, request)
        response = pb.TraceSettingResponse()
        for key, values in self.tracer.settings.report(request.model_name).items():
            response.settings[key].value.extend(values)
        return response

    async def forward_log_settings(self, request: pb.LogSettingsRequest) -> None:
        """Apply a client's log settings change to every sidecar too (best effort: one
        that cannot be reached keeps its levels), so both processes log alike."""
        if not request.settings:
            return
        results = await asyncio.gather(
            *(c.call("LogSettings", request, pb.LogSettingsResponse) for c in self._registry.sidecars),
            return_exceptions=True,
        )
        for client, result in zip(self._registry.sidecars, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("log settings not applied on sidecar %s: %s", client.address, result)

    async def log_settings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        if request.settings:
            await self._shared(LOG_SETTINGS, request)
        response = pb.LogSettingsResponse()
        fill_log_response(self._logs.as_dict(), response)
        return response

    # --- what every worker holds alike (gateway.workers) ----------------------------------

    async def _shared(self, method: str, request: Any) -> None:
        """Apply a change here, then in the sibling workers."""
        await self.apply_shared(method, request)
        await self.siblings.share(method, request)

    async def apply_shared(self, method: str, request: Any) -> None:
        """Apply one change of the state every worker holds alike; a sibling's control
        socket calls this too. Raises TurnoutError, changing nothing, for a bad one."""
        if method == SHM_REGISTER:
            self._shm.register(request.name, request.key, request.offset, request.byte_size)
        elif method == SHM_UNREGISTER:
            self._shm.unregister(request.name)
        elif method == CUDA_SHM_REGISTER:
            self._shm.cuda_register(request.name, request.raw_handle)
        elif method == CUDA_SHM_UNREGISTER:
            self._shm.cuda_unregister(request.name)
        elif method == TRACE_SETTING:
            updates = {key: list(value.value) for key, value in request.settings.items()}
            self.tracer.settings.update(request.model_name, updates)
        elif method == LOG_SETTINGS:
            self._logs.update(log_updates(request))
        elif method == DEPENDENCIES:
            self._implicit = set(json.loads(request.parameters["implicit"].string_param))
            self._held = json.loads(request.parameters["held"].string_param)
        elif method == MODELS_CHANGED:
            await self._registry.refresh()
            self.ensembles.forget_plans()
            self.ensembles.loaded_again(request.model_name)
            self._dispatcher.models_changed()
        else:
            raise ValueError(f"no shared change named {method!r}")

    # --- helpers -------------------------------------------------------------------------------

    async def _owner(self, model: str) -> SidecarClient:
        client = await self._registry.find(model)
        if client is None:
            raise model_not_found(model)
        return client

    async def _all(self, call: Callable[[SidecarClient], Awaitable[T]]) -> list[T]:
        """Ask every sidecar; one that cannot be reached is left out, other errors raise."""
        results = await asyncio.gather(*(call(c) for c in self._registry.sidecars), return_exceptions=True)
        answers: list[T] = []
        for client, result in zip(self._registry.sidecars, results, strict=True):
            if isinstance(result, TurnoutError) and result.status is Status.UNAVAILABLE:
                logger.warning("sidecar %s left out: %s", client.address, result.message)
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append(result)
        return answers
