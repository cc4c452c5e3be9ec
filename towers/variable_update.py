"""Update modes: how the towers' gradients become one update.

Two choices make a mode, held apart here:

  how the towers inside one process share variables and gradients
    ParameterServer  one copy of each variable on a parameter device; tower gradients
                     summed where each variable lives (or on one aggregation device)
    Replicated       a copy of each trainable variable per tower, gradients
                     all-reduced, every copy updated by the same step
  whether other processes take part in the same update
    CrossProcess     a ParameterServer inside one process of a multi-process job (a
                     Horovod rank), composed with `reduce`, the reduction across
                     processes its summed gradients, loss and metrics pass through

(A ps/worker job's worker is a ParameterServer whose parameter device is the ps
tasks: the processes share variables, not a reduction.) resolve_variable_update
makes a mode from the two choices; the job file's one key, `towers.variable_update`,
names both for users.

Each in-process mode holds the towers.sharing policy that says what each tower's
variables are and where they live, and answers where the loss, metrics and global
step are kept. Every gradient handed to `combine_gradients` is already scaled by its
tower's share of the global batch, so the combined gradient is a plain sum. It comes
in the type gradients travel in (float32, or 16 bits: towers.Precision.gradient_dtype);
a mode keeps that type on every hop between devices or processes, and sums in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from towers import gradients as grad_lib
from towers import packing
from towers import precision as precision_lib
from towers.builder import Tower
from towers.placement import DeviceFn, LeastLoaded, host_cpu, least_loaded
from towers.replica_copies import ReplicaCopies
from towers.sharing import SharedVariables, VariableSharing

# Maps a list of gradients (tensors, IndexedSlices or None) to a list of the same length.
GradientsFn = Callable[[list], list]
# Maps this process's summed gradients, in the type they travel in, to the job's.
AcrossProcesses = Callable[[list, tf.DType], list]
Pairs = list[tuple]  # (gradient, variable) pairs, as Optimizer.apply_gradients takes them


class VariableUpdate:
    """The interface of a mode. `variables` says what each tower's variables are and
    where they live (towers.sharing); the mode says how the towers' gradients become
    one update."""

    name = ""
    variables: VariableSharing

    def variable_device(self, tower_device: str) -> str | DeviceFn:
        """Where the variables a tower reads are placed."""
        return self.variables.device(tower_device)

    def home(self, devices: Sequence[str]) -> str:
        """Where the loss, the metrics and the loss scale are combined and kept."""
        raise NotImplementedError

    def step_device(self, devices: Sequence[str]) -> str | DeviceFn:
        """Where the global step lives: unless the mode keeps it beside its variables,
        on the first tower's host CPU (an int64 counter every step reads needs no GPU)."""
        return host_cpu(devices[0])

    def combine_gradients(
        self, towers: list[Tower], tower_grads: list[list], clip_norm: float | None
    ) -> tuple[Pairs, tf.Tensor]:
        """The (gradient, variable) pairs of one update and the combined gradient's global
        norm before clipping (a scalar)."""
        raise NotImplementedError

    def combine_outputs(
        self, loss: tf.Tensor, metrics: dict[str, tf.Tensor], home: str
    ) -> tuple[tf.Tensor, dict[str, tf.Tensor], list[tf.Tensor]]:
        """The loss and metrics to report, and tensors every step must also run."""
        return loss, metrics, []

    def apply(self, optimizer: tf.compat.v1.train.Optimizer, pairs: Pairs,
              global_step: tf.Variable, towers: list[Tower]) -> tf.Operation:
        """One apply_gradients call for the whole step."""
        apply_op = optimizer.apply_gradients(pairs, global_step)
        self.variables.adopt_slots(optimizer, [t.trainable for t in towers])
        return apply_op

    def sync_op(self, towers: list[Tower], optimizer: tf.compat.v1.train.Optimizer
                ) -> tf.Operation:
        """Makes every tower's copies equal tower 0's; a no-op with one copy."""
        return self.variables.sync_op([t.trainable for t in towers], optimizer)

    def init_op(self, towers: list[Tower], optimizer: tf.compat.v1.train.Optimizer
                ) -> tf.Operation:
        """Initialises every global and local variable built so far, and starts every
        tower's copies equal to tower 0's."""
        v1 = tf.compat.v1
        return self.variables.init_op(
            [t.trainable for t in towers], optimizer,
            [v1.global_variables_initializer(), v1.local_variables_initializer()])


class ParameterServer(VariableUpdate):
    """One copy of each variable on `param_device`; every tower reads it.

    param_device: a device string, or a device function of the variable op:
        `towers.least_loaded(devices)` spreads variables over the tower devices by
        byte size; a ps/worker job's worker passes its replica_device_setter.
    aggregation_device: where tower gradients are summed; None sums each on its
        variable's device. A ps/worker job's worker passes its own CPU so it sends
        one gradient per variable to the ps tasks.
    pack_bytes: with an aggregation device, the summed gradients travel to the
        variables' devices packed, one buffer (of at most this many bytes) per device
        instead of one tensor per variable (towers.packing.packed_send); 0: unpacked.
    """

    name = "parameter_server"

    def __init__(self, param_device: str | DeviceFn = "/cpu:0",
                 aggregation_device: str | None = None, pack_bytes: int = 0):
        if param_device == "least_loaded":
            raise ValueError("pass towers.least_loaded(devices) as the parameter device")
        self.param_device = param_device
        self.aggregation_device = aggregation_device
        self.pack_bytes = pack_bytes
        self.variables = SharedVariables(param_device)

    def home(self, devices: Sequence[str]) -> str:
        return devices[0] if callable(self.param_device) else self.param_device

    def step_device(self, devices: Sequence[str]) -> str | DeviceFn:
        """Beside the variables (on the ps tasks, for a replica_device_setter); spread
        over the towers they have no one place, and it stays on the host CPU, out of
        the balance."""
        if isinstance(self.param_device, LeastLoaded):
            return super().step_device(devices)
        return self.param_device

    def combine_gradients(self, towers, tower_grads, clip_norm,
                          across: AcrossProcesses | None = None):
        """across: combines this process's summed gradients with the other processes'
        before they are clipped (CrossProcess); None: this process's are the update's."""
        variables = towers[0].trainable
        wire = _wire_dtype(tower_grads)
        summed = grad_lib.aggregate(tower_grads, variables, self.aggregation_device)
        with tf.device(self.aggregation_device or self.home([t.device for t in towers])):
            if across is not None:
                summed = across(summed, wire)
            summed, norm = grad_lib.clip_by_global_norm(summed, clip_norm)
            if self.aggregation_device:  # the sums still have a hop to the variables
                summed = grad_lib.send_to_variables(summed, variables, wire,
                                                    self.aggregation_device, self.pack_bytes)
        return present_pairs(summed, variables), norm


class Replicated(VariableUpdate):
    """A copy of each trainable variable per tower, on the tower's device
    (towers.replica_copies.ReplicaCopies); gradients all-reduced, every copy updated by the
    same step. One apply_gradients call updates every copy, so optimizers with
    per-step state (Adam's beta powers) advance it once.

    all_reduce: "auto" (NCCL between GPUs when TensorFlow has CUDA, else a sum on one
    device and copies), "nccl" or "copy" (towers.gradients.all_reduce).
    """

    name = "replicated"

    def __init__(self, all_reduce: str = "auto"):
        if all_reduce not in grad_lib.ALL_REDUCE:
            raise ValueError(f"all_reduce must be one of {', '.join(grad_lib.ALL_REDUCE)}; "
                             f"got {all_reduce!r}")
        self.all_reduce = all_reduce
        self.variables = ReplicaCopies()

    def home(self, devices: Sequence[str]) -> str:
        return devices[0]

    def combine_gradients(self, towers, tower_grads, clip_norm):
        """Pairs over every tower's copies, and tower 0's global norm."""
        dtypes = [v.dtype.base_dtype for v in towers[0].trainable]
        reduced = grad_lib.all_reduce(tower_grads, [t.device for t in towers], dtypes,
                                      self.all_reduce)
        pairs, norms = [], []
        for index, (tower, grads) in enumerate(zip(towers, reduced, strict=True)):
            if index > 0 and clip_norm is None:  # tower 0's norm is the one reported
                pairs.extend(present_pairs(grads, tower.trainable))
                continue
            # Each tower clips its own copy on its own device; the inputs are
            # identical, so the results are too, with no cross-device wait.
            with tf.device(tower.device):
                clipped, norm = grad_lib.clip_by_global_norm(grads, clip_norm)
            pairs.extend(present_pairs(clipped, tower.trainable))
            norms.append(norm)
        return pairs, norms[0]


class CrossProcess(VariableUpdate):
    """The towers of one process of a multi-process job (a Horovod rank): an in-process
    mode, `within`, composed with `reduce`, the reduction across processes.

    reduce: combines this process's values with the other processes' (all-reduce);
    it takes and returns lists of tensors, IndexedSlices or None. It is applied to
    the summed gradients before clipping, so the norm clipped is the whole job's,
    and to the loss and metrics, so every process makes the same finite-or-not
    decision and reports the same values.
    within: the mode of the process's own towers; by default
        ParameterServer(param_device, aggregation_device).
    sum_across_processes: a float32 tensor summed over the processes (an all-reduce
        sum, unweighted), for synchronized batch norm's statistics; None: batch norm
        synchronizes within each process only.
    """

    name = "cross_process"

    def __init__(self, reduce: GradientsFn, param_device: str | DeviceFn = "/cpu:0",
                 aggregation_device: str | None = None, *,
                 within: ParameterServer | None = None,
                 sum_across_processes: Callable[[tf.Tensor], tf.Tensor] | None = None):
        self.within = within or ParameterServer(param_device, aggregation_device)
        self.reduce = reduce
        self.sum_across_processes = sum_across_processes
        self.variables = self.within.variables

    def home(self, devices: Sequence[str]) -> str:
        return self.within.home(devices)

    def step_device(self, devices: Sequence[str]) -> str | DeviceFn:
        return self.within.step_device(devices)

    def combine_gradients(self, towers, tower_grads, clip_norm):
        return self.within.combine_gradients(towers, tower_grads, clip_norm,
                                             across=self._reduce_gradients)

    def _reduce_gradients(self, summed: list, wire: tf.DType) -> list:
        """Sent in the wire type (a 16-bit all-reduce sums in 16 bits: Horovod's own
        fp16 compression), float32 again after."""
        sent = self.reduce([precision_lib.cast_gradient(g, wire) for g in summed])
        return [precision_lib.cast_gradient(r, g.dtype) if g is not None else r
                for r, g in zip(sent, summed, strict=True)]

    def combine_outputs(self, loss, metrics, home):
        # The caller runs these in every step, so that every process joins the same
        # collectives in the same order.
        with (
            tf.device(self.within.aggregation_device or home),
            tf.name_scope("job_wide_outputs"),
        ):
            job_wide = self.reduce([loss, *metrics.values()])
        return job_wide[0], dict(zip(metrics, job_wide[1:], strict=True)), job_wide


MODES = {mode.name: mode for mode in (ParameterServer, Replicated)}
VARIABLE_UPDATES = tuple(MODES)


def resolve_variable_update(
    variable_update: str | VariableUpdate,
    param_device: str | DeviceFn,
    devices: Sequence[str],
    *,
    aggregation_device: str | None = None,
    reduce: GradientsFn | None = None,
    sum_across_processes: Callable[[tf.Tensor], tf.Tensor] | None = None,
    pack_bytes: int = 0,
) -> VariableUpdate:
    """The one place a mode is made from its two choices: a mode name (how the towers
    of a process share: one of VARIABLE_UPDATES) and, for a process of a
    multi-process job, `reduce` (CrossProcess). A mode object is returned as given.

    param_device: with "parameter_server", a device, a device function, or
        "least_loaded": spread over `devices` by byte size.
    aggregation_device: with "parameter_server", where the towers' gradients are
        summed (None: on each variable's device).
    sum_across_processes: with `reduce`, the plain sum across processes synchronized
        batch norm uses (CrossProcess).
    pack_bytes: where packed gradients (towers.packing) travel, the one place it is
        decided: the reduction across processes only (0: nothing is packed). Measured
        (BENCHMARKS.md), packing sped that up (resnet20, 2 workers: 1.08x to 1.56x) and
        nothing else: not the towers of one process (0.99x to 1.05x), nor a ps/worker
        worker's push to its ps tasks (resnet20 0.83x, 0.93x across hosts), where a
        buffer waits for the last gradient that an unpacked push would already have
        sent. A ParameterServer(pack_bytes=...) built by hand still packs the push.
    """
    if isinstance(variable_update, VariableUpdate):
        return variable_update
    if variable_update not in MODES:
        raise ValueError(
            f"variable_update must be one of {', '.join(VARIABLE_UPDATES)} or a "
            f"towers.VariableUpdate; got {variable_update!r}"
        )
    if variable_update == "replicated":
        if reduce is not None:
            raise ValueError("replicated towers are not combined across processes; a "
                             "multi-process job's towers share as parameter_server does")
        return Replicated()
    if param_device == "least_loaded":
        param_device = least_loaded(devices)
    within = ParameterServer(param_device, aggregation_device)
    if reduce is None:
        return within
    return CrossProcess(packing.packed(reduce, pack_bytes), within=within,
                        sum_across_processes=sum_across_processes)


def _wire_dtype(tower_grads: list[list]) -> tf.DType:
    """The type the tower gradients travel in (float32 when none is present)."""
    present = [g for grads in tower_grads for g in grads if g is not None]
    return present[0].dtype if present else tf.float32


def present_pairs(grads: list, variables: list[tf.Variable]) -> Pairs:
    pairs = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
    if not pairs:
        raise ValueError("the loss depends on no trainable variable: nothing to train")
    return pairs
