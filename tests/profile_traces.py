"""Reading TensorFlow profiler traces (`.xplane.pb`) in tests."""

from collections import Counter


def read_xspace(path):
    """Parses one `.xplane.pb` file into an XSpace proto."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def event_counts(space) -> Counter:
    """Number of trace events per event name, over every plane and line."""
    counts = Counter()
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                counts[names.get(event.metadata_id, "")] += 1
    return counts


def step_markers(space, name="train") -> list:
    """`step_num` of every `tf.profiler.experimental.Trace(name, step_num=...)` event, sorted."""
    out = []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if names.get(event.metadata_id) == name:
                    for stat in event.stats:
                        if stat_names.get(stat.metadata_id) == "step_num":
                            out.append(stat.int64_value or stat.uint64_value)
    return sorted(out)
