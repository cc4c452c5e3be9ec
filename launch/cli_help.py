"""The examples and notes each `towers COMMAND --help` shows, kept apart from the parser."""

EPILOG_TRAIN = """examples:
  towers train                                  # built-in default job: convnet, all devices
  towers train -c examples/resnet20.yaml
  towers train -c job.yaml --set train.steps=500 --set towers.devices=4
  towers train --set towers.variable_update=replicated --set train.checkpoint_dir=runs/rep
  towers train --set towers.precision=mixed_bfloat16 --set train.accumulate_steps=4
  horovodrun -np 4 -H localhost:4 towers train -c job.yaml --backend horovod
  towers train -c job.yaml --set model.name=my_models.net:build --set model.width=64
  srun towers train -c job.yaml                 # every task of a Slurm step: one cluster

model.name is a built-in model, a name an installed package registers, or
module:attribute of your own code (found on sys.path, in model.path or beside
the job file; see docs/model.md, "Train your own model").

Progress goes to stderr; the last line on stdout is one JSON object with
global_step, loss, the model's metrics, job_examples_per_sec and
process_examples_per_sec (the run's averages: every worker's or rank's examples, and
this process's own; docs/figures.md), precision and accumulate_steps (and, in
mixed_float16, loss_scale and overflow_steps). Re-running with
the same checkpoint_dir resumes from its latest checkpoint; one trainer at a time
(another finds it in use and exits 2). SIGTERM or Ctrl-C saves a checkpoint and exits 0.

In every task of a Slurm step of several tasks (srun), or every pod of a Kubernetes
Indexed Job set up as docker/k8s/indexed-job.yaml, train is the worker (or, with
cluster.ps_per_node, the ps task) its launcher makes it, with its share of the node's
GPUs: no addresses to write (docs/slurm.md, docs/kubernetes.md).
cluster.backend: in_process keeps each task one process of its own.
"""

EPILOG_EVAL = """examples:
  towers eval -c job.yaml                         # latest checkpoint in train.checkpoint_dir
  towers eval -c job.yaml --checkpoint runs/convnet/model.ckpt-2000
  towers eval -c job.yaml --watch                 # each new checkpoint, until train.steps
  towers eval -c job.yaml --predictions preds.npy # also the predictions, in data order
  towers eval -c job.yaml --set eval.steps=10     # at most 10 batches of eval.batch_size
  towers eval -c job.yaml --averages              # the weight averages (moving_average_decay)

An evaluation scores every example of data.eval_path (else data.path) once, in
batches of eval.batch_size, the last one partial; loss and metrics are means over
the examples. eval.steps (null by default) stops it after that many batches.
--predictions writes one row per example scored, in the order of the files.
Generated data (synthetic, builtin) is scored on eval.steps batches instead, 20
when it is null (builtin never past its held-out examples); the log and the
result say so.

Summaries go to <checkpoint_dir>/eval for TensorBoard; the last line on stdout
is one JSON object with global_step, loss, the metrics, "examples" (how many were
scored) and examples_per_sec. Stopped by SIGTERM or Ctrl-C, --watch (and the
evaluator of a ps/worker job) first scores the newest checkpoint it has not
scored, once a trainer still writing checkpoint_dir has saved its final one (it
waits for that at most 20 s); a second signal stops it at once.
"""

EPILOG_VALIDATE = """The first lines (YAML comments) say what model.name resolved to: a built-in,
an installed model or the file of your own code, every parameter it is called
with (defaults included), and the input it takes.

examples:
  towers validate -c job.yaml
  towers validate -c job.yaml --set optimizer.name=adam
  towers validate -c job.yaml --set model.name=my_models.net:build --set model.width=64
"""

EPILOG_EXPORT = """Builds the model once more, with one tower and no training ops, restores
the checkpoint (default: the latest in train.checkpoint_dir) and writes a
SavedModel whose serving_default signature maps `features` to `predictions`
(class probabilities for classifiers). For a builder returning a Keras model it
also writes DIR/model.weights.h5, which model.load_weights() reads. The last
line on stdout is one JSON object describing what was written.

examples:
  towers export -c job.yaml --out runs/served/1
  towers export -c job.yaml --out /tmp/model --checkpoint runs/convnet/model.ckpt-2000
  towers export -c job.yaml --out runs/served/2 --averages   # serve the weight averages
  python -c "import tensorflow as tf; m = tf.saved_model.load('runs/served/1'); \
print(m.signatures['serving_default'])"
"""

EPILOG_DEVICES = """Shows each GPU TensorFlow sees as /gpu:i, the physical GPU it maps to under
CUDA_VISIBLE_DEVICES (and session.visible_devices, with -c), its name and memory.

examples:
  towers devices
  CUDA_VISIBLE_DEVICES=2,3 towers devices     # physical 2 becomes /gpu:0
"""

EPILOG_CONVERT = """Writes sharded TFRecord files PREFIX-00000-of-0000N.tfrecord from:
  --from job      the job's npz or csv data (data.path, data.label_column)
  --from images   ROOT/CLASS/IMAGE.jpg|png, one folder a class (ImageNet layout);
                  the class names go to PREFIX.labels
  --from mnist    an idx images file and an idx labels file (gzipped or not)
  --from cifar10  CIFAR-10 binary batch files
  --from text     a text corpus: word windows for lstm_lm; the vocabulary (<unk>,
                  <eos>, then words by frequency) goes to PREFIX.vocab
A progress bar shows on a terminal; stderr then says what was written and the
data section that reads it, stdout ends with the same as one JSON object.
Bad input (an image that does not decode, a wrong idx header) is exit 2.

examples:
  towers data convert -c job.yaml --out data/train --shards 8
  towers data convert --from images photos/train --out data/train --shards 16
  towers data convert --from images photos/val --labels data/train.labels --out data/val
  towers data convert --from mnist train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz \\
      --out data/mnist-train
  towers data convert --from cifar10 cifar-10-batches-bin/data_batch_*.bin --out data/cifar
  towers data convert --from text ptb.train.txt --min-count 2 --out data/ptb-train
  towers data convert --from text ptb.valid.txt --vocab data/ptb-train.vocab --out data/ptb-valid
  then train with the data section printed, e.g.
  --set data.source=tfrecord --set 'data.path=data/train-*.tfrecord' --set data.schema=imagenet
"""


EPILOG_ROLES = """The same job file as `towers train`; the cluster comes from the job file's
cluster section, the flags below, TF_CONFIG (as Kubeflow's TFJob sets it), or the
Slurm step or Indexed Job the task runs in (where `towers train` in every task is
simpler: it is the ps or worker task it is made).
Worker 0 is chief unless the cluster has a chief task. TensorFlow's gRPC runtime
has no authentication or encryption and runs any graph it is sent, on every
interface: firewall cluster ports to the cluster's own hosts.

On SIGTERM a worker stops after its step (the chief saves a checkpoint), a ps
keeps serving until its workers have finished (at most 15 s) and the evaluator
scores the chief's final checkpoint (waiting at most 20 s for it); each exits 0. A
peer that stays unreachable past cluster.reconnect_timeout_secs, or a step stuck
past cluster.operation_timeout_secs, ends the task with 138 (retryable: restart
it; training resumes from the last checkpoint). A worker whose step diverges
stops every worker with 3.

Without ps tasks (no --ps-hosts, no ps in the cluster) the workers each keep the
variables and all-reduce their gradients with TensorFlow's collective ops,
synchronously: a stop signal on any worker stops all after the same step, and a
lost worker ends the others with 138 (restart every worker).

examples:
  towers ps     -c job.yaml --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222 --task-index 0
  towers worker -c job.yaml --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222 --task-index 1
  TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 0}}' towers worker -c job.yaml
  towers worker -c job.yaml --worker-hosts h1:2222,h2:2222 --task-index 0   # no ps: collective
"""

EPILOG_LOCAL_CLUSTER = """Starts one process per task on 127.0.0.1 with free ports, prefixes each
task's lines with its name, forwards Ctrl-C/SIGTERM to the workers and then to
the ps tasks, and exits with the status of the first task that failed, if any.
The last line on stdout is the chief's JSON result.
Each task serves Prometheus metrics on a port of its own; the ports are printed
and listed in a file_sd targets file for Prometheus.

examples:
  towers local-cluster --ps 1 --workers 2
  towers local-cluster -c job.yaml --ps 2 --workers 2 --evaluator --set train.sync=true
  towers local-cluster --ps 0 --workers 2   # no ps: gradients all-reduced by collective ops
"""

EPILOG_BENCH = """Examples/sec of the job's model (or --model) at one global batch on 1 device
and on N devices in each mode, on synthetic data: in-process towers
(parameter_server, replicated), TensorFlow's MirroredStrategy (mirrored), 1 ps +
N workers on 127.0.0.1 (ps_worker) and Horovod ranks (horovod; skipped, with the
reason, when Horovod is not installed). Warm-up steps are discarded and timed
blocks interleaved across rows; each row reports the median with min and max,
ratios to 1 device and to mirrored, peak RSS and gradient bytes moved per step.
The table goes to stdout; --out also writes bench.csv, bench.json and bench.png.
A row whose runs fail is reported with the reason and the command exits 1.

examples:
  towers bench --quick                                  # a check that every mode runs
  towers bench --model resnet20 --batch 64 --towers 1,2,4 --out runs/bench
  towers bench -c job.yaml --modes parameter_server,mirrored --repeats 9
  towers bench --model resnet20 --batch 128 --precision float32,mixed_bfloat16 --xla off,on
  towers bench --memory 5000 --model mlp --out runs/bench   # RSS: 8 towers vs 1; long run
  towers bench --memory 50 --model resnet20 --batch 128 --accumulate 4   # micro-batches vs 1
  towers bench --input --model resnet20 --batch 128   # synthetic vs TFRecord vs JPEG input
  towers bench --model resnet20 --towers 2 --modes collective --pack-bytes 0,4194304

--precision, --accumulate, --xla, --gradient-dtype, --batch-norm and --pack-bytes each
take a list; every row is measured in every combination, the rows of one mode and device
count side by side, with its ratio to the first combination (the base variant). Each row
also reports the FLOPs per example of a training step (counted by TensorFlow's profiler
from the built graph), the FLOP/s it reaches and that as a share of this machine's peak
for its number type: a 2048x2048 matmul in float32, bfloat16 or float16, timed in the
same run. The header says whether this CPU does bfloat16 or float16 in hardware
(avx512_bf16, amx_bf16, avx512_fp16, amx_fp16) or TensorFlow emulates them. A 16-bit
row also shows its kernel ceiling: the model's own convolutions and matrix products
(forward and gradients, at their shapes) timed alone in float32 and in its type
between the rounds, their combined speed-up; "of ceiling" is the row's own gain over
the float32 row beside it as a share of that. A row that does not answer within
--timeout (its build, a block, a whole run) is reported as failed; the rest go on.

--input trains the model fed by synthetic data, pre-decoded TFRecords (float lists
and uint8 pixels) and JPEG TFRecords (written to a temporary directory), through
the training job's own input pipeline, and runs each file input alone on one
thread: examples/sec, CPU ms per example and the host threads JPEG decoding needs.
"""

EPILOG_TUNE = """Times the job's own training step (its model, input and devices, as `towers
train` builds it) through the settings that change its speed, one stage at a time:
how the towers share variables (towers.variable_update, towers.param_device), XLA,
towers.precision and towers.gradient_dtype (only with --allow-precision: they change
results beyond rounding; a 16-bit type only where this machine runs the model's
kernels faster in it), and fewer micro-batches (train.accumulate_steps) where the
step fits; a job whose step does not fit in memory gets more. Each stage's candidates
run side by side with the settings chosen before it (interleaved blocks, medians); a
candidate is kept only when at least 3% faster. Writes a copy of the job with the
chosen settings, headed by the measured table and the reason for each setting as
comments, and prints the table.

examples:
  towers tune -c job.yaml                            # writes job.tuned.yaml beside it
  towers tune -c job.yaml --budget 1200 --allow-precision --out fast.yaml
  towers train -c job.tuned.yaml
"""

EPILOG_VERIFY = """Trains the job's model for --steps steps on its first batches three times, in
float64, from the same initial values: on one device (the whole batch at once), on
one device again with each batch's examples reordered (the noise floor: what
rounding alone does), and on the job's towers (towers.devices, variable_update,
batch_norm, train.accumulate_steps) in this process. Dropout and other noise layers
run at rate 0. Prints each variable's largest difference between the towers and one
device beside its noise floor and tolerance, then one line: pass (exit 0) or fail
(exit 6), naming the worst variable. Nothing is written.

examples:
  towers verify -c job.yaml                     # the job's towers, 5 steps
  towers verify -c job.yaml --steps 20
  towers verify -c job.yaml --set towers.devices=4 --set towers.batch_norm=sync
  towers verify -c job.yaml --set train.batch_size=16   # smaller, faster
  towers verify -c job.yaml --rtol 1e-8 --floor-factor 100

A variable passes within max(rtol x its largest |value|, floor-factor x its noise
floor). In float32 a correct job differs from one device by rounding alone, which
deep models grow to 1e-4 and more in a few steps: float64 takes that out of the way
(docs/model.md, "Check your port"). A job of several processes is checked as one
process's towers.
"""
