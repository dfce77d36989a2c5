"""Where one inference goes: which version of the model, then which replica of it.

- `dispatch`: the path of one request; asks `versions` for a version (or `sequences` for
  the pin its sequence holds), then `replicas` for a replica, and fails over to another
  replica when one cannot be reached.
- `versions`: version choice: a model's policy (weights, sticky header, shadow), weighted
  draws and sticky keys by weighted rendezvous hashing. An arm is a version, or another
  model's version in an experiment (`resnet_trt:1`), answered under the called name.
- `replicas`: replica choice: power of two choices on outstanding requests, ejection of a
  failed replica until a probe finds it ready.
- `sequences`: pins of stateful sequences to the version and replica that took START.
- `shadows`: copies of requests sent through `dispatch` to a candidate arm after the
  primary answered (`core.Gateway` hands them over), compared within a tolerance.
- `policy_sources`: where policies come from (a YAML file, a Consul KV prefix) and the
  store that holds the ones in force.

Version choice never sees replicas and replica choice never sees versions: `dispatch`
joins them through the registry (`gateway.registry`, `gateway.discovery`).
"""
