"""cluster.backend: which arrangement a command runs a job under, and what each refuses,
each refusal stated once and found as the job loads (before TensorFlow, before any task
starts)."""

import pytest
from helpers.commands import run_in_process

from launch.config import ConfigError, choose, from_dict, load_job
from launch.config.arrangements import CollectiveRules, PsWorkerRules


@pytest.mark.parametrize("backend, command, cluster, chosen", [
    ("auto", "train", (), "in_process"),
    # `towers train` has a cluster only under a launcher (Slurm, an Indexed Job): its task.
    ("auto", "train", ("ps", "worker"), "ps_worker"),
    ("auto", "train", ("worker",), "collective"),
    ("collective", "train", ("worker",), "collective"),
    ("auto", "worker", ("ps", "worker"), "ps_worker"),
    ("auto", "ps", ("ps", "worker"), "ps_worker"),
    ("auto", "worker", ("chief", "worker"), "collective"),
    ("auto", "local-cluster", ("worker",), "collective"),
    ("auto", None, (), "in_process"),
    ("auto", None, ("worker",), "collective"),
    ("horovod", "train", (), "horovod"),
    ("collective", None, (), "collective"),  # validate, the cluster yet to come
])
def test_auto_lets_the_command_choose_from_the_cluster(backend, command, cluster, chosen):
    assert choose(backend, command, cluster) == chosen


@pytest.mark.parametrize("backend, command, cluster, says", [
    ("ps_worker", "train", (), "ps_worker runs as `towers ps` and `towers worker` tasks"),
    ("horovod", "worker", ("ps", "worker"), "horovod runs as `towers train` ranks under "
                                            "horovodrun, not `towers worker`"),
    ("ps_worker", "worker", ("worker",), "ps_worker: a ps/worker job needs at least one ps"),
    ("collective", "train", (), "; this `towers train` is not a task of a Slurm step of "
                                "several tasks or of a Kubernetes Indexed Job"),
    ("horovod", "train", ("worker",), "horovod runs as `towers train` ranks under horovodrun, "
                                      "not as a task of a Slurm step"),
    ("collective", "local-cluster", ("ps", "worker"), "collective: a collective job has no ps"),
    ("mirrored", "train", (), "unknown value 'mirrored'; accepted: auto, collective, horovod,"),
])
def test_a_named_arrangement_must_be_the_commands_and_fit_its_cluster(backend, command, cluster,
                                                                      says):
    with pytest.raises(ConfigError) as raised:
        from_dict({"cluster": {"backend": backend}},
                  arrangement=lambda job: choose(job.cluster.backend, command, cluster))
    assert raised.value.key == "cluster.backend" and says in raised.value.message


REFUSALS = [
    ("ps_worker", "towers.variable_update=replicated", "ps/worker jobs keep variables on the "
                                                       "ps tasks; use parameter_server"),
    ("ps_worker", "towers.batch_norm=sync", "sync is not available in ps/worker jobs"),
    ("collective", "towers.variable_update=replicated", "inside each worker of a collective "
                                                        "job (no ps tasks)"),
    ("collective", "train.backup_workers=1", "has no backup workers"),
    ("collective", "towers.batch_norm=sync", "not available in a collective job (no ps tasks)"),
    ("horovod", "towers.gradient_dtype=bfloat16", "Horovod has no bfloat16 all-reduce"),
    ("horovod", "towers.devices=[/cpu:0]", "a count of devices per rank (or auto), not a list"),
]


@pytest.mark.parametrize("backend, setting, says", REFUSALS)
def test_what_an_arrangement_refuses_is_one_line_naming_the_key(backend, setting, says):
    load_job(None, [setting])  # one process takes it
    with pytest.raises(ConfigError) as raised:
        load_job(None, [setting, f"cluster.backend={backend}"])
    error = raised.value
    assert (error.source, error.key) == ("--set", setting.partition("=")[0])
    assert says in error.message and "\n" not in str(error)


def test_a_rule_two_arrangements_share_is_stated_once():
    """Workers in sessions of their own share no batch statistics: one text, naming the
    arrangement."""
    def message(backend, setting):
        with pytest.raises(ConfigError) as raised:
            load_job(None, [setting, f"cluster.backend={backend}"])
        return raised.value.message

    for setting, (a, b) in [("towers.batch_norm=sync", (PsWorkerRules, CollectiveRules))]:
        texts = [message(rules.name, setting).replace(rules.where, "IN") for rules in (a, b)]
        assert texts[0] == texts[1]


@pytest.mark.parametrize("ps, setting, refusal", [
    ("0", "train.backup_workers=1",
     "train.backup_workers: a collective job (no ps tasks) steps every worker together and "
     "has no backup workers; set it to 0, or add ps tasks"),
    ("1", "towers.batch_norm=sync",
     "towers.batch_norm: sync is not available in ps/worker jobs: the workers do not share "
     "batch statistics"),
])
def test_local_cluster_refuses_once_before_any_task_starts(tmp_path, ps, setting, refusal):
    """Once, by the launcher: a task started would print it again (and this tier's guard
    fails a test that starts a process)."""
    result = run_in_process("local-cluster", "--ps", ps, "--workers", "2", "--set", setting,
                            "--set", f"train.checkpoint_dir={tmp_path / 'c'}")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"towers: error: --set: {refusal}"), lines
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("cluster, setting", [
    (["--set", "cluster.worker=[10.0.0.1:2222, 10.0.0.2:2222]"], "towers.batch_norm=sync"),
    (["--set", "cluster.backend=ps_worker"], "towers.variable_update=replicated"),
])
def test_validate_checks_the_arrangement_the_job_file_names(cluster, setting):
    result = run_in_process("validate", *cluster, "--set", setting)
    assert result.returncode == 2
    assert f"{setting.partition('=')[0]}:" in result.stderr


def test_weight_averages_are_refused_in_a_synchronous_ps_worker_job_only():
    averages = ["train.moving_average_decay=0.99", "cluster.backend=ps_worker"]
    load_job(None, averages)  # asynchronous: each worker's step is one update
    with pytest.raises(ConfigError) as raised:
        load_job(None, [*averages, "train.sync=true"])
    assert raised.value.key == "train.moving_average_decay"
    assert "each worker's step would move them" in raised.value.message
