"""The cyclic garbage collector paced for the event loop (the speed layer's `speed.gc_tuning`)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# young collections this many container allocations apart during the event loop (CPython's
# default is 700)
GC_YOUNG_THRESHOLD = 10_000


@contextlib.contextmanager
def fewer_gc_passes() -> Iterator[None]:
    """Run the event loop with the cyclic garbage collector paced for it, and restore it after.

    The loop allocates many small containers (block lists, tuples, events) that live until
    their request ends and almost never form reference cycles (about one collectable object
    per request on the conversation trace). With CPython's defaults the collector rescans them
    every 700 allocations, about a tenth of a replay's time. Here everything made before the
    loop (the config, libraries, the trace's first rows) is frozen out of collection
    (`gc.freeze`), unless the caller froze objects itself, and young collections are
    `GC_YOUNG_THRESHOLD` allocations apart; the collector stays on."""
    threshold = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()
