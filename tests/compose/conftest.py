"""The compose tests read compose/ as data; the end-to-end one reuses the fleet harness
(tests/fleet/fleet_harness.py) to run the topology as local processes."""

from __future__ import annotations

import sys
from pathlib import Path

# fleet_harness lives beside the fleet tests; pytest puts tests/fleet on sys.path only
# when it collects them, and these tests also run alone.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fleet"))
