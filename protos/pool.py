"""The descriptor pool our generated modules register in.

tritonclient registers the same `inference.*` messages in protobuf's default pool;
with ours in a pool of their own, one process can hold both (tests, benchmarks, and
applications that embed a client beside the gateway).
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
