"""Step markers that TensorBoard's Profile tab can use, under `steps_per_execution` too.

The Profile tab's Overview and Input Pipeline pages measure step time between
step markers: `tf.profiler.experimental.Trace("train", step_num=N, _r=1)` events
around each training step (https://www.tensorflow.org/guide/profiler).

Keras 3 runs `steps_per_execution` > 1 as a `tf.while_loop` inside one
`tf.function` call. The profile converter (xprof, behind the Profile tab) groups a
trace that holds loop iterations by those iterations and then ignores the step
markers (`EventForest::CreateEventGroups` and `ProcessTensorFlowLoop` in
`xla/tsl/profiler/utils/group_events.cc`); the iterations carry no step time,
so the Overview reads "No step time measured" and the Input Pipeline page is
empty. `group_steps_by_markers` rewrites the `iter_num` statistic of the captured
events to 0, so that xprof finds no loop and groups by the step markers: one
step per execution. Nothing else in the trace changes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

ITER_NUM_STAT = "iter_num"
"""The XPlane statistic TensorFlow's executor writes with the `tf.while_loop` iteration of an event."""


def step_marker_name(num_steps: int) -> str:
    """The step-marker name for an execution of `num_steps` optimizer steps.

    `"train"` for one step; `"train(N steps)"` for N, so that the Overview's step
    column (`"<name> <step_num>"`, e.g. `"train(8 steps) 16"`) says that one of its
    steps covers N optimizer steps. The Profile tab takes any name that starts
    with "train" and holds no "/" as a step marker.
    """
    return "train" if num_steps <= 1 else f"train({int(num_steps)} steps)"


def group_steps_by_markers(path) -> int:
    """Rewrites a `.xplane.pb` trace so the Profile tab groups its steps by step markers.

    Sets every nonzero `iter_num` statistic to 0 (see the module docstring) and
    rewrites the file in place; a trace without loop iterations is left as it is.

    Args:
        path: a `.xplane.pb` file written by `tf.profiler.experimental.stop()`.

    Returns:
        The number of statistics rewritten (0: the file was not touched, also when
        this TensorFlow no longer ships the schema; a warning then says so).
    """
    # The XSpace schema of the file TensorFlow writes; TensorFlow ships it, and no
    # public API reads or writes the file.
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
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(space.SerializeToString())
        tmp.replace(path)
    return changed
