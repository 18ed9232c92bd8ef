#!/usr/bin/env python3
"""Checks a `gpusleuth export --format pftrace` file against the `perfetto`
JSON export of the same trace (same window, same --pid).

The protobuf is parsed with Perfetto's own generated classes (the `perfetto`
package from PyPI: perfetto_trace_pb2), not with gpusleuth's code. Its
slices are rebuilt the way trace_processor builds them from TrackEvents:
per track, events in timestamp order (file order among equal times), a
SLICE_BEGIN opens a slice, a SLICE_END closes the innermost open one;
interned names are resolved from the sequence's InternedData. Then every
slice, counter value, instant and process/thread name must equal the
JSON's, argument by argument (the JSON's microseconds are the protobuf's
nanoseconds / 1000; `op` and `layer` are the slice's name and category).

Usage: pftrace_check.py TRACE.json TRACE.pftrace
Prints one summary line; exits 1 with the first differences on a mismatch,
2 when the `perfetto` package is missing.
"""
import collections
import json
import sys

try:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError as e:  # the caller decides whether that is a skip
    print(f"perfetto package missing: {e}")
    sys.exit(2)

TE = pb.TrackEvent


def ns(us):
    return round(us * 1000)


def annotation_value(a, names):
    """A DebugAnnotation's value as JSON-like data."""
    kind = a.WhichOneof("value")
    if a.dict_entries:
        return {(e.name or names[e.name_iid]): annotation_value(e, names) for e in a.dict_entries}
    if a.array_values:
        return [annotation_value(e, names) for e in a.array_values]
    if kind is None:
        raise AssertionError(f"an argument without a value: {a}")
    return getattr(a, kind)


def args_of(event, names):
    out = {}
    for a in event.debug_annotations:
        name = a.name or names[a.name_iid]
        assert name not in out, f"argument {name} twice"
        out[name] = annotation_value(a, names)
    return out


def load_proto(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    cats, evnames, argnames = {}, {}, {}
    tracks = {}
    events = []  # (ts, file order, track uuid, TrackEvent)
    seq = None
    for i, p in enumerate(trace.packet):
        if seq is None:
            seq = p.trusted_packet_sequence_id
            assert p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED, \
                "the first packet clears the incremental state"
        assert p.trusted_packet_sequence_id == seq, "one sequence"
        if p.HasField("interned_data"):
            d = p.interned_data
            cats.update({c.iid: c.name for c in d.event_categories})
            evnames.update({c.iid: c.name for c in d.event_names})
            argnames.update({c.iid: c.name for c in d.debug_annotation_names})
        if p.HasField("track_descriptor"):
            t = p.track_descriptor
            assert t.uuid not in tracks, f"track {t.uuid} declared twice"
            tracks[t.uuid] = t
        if p.HasField("track_event"):
            e = p.track_event
            assert e.track_uuid in tracks, f"event on track {e.track_uuid} before its descriptor"
            if e.type != TE.TYPE_SLICE_END and (e.name_iid or e.category_iids):
                assert p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            events.append((p.timestamp, i, e.track_uuid, e))
    return cats, evnames, argnames, tracks, events


def thread_of(tracks, uuid):
    """(pid, tid) of a thread track or of its child tracks."""
    t = tracks[uuid]
    while not t.HasField("thread"):
        assert t.HasField("parent_uuid"), f"track {t.uuid} belongs to no thread"
        t = tracks[t.parent_uuid]
    return (t.thread.pid, t.thread.tid)


def pid_of(tracks, uuid):
    t = tracks[uuid]
    while not t.HasField("process"):
        if not t.HasField("parent_uuid"):
            return None
        t = tracks[t.parent_uuid]
    return t.process.pid


def proto_slices(cats, evnames, argnames, tracks, events):
    open_ = collections.defaultdict(list)
    slices = []
    for ts, _, uuid, e in sorted(events, key=lambda x: (x[0], x[1])):
        if e.type == TE.TYPE_SLICE_BEGIN:
            name = e.name or evnames[e.name_iid]
            cat = ",".join(cats[c] for c in e.category_iids)
            open_[uuid].append([name, cat, ts, args_of(e, argnames), uuid])
        elif e.type == TE.TYPE_SLICE_END:
            assert open_[uuid], f"an end with no open slice on track {uuid} at {ts}"
            name, cat, start, args, _ = open_[uuid].pop()
            pid, tid = thread_of(tracks, uuid)
            slices.append((pid, tid, name, cat, start, ts - start, args))
    left = sum(len(v) for v in open_.values())
    assert left == 0, f"{left} slices never closed"
    return slices


def json_slice(ev):
    args = dict(ev["args"])
    name, cat = ev["name"], ev["cat"]
    if cat.startswith("cuda."):
        assert args.pop("op") == name
        assert "cuda." + args.pop("layer") == cat
        for k in ("on_cpu_us", "runnable_us", "blocked_us"):
            v = args.pop(k)
            if v is not None:
                args[k[:-3] + "_ns"] = ns(v)
        for k in ("ptr", "stream"):
            if k in args:
                args[k] = int(args[k], 16)
        for k in ("cpu", "ret"):
            if args.get(k, 0) is None:
                del args[k]
    else:
        if "culprits" in args:
            args["culprits"] = [dict(c, ns=ns(c.pop("us"))) for c in args["culprits"]]
            if not args["culprits"]:
                del args["culprits"]
    return (ev["pid"], ev["tid"], name, cat, ns(ev["ts"]), ns(ev["dur"]), args)


def unnull(v):
    """The protobuf's stand-ins for JSON's null and empty containers."""
    if v is None:
        return "null"
    if v == []:
        return "[]"
    if v == {}:
        return "{}"
    if isinstance(v, list):
        return [unnull(x) for x in v]
    if isinstance(v, dict):
        return {k: unnull(x) for k, x in v.items()}
    return v


def canon(x):
    return json.dumps(x, sort_keys=True)


def compare(label, want, got, problems):
    w = collections.Counter(canon(x) for x in want)
    g = collections.Counter(canon(x) for x in got)
    if w != g:
        missing = list((w - g).elements())[:3]
        extra = list((g - w).elements())[:3]
        problems.append(f"{label}: {len(want)} in the JSON, {len(got)} in the protobuf; "
                        f"only in the JSON: {missing}; only in the protobuf: {extra}")


def main():
    doc = json.load(open(sys.argv[1]))
    cats, evnames, argnames, tracks, events = load_proto(sys.argv[2])
    problems = []
    js = doc["traceEvents"]

    compare("slices", [json_slice(e) for e in js if e["ph"] == "X"],
            proto_slices(cats, evnames, argnames, tracks, events), problems)

    gpu_pid = [e["pid"] for e in js if e["ph"] == "M" and e["args"].get("name") == "GPUs (NVML)"]
    # Counters: (pid or GPU, name, ts, value).
    want = []
    for e in js:
        if e["ph"] == "C":
            (value,) = e["args"].values()
            who = "gpus" if e["pid"] in gpu_pid else e["pid"]
            want.append((who, e["name"], ns(e["ts"]), value))
    got = []
    for ts, _, uuid, e in events:
        if e.type == TE.TYPE_COUNTER:
            t = tracks[uuid]
            parent = tracks[t.parent_uuid]
            who = parent.process.pid if parent.HasField("process") else "gpus"
            value = e.double_counter_value if e.HasField("double_counter_value") else e.counter_value
            got.append((who, t.name, ts, value))
    compare("counter values", want, got, problems)

    # Instants: failed allocations (on their process) and findings.
    want = []
    for e in js:
        if e["ph"] == "i":
            args = unnull(e["args"])
            where = "findings" if e["cat"] == "finding" else e["pid"]
            want.append((where, e["cat"], e["name"], ns(e["ts"]), args))
    got = []
    for ts, _, uuid, e in events:
        if e.type == TE.TYPE_INSTANT and tracks[uuid].name != "gpusleuth":
            t = tracks[uuid]
            where = "findings" if t.name == "findings (gpusleuth)" else t.process.pid
            args = args_of(e, argnames)
            if "pids" in args and not isinstance(args["pids"], list):
                args["pids"] = [args["pids"]] if args["pids"] != "[]" else "[]"
            cat = ",".join(cats[c] for c in e.category_iids)
            got.append((where, cat, e.name, ts, args))
    compare("instants", want, got, problems)

    # The origin.
    origin = [args_of(e, argnames) for _, _, u, e in events
              if e.type == TE.TYPE_INSTANT and tracks[u].name == "gpusleuth"]
    other = doc["otherData"]
    if origin != [{"tool": "gpusleuth", "version": other["version"],
                   "origin_mono_ns": other["origin_mono_ns"],
                   "origin_unix_ns": other["origin_unix_ns"]}]:
        problems.append(f"origin: {origin} against {other}")

    # Names. Threads: exactly those the JSON draws slices on, named as it
    # names them (a window's JSON also names threads it draws nothing on;
    # the protobuf declares a thread where it first draws on it).
    # Processes: named as the JSON names them, every one the JSON draws on
    # or counts for among them.
    drawn = {(e["pid"], e["tid"]) for e in js if e["ph"] == "X"}
    json_threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in js
                    if e["ph"] == "M" and e["name"] == "thread_name"}
    want = {("thread", p, t, json_threads.get((p, t))) for p, t in drawn}
    got = {("thread", t.thread.pid, t.thread.tid, t.thread.thread_name)
           for t in tracks.values() if t.HasField("thread")}
    if want != got:
        problems.append(f"thread names: only in the JSON {sorted(want - got, key=str)[:5]}, "
                        f"only in the protobuf {sorted(got - want, key=str)[:5]}")
    json_procs = {e["pid"]: e["args"]["name"] for e in js
                  if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] not in gpu_pid}
    procs = {t.process.pid: t.process.process_name for t in tracks.values()
             if t.HasField("process")}
    needed = {p for p, _ in drawn} | {e["pid"] for e in js
                                      if e["ph"] in "Ci" and e["pid"] not in gpu_pid
                                      and e.get("cat") != "finding"}
    wrong = {p: (n, json_procs.get(p)) for p, n in procs.items() if json_procs.get(p) != n}
    missing = needed - procs.keys()
    if wrong or missing:
        problems.append(f"process names: differing {wrong}, not named {sorted(missing)}")

    n_slices = sum(1 for e in js if e["ph"] == "X")
    if problems:
        print("MISMATCH\n" + "\n".join(problems))
        sys.exit(1)
    print(f"ok: {n_slices} slices, {len(tracks)} tracks, {len(events)} events equal the JSON's")


if __name__ == "__main__":
    main()
