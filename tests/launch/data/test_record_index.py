"""The record index kept beside each TFRecord file: written by `towers data convert`,
read by a training start instead of the records' headers, rebuilt when its file
changed, built in memory where it cannot be kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from helpers.commands import environment, last_json, towers_command
from helpers.data_files import write_mnist

from launch.config import load_job
from launch.data import index_file, resolve_files
from launch.data.converters import convert_files
from launch.data.converters.writer import ShardedWriter
from launch.data.index_file import FileState, StoredIndex, decode, encode, index_path
from launch.data.record_index import index_files, record_offsets

# Records of different lengths, so an offset that is wrong by a record shows.
RECORDS = [bytes([i]) * (5 + 7 * i) for i in range(10)]


def _converted(tmp_path, shards: int = 3) -> list[str]:
    """Shards written as `towers data convert` writes them, 10 records of their own
    lengths striped over them."""
    with ShardedWriter(tmp_path / "set", shards, len(RECORDS)) as writer:
        for record in RECORDS:
            writer.write(record)
    return writer.names


def _rewrite(name: str, records: list[bytes]) -> None:
    with tf.io.TFRecordWriter(name) as out:
        for record in records:
            out.write(record)


def _index(files, capfd, monkeypatch, where="set") -> tuple[list[np.ndarray], str]:
    """The offsets index_files gives, and its debug line."""
    monkeypatch.setenv("TOWERS_DEBUG", "1")
    capfd.readouterr()
    index = index_files(files, where)
    lines = [line for line in capfd.readouterr().err.splitlines() if "record index" in line]
    assert len(lines) == 1, lines  # said once per source
    return list(index.offsets), lines[0]


def _kept(name: str) -> os.stat_result:
    return os.stat(index_path(name))


def test_convert_writes_the_index_reading_the_headers_would_build(tmp_path):
    files = _converted(tmp_path)
    for shard, name in enumerate(files):
        stored = index_file.load(name)
        assert stored is not None, f"no fresh index beside {name}"
        assert stored.offsets.tolist() == record_offsets(name).tolist()
        assert len(stored.offsets) == len(RECORDS[shard::3])
        assert stored.state == index_file.file_state(name, stored.offsets)
        assert len(stored.state.last_frame) == index_file.FRAME_BYTES


def test_a_start_reads_the_kept_indexes_and_builds_none(tmp_path, capfd, monkeypatch):
    files = _converted(tmp_path)
    before = [_kept(name) for name in files]
    offsets, line = _index(files, capfd, monkeypatch)
    assert "3 file(s) read from beside them, 0 built" in line, line
    assert [o.tolist() for o in offsets] == [record_offsets(n).tolist() for n in files]
    assert [(s.st_ino, s.st_mtime_ns) for s in before] == \
        [(s.st_ino, s.st_mtime_ns) for s in map(_kept, files)]


def test_a_start_without_indexes_builds_and_keeps_them(tmp_path, capfd, monkeypatch):
    files = _converted(tmp_path)
    for name in files:
        os.remove(index_path(name))
    _, line = _index(files, capfd, monkeypatch)
    assert "0 file(s) read from beside them, 3 built from their headers" in line, line
    assert "not kept" not in line
    assert all(index_file.load(name) is not None for name in files)
    _, again = _index(files, capfd, monkeypatch)
    assert "3 file(s) read from beside them, 0 built" in again, again


def _append(name):
    _rewrite(name, [*RECORDS[0::3], b"one more"])


def _same_size_new_time(name):
    """Two records of one length swapped: the same size and the same last record, a
    newer modification time."""
    stat = os.stat(name)
    _rewrite(name, [RECORDS[3], RECORDS[0], *RECORDS[6::3]])
    os.utime(name, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def _same_size_and_time(name):
    """Rewritten within the clock's granularity: only the last record tells."""
    stat = os.stat(name)
    _rewrite(name, [*RECORDS[0:9:3], RECORDS[9][:-3] + b"new"])
    os.utime(name, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(name).st_size == stat.st_size


def _index_cut_short(name):
    data = open(index_path(name), "rb").read()
    open(index_path(name), "wb").write(data[:-5])


def _index_corrupt(name):
    data = bytearray(open(index_path(name), "rb").read())
    data[-12] ^= 0xFF  # an offset's byte: the CRC no longer matches
    open(index_path(name), "wb").write(bytes(data))


def _index_of_another_file(name):
    """Shards renamed as a pair, a file's index copied beside another file."""
    shutil.copy(index_path(name.replace("-00000-", "-00001-")), index_path(name))


@pytest.mark.parametrize("change", [_append, _same_size_new_time, _same_size_and_time,
                                    _index_cut_short, _index_corrupt, _index_of_another_file])
def test_a_stale_or_unreadable_index_is_rebuilt(tmp_path, capfd, monkeypatch, change):
    files = _converted(tmp_path)
    change(files[0])
    offsets, line = _index(files, capfd, monkeypatch)
    assert "2 file(s) read from beside them, 1 built from their headers" in line, line
    assert offsets[0].tolist() == record_offsets(files[0]).tolist()
    stored = index_file.load(files[0])
    assert stored is not None and stored.offsets.tolist() == offsets[0].tolist()


def test_a_remote_path_is_indexed_in_memory_and_said_once(capfd, monkeypatch):
    """ram:// stands for gs://: a start does not write beside files that are not local."""
    name = "ram://index-test/shard-00000-of-00001.tfrecord"
    _rewrite(name, RECORDS)
    try:
        offsets, line = _index([name], capfd, monkeypatch, where="ram://index-test/shard-*")
        assert "1 built from their headers; not kept beside the files (not a local " \
               "directory)" in line, line
        assert offsets[0].tolist() == record_offsets(name).tolist()
        assert not tf.io.gfile.exists(index_path(name))
    finally:
        tf.io.gfile.remove(name)


def test_nothing_is_said_without_towers_debug(tmp_path, capfd, monkeypatch):
    files = _converted(tmp_path)
    monkeypatch.delenv("TOWERS_DEBUG", raising=False)
    capfd.readouterr()
    index_files(files, "set")
    assert capfd.readouterr().err == ""


def test_globs_leave_the_indexes_out(tmp_path):
    files = _converted(tmp_path)
    (tmp_path / f".set-00000-of-00003.tfrecord{index_file.SUFFIX}.12-ab.partial").write_bytes(b"")
    assert resolve_files(str(tmp_path / "*"), "tfrecord") == files
    assert resolve_files(str(tmp_path / "*set-*"), "tfrecord") == files


def test_the_format_round_trips_and_refuses_what_is_not_one():
    state = FileState("a.tfrecord", 1000, 1_700_000_000_123_456_789, bytes(range(16)))
    stored = StoredIndex(state, np.array([0, 100, 417], np.int64))
    data = encode(stored)
    back = decode(data)
    assert back is not None and back.state == state and back.offsets.tolist() == [0, 100, 417]
    empty = StoredIndex(FileState("e.tfrecord", 0, 5, b""), np.zeros(0, np.int64))
    assert decode(encode(empty)).state == empty.state
    assert decode(b"") is None and decode(data[:-1]) is None and decode(data + b"x") is None
    assert decode(b"NOTINDEX" + data[8:]) is None
    for bad in ([5, 100], [0, 100, 100], [0, 1000]):  # not from 0, not increasing, past the end
        assert decode(encode(StoredIndex(state, np.array(bad, np.int64)))) is None
    for other in (FileState("b.tfrecord", *list(state.__dict__.values())[1:]),
                  FileState(state.name, 1001, state.mtime_ns, state.last_frame),
                  FileState(state.name, state.size, state.mtime_ns + 1, state.last_frame),
                  FileState(state.name, state.size, state.mtime_ns, bytes(16))):
        assert not stored.matches(other)
    assert stored.matches(FileState(**state.__dict__))


def test_mnist_convert_indexes_every_shard_and_training_reads_them(tmp_path, capfd,
                                                                    monkeypatch):
    """`towers data convert` and `towers train`'s loop, in this process: the start
    builds no index and rewrites none."""
    from launch.runtime.train import train

    rng = np.random.default_rng(0)
    paths = write_mnist(tmp_path, rng.integers(0, 256, (40, 28, 28), dtype=np.uint8),
                        rng.integers(0, 10, 40).astype(np.uint8))
    summary = convert_files("mnist", list(paths), str(tmp_path / "mnist"), 4)
    kept = [_kept(name) for name in summary.files]
    job = load_job(str(_job_file(tmp_path, summary.data)), [
        f"train.checkpoint_dir={tmp_path / 'ckpt'}"])
    monkeypatch.setenv("TOWERS_DEBUG", "1")
    capfd.readouterr()
    result = train(job, write=lambda line: None)
    assert result["global_step"] == 3
    err = capfd.readouterr().err
    assert "record index: 4 file(s) read from beside them, 0 built" in err, err
    assert [(s.st_ino, s.st_mtime_ns) for s in kept] == \
        [(s.st_ino, s.st_mtime_ns) for s in map(_kept, summary.files)]


def _job_file(tmp_path, data: dict):
    """A small convnet job on 28x28x1 images read as ``data`` says."""
    job = {"model": {"name": "convnet", "image_size": 28, "channels": 1, "num_classes": 10,
                     "filters": [4], "dense_units": 8},
           "data": {**data, "shuffle_buffer": 16, "num_parallel_calls": 1, "prefetch": 1},
           "towers": {"devices": 1},
           "train": {"batch_size": 8, "steps": 3, "checkpoint_dir": str(tmp_path / "ckpt")}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))  # JSON is YAML
    return path


def _can_bind_mount(directory) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "mount", "--bind", "-o", "ro", str(directory),
                            str(directory)], capture_output=True, stdin=subprocess.DEVNULL)
    return probe.returncode == 0


@pytest.mark.e2e
def test_a_read_only_dataset_directory_still_trains(tmp_path):
    """`towers train` on shards without indexes in a directory it may not write to (a
    read-only bind mount, for root ignores permissions): built in memory, said once at
    debug level, nothing written."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(1)
    paths = write_mnist(tmp_path, rng.integers(0, 256, (40, 28, 28), dtype=np.uint8),
                        rng.integers(0, 10, 40).astype(np.uint8))
    summary = convert_files("mnist", list(paths), str(data / "mnist"), 4)
    for name in summary.files:
        os.remove(index_path(name))
    command = towers_command("train", "-c", str(_job_file(tmp_path, summary.data)))
    if os.geteuid() == 0:
        if not _can_bind_mount(data):
            pytest.skip("as root a read-only directory needs a bind mount in a mount "
                        "namespace (unshare -m), which this machine does not allow")
        command = ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
                   str(data), *command]
    else:
        data.chmod(0o555)
    try:
        result = subprocess.run(command, env={**environment(), "TOWERS_DEBUG": "1"},
                                capture_output=True, text=True, timeout=240,
                                stdin=subprocess.DEVNULL)
    finally:
        data.chmod(0o755)
    assert result.returncode == 0, result.stderr[-3000:]
    assert last_json(result.stdout)["global_step"] == 3
    lines = [line for line in result.stderr.splitlines() if "record index" in line]
    assert len(lines) == 1 and "0 file(s) read from beside them, 4 built from their " \
        "headers; not kept beside the files (" in lines[0], result.stderr[-3000:]
    assert sorted(os.listdir(data)) == sorted(os.path.basename(n) for n in summary.files)
