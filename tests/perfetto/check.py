#!/usr/bin/env python3
"""Decodes a Perfetto trace with Perfetto's own published protos (the `perfetto` package from
PyPI: perfetto.protos.perfetto.trace.perfetto_trace_pb2) and prints what the tests check, as
JSON: slices per kind of track, whether timestamps are non-decreasing per packet sequence,
the clock snapshot, and the run-queue waits that name the task before them."""
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

trace = pb.Trace()
with open(sys.argv[1], "rb") as f:
    trace.ParseFromString(f.read())

names = {}
last = {}
out = {"packets": len(trace.packet), "out_of_order": 0, "slices": {}, "annotated_waits": 0,
       "waits": 0, "clock_snapshot": None, "default_clock": None, "counters": 0}
for p in trace.packet:
    if p.HasField("trace_packet_defaults") and out["default_clock"] is None:
        out["default_clock"] = p.trace_packet_defaults.timestamp_clock_id
    if p.HasField("clock_snapshot"):
        out["clock_snapshot"] = {
            "primary": p.clock_snapshot.primary_trace_clock,
            "clocks": sorted(c.clock_id for c in p.clock_snapshot.clocks),
        }
    if p.HasField("track_descriptor"):
        d = p.track_descriptor
        names[d.uuid] = d.name or (d.thread.thread_name if d.HasField("thread") else "")
        continue
    if not p.HasField("track_event"):
        continue
    seq = p.trusted_packet_sequence_id
    if p.timestamp < last.get(seq, 0):
        out["out_of_order"] += 1
    last[seq] = p.timestamp
    e = p.track_event
    if e.type == pb.TrackEvent.TYPE_COUNTER:
        out["counters"] += 1
    if e.type != pb.TrackEvent.TYPE_SLICE_BEGIN:
        continue
    track = names.get(e.track_uuid, "")
    kind = ("requests" if track.endswith(": requests") else
            "cpu" if track.startswith("CPU ") else
            "cuda" if track.endswith(": CUDA sync") else
            "gc" if track.endswith(": garbage collections") else "thread")
    out["slices"][kind] = out["slices"].get(kind, 0) + 1
    if kind == "gc":
        gens = [a.uint_value for a in e.debug_annotations if a.name == "generation"]
        out.setdefault("gc_generations", []).extend(gens)
    if e.name in ("waiting for a CPU", "runnable (waiting for a CPU)"):
        out["waits"] += 1
        if any(a.name == "ran_before" and a.string_value for a in e.debug_annotations):
            out["annotated_waits"] += 1
print(json.dumps(out))
