"""Ensembles, run by the gateway: each step goes through the normal dispatch path to the
sidecar that owns its model, steps whose inputs are ready run concurrently, and tensors
move between steps as the raw bytes the sidecars answered, never decoded.

The ensemble sidecar owns the configs (metadata, index, load, unload); the gateway
keeps the ensembles' inference statistics, since only it sees their requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from gateway.context import RequestContext
from gateway.ensemble_plan import Plan, Step, build_plan
from gateway.registry import ModelRegistry
from gateway.routing.dispatch import Dispatcher
from gateway.tracing.trace import REQUEST_END, Trace
from protos import codec
from protos import grpc_service_pb2 as pb
from protos import model_config_pb2 as mc
from protos.datatypes import BY_NAME
from protos.ensemble_steps import check_step_configs
from protos.statistics import BatchTimes, VersionStatistics
from protos.status import TurnoutError, decoupled_refused, invalid_arg, model_not_found, unsupported
from protos.validation import ValidRequest, validate

ENSEMBLE_FRAMEWORK = "ensemble"
# Where a decoupled ensemble's answers go, one serialized ModelInferResponse at a time,
# and whether it is the ensemble's last.
Emit = Callable[[bytes, bool], Awaitable[None]]
CLASSIFICATION = "classification"
# Plans are rebuilt after this long, so configs that changed without a load through this
# gateway (poll mode, another gateway of a fleet) are picked up.
PLAN_LIFETIME_SECS = 5.0


@dataclass(frozen=True)
class Tensor:
    """An ensemble tensor in flight: raw protocol bytes with their datatype and shape."""

    datatype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class _Run:
    """What every step of one ensemble request shares: its plan, the request and the
    ensemble outputs it asks for."""

    plan: Plan
    request: pb.ModelInferRequest
    wanted: dict[str, pb.ModelInferRequest.InferRequestedOutputTensor]


class Ensembles:
    """Runs the ensembles the ensemble sidecar serves, and keeps their statistics."""

    def __init__(self, registry: ModelRegistry, dispatcher: Dispatcher) -> None:
        self._registry = registry
        self._dispatcher = dispatcher
        self._plans: dict[tuple[str, str], tuple[Plan, float]] = {}  # plan, built at (monotonic)
        # Triton's counters for an ensemble: a request is one execution whose compute time is the
        # span of its steps (their own queue and compute times are in their models' statistics).
        self._statistics: dict[tuple[str, str], VersionStatistics] = {}
        # Ensemble versions whose steps passed the load checks: as in Triton, one stays
        # accepted until it is loaded again, whatever later happens to its step models.
        self._accepted: set[tuple[str, str]] = set()

    def runs(self, model: str) -> bool:
        """Whether `model` is an ensemble (one dictionary lookup: this is on every request's path)."""
        owner = self._registry.owner(model)
        return owner is not None and owner.framework == ENSEMBLE_FRAMEWORK

    def forget_plans(self) -> None:
        """Drop every plan: after a load or unload, ensemble or step configs may differ."""
        self._plans.clear()

    def statistics(self) -> list[pb.ModelStatistics]:
        """Every ensemble version's counters, for the metrics scrape."""
        answers = []
        for (model, version), stats in sorted(self._statistics.items()):
            entry = pb.ModelStatistics(name=model, version=version)
            stats.fill(entry)
            answers.append(entry)
        return answers

    async def dependents(self, model: str) -> list[str]:
        """The loaded ensembles that have a step running `model` (Triton's dependents)."""
        found: set[str] = set()
        for client in self._registry.sidecars:
            if client.framework != ENSEMBLE_FRAMEWORK:
                continue
            index = await client.call(
                "RepositoryIndex", pb.RepositoryIndexRequest(ready=True), pb.RepositoryIndexResponse
            )
            for entry in index.models:
                request = pb.ModelConfigRequest(name=entry.name, version=entry.version)
                config = (await client.call("ModelConfig", request, pb.ModelConfigResponse)).config
                if any(step.model_name == model for step in config.ensemble_scheduling.step):
                    found.add(entry.name)
        return sorted(found)

    async def composing_models(self, model: str) -> list[str]:
        """The step models of a loaded ensemble's newest version, in step order."""
        owner = await self._registry.find(model)
        if owner is None:
            return []
        config = (await owner.call("ModelConfig", pb.ModelConfigRequest(name=model), pb.ModelConfigResponse)).config
        return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))

    async def check(self, model: str) -> None:
        """Build the newest version's plan now, so step maps that contradict their models
        fail the ensemble's load, as in Triton, rather than its first request."""
        self.loaded_again(model)
        self._plans.pop((model, self._newest_version(model)), None)
        await self._plan(model, "")

    async def refusal(self, model: str, version: str = "") -> str:
        """Why a loaded ensemble version is refused ("" when it is not), as Triton refuses
        such an ensemble at load: a step model missing or not loaded, or step maps that
        contradict the step models as loaded. A refusal is checked again on every call
        (a fleet's step sidecars may join later); an acceptance holds until a reload."""
        key = (model, version or self._newest_version(model))
        if key in self._accepted:
            return ""
        try:
            await self._plan(model, version)
        except TurnoutError as exc:
            return exc.message
        self._accepted.add(key)
        return ""

    async def complete_config(self, config: mc.ModelConfig, version: str) -> None:
        """Core's completion of a loaded ensemble's config: decoupled when a step on its data
        flow is (left as the sidecar gave it when its steps cannot be read now)."""
        try:
            plan = await self._plan(config.name, version)
        except TurnoutError:
            return
        config.model_transaction_policy.decoupled = plan.decoupled
        config.model_transaction_policy.SetInParent()

    def loaded_again(self, model: str) -> None:
        """`model` was loaded or unloaded: its versions are checked afresh."""
        self._accepted = {key for key in self._accepted if key[0] != model}

    def fill_statistics(self, response: pb.ModelStatisticsResponse) -> None:
        """Put the gateway's counters into the entries of ensembles in a sidecars' answer."""
        for entry in response.model_stats:
            stats = self._statistics.get((entry.name, entry.version))
            if stats is not None:
                stats.fill(entry)

    async def infer(self, request: pb.ModelInferRequest, version: str, context: RequestContext) -> bytes:
        """Run an ensemble; `request` has no shared-memory tensors left. Returns a
        serialized ModelInferResponse with the requested (else all) ensemble outputs."""
        started = time.perf_counter_ns()
        plan = await self._plan(request.model_name, version)
        stats = self._statistics.setdefault((plan.name, plan.version), VersionStatistics())
        answers = context.responses
        if plan.decoupled and answers is None:  # one answer asked of an ensemble that streams
            raise decoupled_refused()
        # Refused here, as Triton's core refuses any request before it runs (its texts,
        # naming the ensemble, in its order): not counted in the ensemble's statistics.
        valid = validate(request, plan.signature)
        tensors = _request_tensors(request, valid)
        wanted = _wanted_outputs(request, plan)
        run = _Run(plan, request, wanted)
        try:
            queued_ns = time.perf_counter_ns() - started
            if answers is not None and plan.decoupled:
                final: list[bytes] = []

                async def send(answer: bytes, last: bool) -> None:
                    if last:
                        final.append(answer)
                    else:
                        answers(answer)

                # Each response of a decoupled step, through the steps after it, is one
                # response of the ensemble. The one its last response (if that carried
                # outputs) makes is the ensemble's last; else the final flag comes alone.
                await self._run_steps(run, tensors, context, emit=send)
                response = final[0] if final else b""
            else:
                await self._run_steps(run, tensors, context)
                response = _response(request, plan, tensors, wanted)
        except (TurnoutError, asyncio.CancelledError):
            stats.record_failure(time.perf_counter_ns() - started)
            raise
        total_ns = time.perf_counter_ns() - started
        times = BatchTimes(valid.batch_size, 0, total_ns - queued_ns, 0)  # no tensors to copy in or out
        stats.record_batch(times)
        stats.record_success(total_ns, queued_ns, times)
        return response

    # --- plans ------------------------------------------------------------------------

    async def _plan(self, model: str, version: str) -> Plan:
        owner = self._registry.owner(model)
        if owner is None:
            raise model_not_found(model)
        if not version:
            version = self._newest_version(model)
        if not version:  # the registry does not know the READY versions (poll mode): ask
            asked = pb.ModelMetadataRequest(name=model)
            metadata = await owner.call("ModelMetadata", asked, pb.ModelMetadataResponse)
            version = str(max(int(v) for v in metadata.versions))
        cached = self._plans.get((model, version))
        if cached is not None and time.monotonic() - cached[1] < PLAN_LIFETIME_SECS:
            return cached[0]
        config_request = pb.ModelConfigRequest(name=model, version=version)
        config = (await owner.call("ModelConfig", config_request, pb.ModelConfigResponse)).config
        steps = await asyncio.gather(*(self._step_config(model, step) for step in config.ensemble_scheduling.step))
        check_step_configs(config, steps)
        plan = build_plan(config, version, steps)
        self._plans[(model, version)] = (plan, time.monotonic())
        return plan

    def _newest_version(self, model: str) -> str:
        ready = self._registry.ready_versions(model)
        return str(max(int(v) for v in ready)) if ready else ""

    async def _step_config(self, ensemble: str, step: mc.ModelEnsembling.Step) -> mc.ModelConfig:
        """The step model's complete config. A model no sidecar lists fails as Triton
        fails such an ensemble's load; one listed but not loaded fails as its step would."""
        owner = await self._registry.find(step.model_name)
        if owner is None:
            raise invalid_arg(f"ensemble '{ensemble}' depends on '{step.model_name}' which has no loaded version.")
        version = "" if step.model_version < 0 else str(step.model_version)
        request = pb.ModelConfigRequest(name=step.model_name, version=version)
        try:
            return (await owner.call("ModelConfig", request, pb.ModelConfigResponse)).config
        except TurnoutError as exc:
            raise in_ensemble(ensemble, exc) from exc

    # --- running ----------------------------------------------------------------------

    async def _run_steps(
        self,
        run: _Run,
        tensors: dict[str, Tensor],
        context: RequestContext,
        steps: Sequence[Step] | None = None,
        emit: Emit | None = None,
        last: bool = False,
    ) -> None:
        """Start every step (of `steps`, else of the plan) whose inputs exist, as soon as
        they do; the first step that fails fails the ensemble, and the steps still running
        are cancelled. A decoupled step takes the steps after it along: each of its
        responses runs them on its own. Where `steps` runs such a response's way and no
        decoupled step follows, the ensemble's answer for that response goes to `emit`
        (`last` when it answers the last response of every decoupled step before it)."""
        # An optional ensemble input the request leaves out is left out of its steps too.
        plan = run.plan
        absent = {name for name, spec in plan.signature.inputs.items() if spec.optional and name not in tensors}
        waiting = list(plan.steps if steps is None else steps)
        running: set[asyncio.Task[dict[str, Tensor]]] = set()
        streamed = False
        try:
            while waiting or running:
                for step in [s for s in waiting if all(t in tensors or t in absent for _, t in s.inputs)]:
                    waiting.remove(step)
                    if step.index in plan.decoupled_steps and emit is not None:
                        later = [s for s in waiting if s.index in plan.after[step.index]]
                        waiting = [s for s in waiting if s not in later]
                        streamed = True
                        started = self._run_decoupled_step(
                            run, step, later, tensors, context, emit, last or steps is None
                        )
                    else:
                        started = self._run_step(run, step, tensors, context)
                    running.add(asyncio.create_task(started))
                if not running:
                    raise _deadlock(plan, run.request)
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    tensors.update(task.result())
        finally:
            for task in running:
                task.cancel()
        if steps is not None and emit is not None and not streamed:
            await emit(_response(run.request, plan, tensors, run.wanted), last)

    async def _run_step(
        self, run: _Run, step: Step, tensors: dict[str, Tensor], context: RequestContext
    ) -> dict[str, Tensor]:
        if context.responses is not None:  # a stream's: a step answers once, to the ensemble
            context = replace(context, responses=None)
        encoded = await self._send_step(run, step, tensors, context)
        return _outputs_of(step, pb.ModelInferResponse.FromString(encoded))

    async def _run_decoupled_step(
        self,
        run: _Run,
        step: Step,
        later: list[Step],
        tensors: dict[str, Tensor],
        context: RequestContext,
        emit: Emit,
        last: bool,
    ) -> dict[str, Tensor]:
        """Run a decoupled step: each response it sends runs `later` on tensors of its own
        (concurrently), and the ensemble's answers go to `emit` in the order of the
        responses that caused them (`last`: this step's last response may make the
        ensemble's last answer). Its error response fails the ensemble: the responses after
        it are dropped, as Triton's ensemble stops at it."""
        loop = asyncio.get_running_loop()
        previous: asyncio.Future[None] = loop.create_future()
        previous.set_result(None)
        branches: list[asyncio.Task[None]] = []
        failure: list[TurnoutError] = []
        ended = False  # the step sent its last response

        def branch(answer: bytes, final: bool) -> None:
            nonlocal previous
            turn, done = previous, loop.create_future()
            previous = done
            number = len(branches)

            async def in_turn(out: bytes, its_last: bool) -> None:
                await turn
                # As Triton's ensemble: an answer that steps after this one made, ready
                # once nothing else can follow it, is the last (with the final flag) even
                # if the step sent its flag alone; one the step made itself went out as
                # it came, before any flag; after a failure, the error is the last word.
                newest = bool(later) and ended and not failure and number == len(branches) - 1
                await emit(out, its_last or (last and newest))

            async def follow() -> None:
                try:
                    produced = _outputs_of(step, pb.ModelInferResponse.FromString(answer))
                    if produced:  # a response without outputs (its final flag) runs nothing
                        branch_tensors = {**tensors, **produced}
                        await self._run_steps(run, branch_tensors, context, later, in_turn, final)
                finally:
                    # Done once its answers are out and those before them too.
                    turn.add_done_callback(lambda _: _settle(done))

            branches.append(asyncio.create_task(follow()))

        def part(answer: bytes | TurnoutError) -> None:
            if failure:
                return
            if isinstance(answer, TurnoutError):
                failure.append(in_ensemble(run.plan.name, answer))
            else:
                branch(answer, final=False)

        try:
            try:
                answer = await self._send_step(run, step, tensors, replace(context, responses=part))
            except TurnoutError as exc:  # its last response an error, or no response at all
                failure.append(exc)
                answer = b""
            ended = True
            if answer and not failure:
                branch(answer, final=last)
            # The responses before an error still make their answers, which go out first.
            await asyncio.gather(*branches)
        finally:
            for task in branches:
                task.cancel()
        if failure:
            raise failure[0]
        return {}

    async def _send_step(self, run: _Run, step: Step, tensors: dict[str, Tensor], context: RequestContext) -> bytes:
        """One step's request built from the tensors it takes, sent; its (last) answer."""
        forward = pb.ModelInferRequest(model_name=step.model, id=run.request.id)
        for key, value in run.request.parameters.items():
            forward.parameters[key].CopyFrom(value)
        for model_input, tensor_name in step.inputs:
            tensor = tensors.get(tensor_name)
            if tensor is None:
                continue  # an optional input the request left out
            forward.inputs.add(name=model_input, datatype=tensor.datatype, shape=tensor.shape)
            forward.raw_input_contents.append(tensor.data)
        for model_output, output_tensor in step.outputs:
            output = forward.outputs.add(name=model_output)
            # Classification of an ensemble output is asked of the step that computes it.
            asked = run.wanted.get(output_tensor)
            if asked is not None and CLASSIFICATION in asked.parameters:
                output.parameters[CLASSIFICATION].CopyFrom(asked.parameters[CLASSIFICATION])
        if not step.version:
            decision = self._dispatcher.decide(step.model, "", context)
            # A step names a model that serves: an experiment's arms of other models are for clients.
            version = "" if decision.model else decision.version
        else:
            version = step.version
        forward.model_version = version
        try:
            if context.trace is None:
                return await self._dispatcher.send(step.model, version, forward.SerializeToString(), context)
            return await self._send_step_traced(context.trace, step.model, version, forward, context)
        except TurnoutError as exc:
            raise in_ensemble(run.plan.name, exc) from exc

    async def _send_step_traced(
        self, trace: Trace, model: str, version: str, forward: pb.ModelInferRequest, context: RequestContext
    ) -> bytes:
        """A step of a traced ensemble request runs under a child trace of its own, as Triton's."""
        child = trace.child(model, version)
        child.start_request(version, forward.id)
        try:
            payload = forward.SerializeToString()
            return await self._dispatcher.send_traced(child, model, version, payload, replace(context, trace=child))
        finally:
            child.stamp(REQUEST_END)
            child.finish()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _outputs_of(step: Step, response: pb.ModelInferResponse) -> dict[str, Tensor]:
    """The ensemble tensors a step's response fills, by the step's output map."""
    produced = dict(step.outputs)
    raw = response.raw_output_contents
    results: dict[str, Tensor] = {}
    for index, output in enumerate(response.outputs):
        produced_as = produced.get(output.name)
        if produced_as is not None:
            data = raw[index] if index < len(raw) else b""
            results[produced_as] = Tensor(output.datatype, tuple(output.shape), data)
    return results


def in_ensemble(ensemble: str, error: TurnoutError) -> TurnoutError:
    """A step's error as Triton words it: the ensemble's name before the step model's text."""
    return TurnoutError(error.status, f"in ensemble '{ensemble}', {error.message}")


def _request_tensors(request: pb.ModelInferRequest, valid: ValidRequest) -> dict[str, Tensor]:
    """The inputs of a request validated against the ensemble, as raw tensors: the raw
    contents as they came, typed `contents` as the bytes of the arrays validation decoded."""
    raw = request.raw_input_contents  # validated: raw for every input, or contents for every input
    return {
        tensor.name: Tensor(
            tensor.datatype,
            tuple(tensor.shape),
            raw[position] if raw else codec.to_raw(valid.inputs[tensor.name], BY_NAME[tensor.datatype]),
        )
        for position, tensor in enumerate(request.inputs)
    }


def _wanted_outputs(
    request: pb.ModelInferRequest, plan: Plan
) -> dict[str, pb.ModelInferRequest.InferRequestedOutputTensor]:
    """The outputs to answer, by name, in answer order: those requested, else all."""
    if not request.outputs:
        return {name: pb.ModelInferRequest.InferRequestedOutputTensor(name=name) for name in plan.outputs}
    wanted = {}
    for output in request.outputs:  # validated: each one an output of the ensemble
        if CLASSIFICATION in output.parameters and output.name in plan.consumed:
            # The step that computes it classifies it, and a later step would get the classes.
            raise unsupported(
                f"classification of output '{output.name}' of ensemble '{plan.name}', which a step consumes, "
                "is not supported"
            )
        wanted[output.name] = output
    return wanted


def _response(
    request: pb.ModelInferRequest,
    plan: Plan,
    tensors: dict[str, Tensor],
    wanted: dict[str, pb.ModelInferRequest.InferRequestedOutputTensor],
) -> bytes:
    response = pb.ModelInferResponse(model_name=plan.name, model_version=plan.version, id=request.id)
    for name in (name for name in plan.answer_order if name in wanted):
        tensor = tensors.get(name)
        if tensor is None:  # a step answered without an output its map names
            raise _deadlock(plan, request)
        response.outputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(tensor.data)
    encoded: bytes = response.SerializeToString()
    return encoded


def _deadlock(plan: Plan, request: pb.ModelInferRequest) -> TurnoutError:
    """Triton's text for an ensemble whose steps ended without writing every output."""
    prefix = f"[request id: {request.id or '<id_unknown>'}] "
    return invalid_arg(
        f"in ensemble '{plan.name}', {prefix}unexpected deadlock, at least one output is not set "
        "while no more ensemble steps can be made"
    )
