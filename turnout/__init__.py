"""The `turnout` command and what runs a whole machine from it.

- `cli`: the command (`turnout up`, `gateway`, `sidecar`, `bench`), its flags and their
  TURNOUT_* environment variables; the only module here that knows both programs' flags.
- `scan`: what `turnout up` reads from the model repositories before anything starts
  (each model's framework, the frameworks to start, which sidecar loads which model).
- `supervisor`: the sidecar child processes of `turnout up` (start, ready line, restart
  with backoff, ordered stop), and the gateway run in this process.

This package imports `gateway/`, `sidecars/` (through their command lines) and `protos/`;
nothing imports it.
"""
