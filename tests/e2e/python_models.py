"""Python-backend models the python sidecar tests write into a repository: each a
`model.py` as Triton's python backend runs it (`import triton_python_backend_utils`)."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
dynamic_batching { max_queue_delay_microseconds: 100000 }
instance_group [{ kind: KIND_CPU count: 1 }]
"""

# Sync execute; reports how many requests each execute got, so batching is visible.
ADD_SUB_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        config = json.loads(args["model_config"])
        self.dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            parameters = {
                "batch": len(requests),
                "instance": self.args["model_instance_name"],
                "kind": self.args["model_instance_kind"],
                "request_id": request.request_id(),
                "echo": json.loads(request.parameters()).get("echo", ""),
                "requested": ",".join(request.requested_output_names()),
            }
            outputs = [
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs, parameters=parameters))
        return responses

    def finalize(self):
        print("add_sub finalized")
"""

# No config.pbtxt: everything comes from auto_complete_config; execute is async.
AUTO_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_INT64", "dims": [2]})
        config.add_output({"name": "Y", "data_type": "TYPE_INT64", "dims": [2]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    async def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)])
            for r in requests
        ]
"""

MISBEHAVING_CONFIG = """
name: "misbehaving"
backend: "python"
input [{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]
instance_group [{ kind: KIND_CPU count: 1 }]
"""

# Misbehaves as the request's `mode` parameter says; counts its executions in a custom metric.
MISBEHAVING_MODEL = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Each family is kept: once its object is gone, its metrics refuse every operation
        # and leave the metrics port, as in Triton.
        self.executions_family = pb_utils.MetricFamily(
            name="misbehaving_executions",
            description="Executions of the misbehaving model",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.executions = self.executions_family.Metric(labels={"model": args["model_name"]})
        self.cancel_family = pb_utils.MetricFamily(
            name="misbehaving_saw_cancel", description="Cancellations seen", kind=pb_utils.MetricFamily.GAUGE
        )
        self.saw_cancel = self.cancel_family.Metric()
        # A family dropped at once, as a model may do by mistake.
        dropped = pb_utils.MetricFamily(
            name="misbehaving_dropped", description="Dropped at once", kind=pb_utils.MetricFamily.COUNTER
        )
        self.orphan = dropped.Metric()
        del dropped
        self.pid = os.getpid()

    def execute(self, requests):
        self.executions.increment(1)
        mode = json.loads(requests[0].parameters()).get("mode", "")
        if mode == "raise":
            raise ValueError("the model failed on purpose")
        if mode == "die":
            os._exit(3)
        if mode == "hang":
            time.sleep(4)
        if mode == "until_cancelled":
            deadline = time.monotonic() + 10
            while not requests[0].is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.05)
            self.saw_cancel.set(1 if requests[0].is_cancelled() else -1)
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            return [pb_utils.InferenceResponse(error=error)]
        if mode == "orphan":
            self.orphan.increment(1)  # raises: its family object is gone
        if mode == "count":
            return []
        if mode == "type":
            return tuple()
        if mode == "error":
            error = pb_utils.TritonError("bad input on purpose", pb_utils.TritonError.INVALID_ARG)
            return [pb_utils.InferenceResponse(error=error)]
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            count = self.executions.value()
            out = pb_utils.Tensor("OUT", (value * 0 + self.pid).astype("int32"))
            responses.append(pb_utils.InferenceResponse([out], parameters={"executions": int(count)}))
        return responses
"""

BLS_CONFIG = """
name: "bls"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""

# Runs the model its `target` parameter names (sync exec, or async_exec with `async`).
BLS_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            call = pb_utils.InferenceRequest(
                model_name=parameters.get("target", "simple"),
                inputs=[pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")],
                requested_output_names=["OUTPUT0", "OUTPUT1"],
            )
            if parameters.get("stream"):  # "5,6,7": a decoupled call to `repeat`, its answers in words
                responses.append(self.stream(parameters["stream"], parameters.get("stream_target", "repeat")))
                continue
            answer = await call.async_exec() if parameters.get("async") else call.exec()
            if answer.has_error():
                message = answer.error().message()
                if parameters.get("code"):  # whether BLS gave the error Triton's INTERNAL code
                    message += " (INTERNAL)" if answer.error().code() == pb_utils.TritonError.INTERNAL else " (other)"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
                continue
            outputs = [pb_utils.get_output_tensor_by_name(answer, n) for n in ("OUTPUT0", "OUTPUT1")]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(t.name(), t.as_numpy()) for t in outputs]))
        return responses

    def stream(self, values, target):
        call = pb_utils.InferenceRequest(
            model_name=target,
            inputs=[pb_utils.Tensor("IN", np.array([int(v) for v in values.split(",")], dtype=np.int32))],
            requested_output_names=["OUT"],
            parameters={"fail_at": 1},
        )
        seen = []
        for answer in call.exec(decoupled=True):
            if answer.has_error():
                seen.append("error: " + answer.error().message())
            elif answer.output_tensors():
                seen.append(str(int(pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()[0])))
            else:
                seen.append("empty")
        return pb_utils.InferenceResponse([], parameters={"seen": " | ".join(seen)})
"""

REPEAT_CONFIG = """
name: "repeat"
backend: "python"
model_transaction_policy { decoupled: true }
input [{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [{ kind: KIND_CPU count: 1 }]
"""

# Decoupled: one response per element of IN, sent from a thread after execute returned,
# then the final flag alone (`final: together` sends it with the last response instead);
# `fail_at: i` sends an error response in place of the i-th, and goes on.
REPEAT_MODEL = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            parameters = json.loads(request.parameters())
            together = parameters.get("final") == "together"
            fail_at = parameters.get("fail_at", -1)
            thread = threading.Thread(target=self.send, args=(request.get_response_sender(), values, together, fail_at))
            thread.start()
        return None

    def send(self, sender, values, together, fail_at):
        for index, value in enumerate(values):
            time.sleep(0.01)
            if index == fail_at:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"no answer for {value}")))
                continue
            outputs = [
                pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
            ]
            last = together and index == len(values) - 1
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
            sender.send(pb_utils.InferenceResponse(outputs), flags=flags)
        if not (together and len(values)):
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

ACCUMULATE_CONFIG = """
name: "accumulate"
backend: "python"
max_batch_size: 0
sequence_batching {
  control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }] }]
  state [{
    input_name: "TOTAL_IN" output_name: "TOTAL_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }
  }]
}
input [{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }]
output [
  { name: "TOTAL" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

# A running total in the sequence's implicit state; SEEN says what the request carried.
ACCUMULATE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            def value(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

            total = (value("TOTAL_IN") + value("X")).astype(np.int32)
            seen = f"{request.correlation_id()}:{request.flags()}:{int(value('START')[0])}"
            outputs = [
                pb_utils.Tensor("TOTAL", total),
                pb_utils.Tensor("TOTAL_OUT", total),
                pb_utils.Tensor("SEEN", np.array([seen.encode()], dtype=object)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

NAMED_CONFIG = """
name: "named"
backend: "python"
default_model_filename: "entry.py"
input [{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }]
"""

NAMED_MODEL = """
import json
import time

import triton_python_backend_utils as pb_utils
from helpers import triple


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:  # `delay_ms`: answer late (an ensemble's later step, slowed)
            time.sleep(json.loads(request.parameters() or "{}").get("delay_ms", 0) / 1000)
        inputs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", triple(x))]) for x in inputs]
"""

# A python step then an ONNX one: bls (a+b, a-b) into simple, so OUTPUT0 = 2a, OUTPUT1 = 2b.
MIXED_ENSEMBLE_CONFIG = """
name: "mixed"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "TWICE_A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "TWICE_B" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "bls"
      model_version: -1
      input_map { key: "INPUT0" value: "A" }
      input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" }
      output_map { key: "OUTPUT1" value: "difference" }
    },
    {
      model_name: "simple"
      model_version: -1
      input_map { key: "INPUT0" value: "sum" }
      input_map { key: "INPUT1" value: "difference" }
      output_map { key: "OUTPUT0" value: "TWICE_A" }
      output_map { key: "OUTPUT1" value: "TWICE_B" }
    }
  ]
}
"""


# Decoupled: each response of `repeat` goes on through `named` (3x), and is one response.
TRIPLED_ENSEMBLE_CONFIG = """
name: "tripled"
platform: "ensemble"
input [{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }]
output [
  { name: "TRIPLE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "repeat"
      model_version: -1
      input_map { key: "IN" value: "IN" }
      output_map { key: "OUT" value: "value" }
      output_map { key: "IDX" value: "IDX" }
    },
    {
      model_name: "named"
      model_version: -1
      input_map { key: "X" value: "value" }
      output_map { key: "Y" value: "TRIPLE" }
    }
  ]
}
"""


def write_python_models(repo: Path) -> Path:
    for name, config, model in (
        ("add_sub", ADD_SUB_CONFIG, ADD_SUB_MODEL),
        ("auto", None, AUTO_MODEL),
        ("misbehaving", MISBEHAVING_CONFIG, MISBEHAVING_MODEL),
        ("bls", BLS_CONFIG, BLS_MODEL),
        ("repeat", REPEAT_CONFIG, REPEAT_MODEL),
        ("accumulate", ACCUMULATE_CONFIG, ACCUMULATE_MODEL),
    ):
        version = repo / name / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(model)
        if config is not None:
            (repo / name / "config.pbtxt").write_text(config)
    # default_model_filename names the file; a module beside it imports as in Triton.
    named = repo / "named" / "1"
    named.mkdir(parents=True)
    (repo / "named" / "config.pbtxt").write_text(NAMED_CONFIG)
    (named / "entry.py").write_text(NAMED_MODEL)
    (named / "helpers.py").write_text("def triple(x):\n    return x * 3\n")
    for name, config in (("mixed", MIXED_ENSEMBLE_CONFIG), ("tripled", TRIPLED_ENSEMBLE_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    return repo


def stream_repeat(
    url: str, values: list[int], errors_in_band: bool = False, model: str = "repeat", **options: Any
) -> list[Any]:
    """A request to `repeat` (or another `model` taking IN) on a tritonclient gRPC stream
    (the sync client, which can ask for the empty final response); every answer up to the
    one marked final, with `errors_in_band` an error response as its InferenceServerException."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    inputs = [grpcclient.InferInput("IN", [len(values)], "INT32")]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    got = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer(model, inputs, request_id="s1", **options)
            while True:
                result, error = answers.get(timeout=30)
                if errors_in_band and error is not None:
                    got.append(error)
                    continue
                assert error is None, error
                got.append(result)
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return got
        finally:
            client.stop_stream()
