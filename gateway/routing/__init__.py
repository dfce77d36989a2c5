"""Where one inference goes: which version of the model, then which replica of it.

- `dispatch`: the path of one request; asks `versions` for a version, then `replicas` for
  a replica (or `sequences` for where its sequence is), and fails over to another replica
  when one cannot be reached.
- `versions`: version choice: a model's policy (weights, sticky header, shadow), weighted
  draws and sticky keys by weighted rendezvous hashing.
- `replicas`: replica choice: power of two choices on outstanding requests, ejection of a
  failed replica until a probe finds it ready.
- `sequences`: placement of stateful sequences: the replica order a sequence id gives,
  alike on every gateway, and pins (a cache) of where this gateway's sequences went.
- `shadows`: copies of requests sent through `dispatch` to a candidate version after the
  primary answered (`core.Gateway` hands them over).
- `policy_sources`: where policies come from (a YAML file, a Consul KV prefix) and the
  store that holds the ones in force.

Version choice never sees replicas and replica choice never sees versions: `dispatch`
joins them through the registry (`gateway.registry`, `gateway.discovery`).
"""
