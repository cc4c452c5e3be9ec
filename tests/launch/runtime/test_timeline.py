"""train.timeline: a Chrome trace-event file of a window of steps, read back: it loads,
every step and phase is in it, each step's phase segments add up to the step's logged
time, every tower has its row; `towers timeline merge` joins several into one."""

import json
from collections import defaultdict

import pytest
from helpers.commands import run_in_process

from launch.config import from_dict
from launch.runtime.train import train

PHASES = {"input", "compute", "exchange", "apply"}


def trained_timeline(tmp_path, name="tl.json", steps=(3, 8)):
    raw = {"model": {"name": "mlp", "input_dim": 8, "hidden_units": [16], "num_classes": 2},
           "data": {"source": "synthetic", "num_examples": 256}, "towers": {"devices": 2},
           "train": {"batch_size": 32, "steps": 12,
                     "checkpoint_dir": str(tmp_path / f"ckpt-{name}"),
                     "timeline": str(tmp_path / name), "timeline_steps": list(steps)}}
    lines = []
    train(from_dict(raw), write=lines.append)
    return tmp_path / name, lines


def test_the_timeline_holds_each_step_its_phases_and_each_tower(tmp_path):
    path, lines = trained_timeline(tmp_path)
    assert f"timeline of steps 3-8 written to {path}" in lines
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    rows = {e["args"]["name"]: e["tid"] for e in events if e.get("name") == "thread_name"}
    steps = sorted((e for e in spans if e["cat"] == "step"), key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(3, 9)]
    phases = [e for e in spans if e["tid"] == rows["phases"]]
    seen = {e["cat"] for e in phases}
    assert seen <= PHASES and {"compute", "input"} <= seen
    by_step = defaultdict(float)
    for segment in phases:  # each phase segment lies in one step
        step = next(s for s in steps if s["ts"] <= segment["ts"] < s["ts"] + s["dur"])
        by_step[step["name"]] += segment["dur"]
    for step in steps:  # the phases add up to the step's logged time
        assert by_step[step["name"]] == pytest.approx(step["dur"], abs=2)
    towers = [name for name in rows if name.endswith(("CPU:0", "CPU:1"))]
    assert len(towers) == 2
    assert all(any(e["tid"] == rows[t] and e["name"].startswith(f"tower_{i}/") for e in spans)
               for i, t in enumerate(sorted(towers)))


def test_merge_joins_the_files_of_several_tasks(tmp_path):
    first, _ = trained_timeline(tmp_path, "a.json")
    second, _ = trained_timeline(tmp_path, "b.json", steps=(1, 2))
    out = tmp_path / "job.json"
    result = run_in_process("timeline", "merge", str(first), str(second), "--out", str(out))
    assert result.returncode == 0, result.stderr
    merged = json.loads(out.read_text())["traceEvents"]
    assert {e["pid"] for e in merged} == {1, 2}
    assert len([e for e in merged if e["ph"] == "X"]) == sum(
        len([e for e in json.loads(p.read_text())["traceEvents"] if e["ph"] == "X"])
        for p in (first, second))


def test_merging_something_else_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    result = run_in_process("timeline", "merge", str(bad), "--out", str(tmp_path / "o.json"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"towers: error: {bad} is not a timeline file")
    assert result.stderr.count("\n") == 1


def test_profile_steps_write_a_profiler_trace_tensorboard_reads(tmp_path):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    raw = {"model": {"name": "mlp", "input_dim": 8, "hidden_units": [16], "num_classes": 2},
           "data": {"source": "synthetic", "num_examples": 256}, "towers": {"devices": 2},
           "train": {"batch_size": 32, "steps": 8, "checkpoint_dir": str(tmp_path),
                     "profile_steps": [3, 5]}}
    lines = []
    train(from_dict(raw), write=lines.append)
    assert any(line.startswith(f"profile of steps 3-5 written under {tmp_path}")
               for line in lines)
    found = list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))
    assert len(found) == 1
    space = xplane_pb2.XSpace.FromString(found[0].read_bytes())
    events = [m.name for plane in space.planes for m in plane.event_metadata.values()]
    assert any("tower_0/" in name for name in events)  # the towers' ops were traced


def test_local_cluster_merges_the_workers_timelines_into_the_named_file(tmp_path):
    from launch.distributed.local_cluster import _merge_timelines, _Task

    first, _ = trained_timeline(tmp_path, "tl.worker0.json", steps=(1, 2))
    second, _ = trained_timeline(tmp_path, "tl.worker1.json", steps=(1, 2))
    tasks = [_Task(name, []) for name in ("ps0", "worker0", "worker1", "evaluator")]
    _merge_timelines(str(tmp_path / "tl.json"), tasks)
    merged = json.loads((tmp_path / "tl.json").read_text())["traceEvents"]
    assert {e["pid"] for e in merged} == {1, 2}
