"""Step markers TensorBoard's Profile tab can use under `steps_per_execution` too.

The Profile tab times steps between `Trace("train", step_num=N, _r=1)` markers
(https://www.tensorflow.org/guide/profiler); under `steps_per_execution` > 1 xprof groups by `tf.while_loop`
iterations instead (`group_events.cc` in xla/tsl), so the Overview shows no step time. `group_steps_by_markers`
zeroes `iter_num` so xprof groups by the markers.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from tftrain.files import replaced

ITER_NUM_STAT = "iter_num"
"""The XPlane statistic holding an event's `tf.while_loop` iteration."""


def step_marker_name(num_steps: int) -> str:
    """`"train"` or `"train(N steps)"`: the Profile tab takes any name starting "train" without "/" as a marker."""
    return "train" if num_steps <= 1 else f"train({int(num_steps)} steps)"


def group_steps_by_markers(path) -> int:
    """Zeroes the nonzero `iter_num` statistics of a `.xplane.pb` trace, in place.

    Returns:
        The number rewritten (0: untouched, also when this TensorFlow lacks the schema, with a warning).
    """
    # TensorFlow ships the XSpace schema; no public API reads or writes the file.
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        warnings.warn("This TensorFlow has no tensorflow.tsl.profiler.protobuf.xplane_pb2, so the trace is left as "
                      "written: under steps_per_execution > 1 TensorBoard's Overview may show no step time.",
                      stacklevel=2)
        return 0

    path = Path(path)
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    changed = 0
    for plane in space.planes:
        ids = {key for key, meta in plane.stat_metadata.items() if meta.name == ITER_NUM_STAT}
        if not ids:
            continue
        for line in plane.lines:
            for event in line.events:
                for stat in event.stats:
                    if stat.metadata_id in ids and (stat.int64_value or stat.uint64_value):
                        stat.int64_value = 0  # the value is a oneof: this clears uint64_value too
                        changed += 1
    if changed:
        with replaced(path) as tmp:
            tmp.write_bytes(space.SerializeToString())
    return changed
