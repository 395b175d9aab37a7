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


def step_markers(space, name="train", with_names=False) -> list:
    """`step_num` of every `tf.profiler.experimental.Trace(name, step_num=...)` event, sorted.

    `name` "train" also matches tftrain's "train(N steps)" markers; `with_names` returns
    (step_num, name) pairs."""
    out = []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                event_name = names.get(event.metadata_id, "")
                if event_name == name or event_name.startswith(name + "("):
                    for stat in event.stats:
                        if stat_names.get(stat.metadata_id) == "step_num":
                            num = stat.int64_value or stat.uint64_value
                            out.append((num, event_name) if with_names else num)
    return sorted(out)


def stat_values(space, stat_name) -> list:
    """Every value of the statistic `stat_name` over all events of the trace."""
    out = []
    for plane in space.planes:
        ids = {k for k, v in plane.stat_metadata.items() if v.name == stat_name}
        for line in plane.lines:
            for event in line.events:
                out += [s.int64_value or s.uint64_value for s in event.stats if s.metadata_id in ids]
    return out
