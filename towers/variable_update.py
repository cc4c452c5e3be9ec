"""Update modes: how the towers' gradients become one update.

One class per mode, behind the small interface `build_train_op` calls (as
tf_cnn_benchmarks' VariableMgr subclasses). Each holds the towers.sharing policy
that says what each tower's variables are and where they live:

  ParameterServer  one copy of each variable on a parameter device; tower gradients
                   summed where each variable lives (or on one aggregation device)
  CrossProcess     ParameterServer whose summed gradients, loss and metrics are then
                   combined with other processes' (Horovod's all-reduce)
  Replicated       a copy of each trainable variable per tower, gradients all-reduced,
                   every copy updated by the same step

Every gradient handed to `combine_gradients` is already scaled by its tower's share
of the global batch, so the combined gradient is a plain sum. It comes in the type
gradients travel in (float32, or 16 bits: towers.Precision.gradient_dtype); a mode
keeps that type on every hop between devices or processes, and sums in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from towers import gradients as grad_lib
from towers import precision as precision_lib
from towers.builder import Tower
from towers.placement import DeviceFn, least_loaded
from towers.sharing import ReplicaCopies, SharedVariables, VariableSharing

# Maps a list of gradients (tensors, IndexedSlices or None) to a list of the same length.
GradientsFn = Callable[[list], list]
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
        """Where the loss, the metrics and the global step are combined and kept."""
        raise NotImplementedError

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


class ParameterServer(VariableUpdate):
    """One copy of each variable on `param_device`; every tower reads it.

    param_device: a device string, or a device function of the variable op:
        `towers.least_loaded(devices)` spreads variables over the tower devices by
        byte size; a ps/worker job's worker passes its replica_device_setter.
    aggregation_device: where tower gradients are summed; None sums each on its
        variable's device. A ps/worker job's worker passes its own CPU so it sends
        one gradient per variable to the ps tasks.
    """

    name = "parameter_server"

    def __init__(self, param_device: str | DeviceFn = "/cpu:0",
                 aggregation_device: str | None = None):
        if param_device == "least_loaded":
            raise ValueError("pass towers.least_loaded(devices) as the parameter device")
        self.param_device = param_device
        self.aggregation_device = aggregation_device
        self.variables = SharedVariables(param_device)

    def home(self, devices: Sequence[str]) -> str:
        return devices[0] if callable(self.param_device) else self.param_device

    def combine_gradients(self, towers, tower_grads, clip_norm):
        variables = towers[0].trainable
        wire = _wire_dtype(tower_grads)
        summed = grad_lib.aggregate(tower_grads, variables, self.aggregation_device)
        with tf.device(self.aggregation_device or self.home([t.device for t in towers])):
            summed = self.reduce_across_processes(summed, wire)
            summed, norm = grad_lib.clip_by_global_norm(summed, clip_norm)
            if self.aggregation_device:  # the sums still have a hop to the variables
                summed = grad_lib.send_to_variables(summed, variables, wire)
        return present_pairs(summed, variables), norm

    def reduce_across_processes(self, summed: list, wire: tf.DType) -> list:
        """This process's summed gradients combined with other processes'; here, as they are.
        wire: the type gradients travel in."""
        return summed


class CrossProcess(ParameterServer):
    """ParameterServer inside one process of a multi-process job (a Horovod rank).

    reduce: combines this process's values with the other processes' (all-reduce);
    it takes and returns lists of tensors, IndexedSlices or None. It is applied to
    the summed gradients before clipping, so the norm clipped is the whole job's,
    and to the loss and metrics, so every process makes the same finite-or-not
    decision and reports the same values.
    """

    name = "cross_process"

    def __init__(self, reduce: GradientsFn, param_device: str | DeviceFn = "/cpu:0",
                 aggregation_device: str | None = None):
        super().__init__(param_device, aggregation_device)
        self.reduce = reduce

    def reduce_across_processes(self, summed: list, wire: tf.DType) -> list:
        """Sent in the wire type (a 16-bit all-reduce sums in 16 bits: Horovod's own
        fp16 compression), float32 again after."""
        sent = self.reduce([precision_lib.cast_gradient(g, wire) for g in summed])
        return [precision_lib.cast_gradient(r, g.dtype) if g is not None else r
                for r, g in zip(sent, summed, strict=True)]

    def combine_outputs(self, loss, metrics, home):
        # The caller runs these in every step, so that every process joins the same
        # collectives in the same order.
        with tf.device(self.aggregation_device or home), tf.name_scope("job_wide_outputs"):
            job_wide = self.reduce([loss, *metrics.values()])
        return job_wide[0], dict(zip(metrics, job_wide[1:], strict=True)), job_wide


class Replicated(VariableUpdate):
    """A copy of each trainable variable per tower, on the tower's device
    (towers.sharing.ReplicaCopies); gradients all-reduced, every copy updated by the
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
        for tower, grads in zip(towers, reduced, strict=True):
            # Each tower clips its own copy on its own device; the inputs are
            # identical, so the results are too, with no cross-device wait.
            with tf.device(tower.device):
                clipped, norm = grad_lib.clip_by_global_norm(grads, clip_norm)
            pairs.extend(present_pairs(clipped, tower.trainable))
            norms.append(norm)
        return pairs, norms[0]


MODES = {mode.name: mode for mode in (ParameterServer, Replicated)}
VARIABLE_UPDATES = tuple(MODES)


def resolve(variable_update: str | VariableUpdate, param_device: str | DeviceFn,
            devices: Sequence[str]) -> VariableUpdate:
    """A mode object from a mode name (with the parameter device) or as given.

    param_device "least_loaded" spreads the variables over `devices` by byte size.
    """
    if isinstance(variable_update, VariableUpdate):
        return variable_update
    if variable_update == "replicated":
        return Replicated()
    if variable_update == "parameter_server":
        if param_device == "least_loaded":
            param_device = least_loaded(devices)
        return ParameterServer(param_device)
    raise ValueError(
        f"variable_update must be one of {', '.join(VARIABLE_UPDATES)} or a "
        f"towers.VariableUpdate; got {variable_update!r}"
    )


def _wire_dtype(tower_grads: list[list]) -> tf.DType:
    """The type the tower gradients travel in (float32 when none is present)."""
    present = [g for grads in tower_grads for g in grads if g is not None]
    return present[0].dtype if present else tf.float32


def present_pairs(grads: list, variables: list[tf.Variable]) -> Pairs:
    pairs = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
    if not pairs:
        raise ValueError("the loss depends on no trainable variable: nothing to train")
    return pairs
