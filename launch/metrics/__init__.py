"""Prometheus metrics: one exporter per process, and the hooks that feed it.

Every process serves its own registry on `metrics.port`/`metrics.addr`:
``/metrics`` in the Prometheus text format and ``/healthz`` (200 while healthy,
503 once a role reports a problem). Every series carries the process's ``job``,
``task`` and ``run`` labels (and ``rank`` on a Horovod rank), so a Prometheus
server scraping trainers, evaluators and ps/worker tasks with
``honor_labels: true`` can tell them apart.

The training loop never waits on the exporter: `MetricsHook` records values
from tensors the step fetches anyway (one session run per step, as before),
and everything else (process CPU and memory, GPU memory) is read when
Prometheus scrapes.

Nothing is found through a global: the caller of `serve` hands the exporter on.
`towers train` and `towers eval` serve as job "train" / "eval", task 0; a ps/worker
role serves as itself by wrapping its work:

    with serve(job.metrics, Identity("worker", task_index, job.run.name), log) as exporter:
        train(job, plan=plan, exporter=exporter)  # training series labelled job="worker"
        if exporter is not None:                  # role-specific series, e.g. on a ps task:
            exporter.gauge("towers_ps_variable_bytes", "...").set(hosted)

The series:

    every process   towers_up, process_* (CPU, memory, file descriptors)
    training        towers_global_step, towers_examples_total,
                    towers_process_examples_per_second, towers_job_examples_per_second
                    (the chief's, rank 0's, or a job's one process; throughput.py),
                    towers_step_seconds (histogram), towers_loss, towers_<model metric>,
                    towers_learning_rate, towers_gradient_norm, towers_nonfinite_loss_total,
                    towers_towers, towers_checkpoint_last_save_timestamp_seconds,
                    towers_checkpoint_save_seconds (histogram)
    evaluation      towers_eval_global_step, towers_eval_loss, towers_eval_<model metric>,
                    towers_eval_examples_per_second, towers_eval_last_timestamp_seconds,
                    towers_towers
    GPU hosts       towers_gpu_memory_bytes, towers_gpu_memory_peak_bytes,
                    towers_gpu_utilization_ratio (each per ``device``)
    ps tasks        towers_ps_variable_bytes (launch.distributed.arrangements.ps_worker.ps)

The modules:

    server      the HTTP(S) server: address, port and certificate checks, MetricsError
    exporter    Identity, the Exporter (registry, /metrics, /healthz, final scrape),
                start() and serve()
    gpu         GPU memory (TensorFlow's allocator) and utilisation (NVML), at scrape time
    training    TrainMetrics and the hooks feeding it: training_hooks()
    throughput  examples per second, the job's and this process's: the one definition
    evaluation  EvalMetrics: record_eval()
"""

from launch.metrics.evaluation import record_eval
from launch.metrics.exporter import FINAL_SCRAPE_WAIT_SECS, Exporter, Identity, serve, start
from launch.metrics.gpu import GPU_METRICS, GpuCollector, gpu_collector
from launch.metrics.server import MetricsError
from launch.metrics.training import TrainingHooks, TrainMetrics, data_gauges, training_hooks

__all__ = [
    "FINAL_SCRAPE_WAIT_SECS",
    "GPU_METRICS",
    "Exporter",
    "GpuCollector",
    "Identity",
    "MetricsError",
    "TrainMetrics",
    "TrainingHooks",
    "gpu_collector",
    "record_eval",
    "serve",
    "start",
    "data_gauges",
    "training_hooks",
]
