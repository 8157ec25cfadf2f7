"""Progress lines of a multi-process run, one per rank and event, timed from the start of the
process: a run that stalls shows on which rank and where."""

from __future__ import annotations

import sys
import time

from decodelab.parallel.group import TPGroup


def log(world: TPGroup, msg: str) -> None:
    """Progress on every rank (a multi-process run that stalls must show where); on stderr,
    which the exported report leaves out."""
    print(f"[tp rank {world.rank} {time.perf_counter() - _T0:7.1f} s] {msg}", file=sys.stderr,
          flush=True)


_T0 = time.perf_counter()
