"""The hosts test's paced model: the built-in mlp, whose every step also sleeps
``delay_secs`` before the towers' forward pass.

A job that trains on while a test waits for a timeout to run out (a peer cut off for
good, a restarted worker importing TensorFlow) would otherwise take steps as fast as
the CPU allows, and spend the machine on steps nothing checks. Sleeping costs no CPU
and changes no value: the variables are the mlp's (same names), so a job may switch
between this model and `mlp` on one checkpoint.
"""

from slow_model import sleeping  # a sibling: model.path is on sys.path

import models
import models.mlp
import towers


def build(*, delay_secs: float, input_dim: int, hidden_units: list[int],
          num_classes: int) -> towers.ModelFn:
    mlp = models.mlp.build_model_fn(
        models.mlp.Params(input_dim, tuple(hidden_units), num_classes))
    return sleeping(mlp, delay_secs)


# What the built-in mlp takes (784 features, 10 classes: the built-in data's); a model
# of one's own says so, which the built-in one's name tells towers.
build.input_spec = models.build("mlp", {}).input_spec
