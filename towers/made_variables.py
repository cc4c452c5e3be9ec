"""Variables made without get_variable (Keras layers, tf.Variable), matched across towers
by the order they are made in: the creator-scope half of towers.sharing's story.

Tower 0 makes each one outside its `tower_0/` name scope and remembers them in order;
a later tower's k-th creation is answered by the sharing with what it hands out for
tower 0's k-th, checked by the name it was asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import tensorflow as tf


class LaterCreations(Protocol):
    """What a later tower is handed for tower 0's variable `original` (towers.sharing)."""

    def later_created_variable(self, next_creator, index: int, original: tf.Variable,
                               kwargs: dict) -> tf.Variable: ...


class MadeVariables:
    """Watches the variable creations of the builds of one step's towers, matching a later
    tower's k-th to tower 0's k-th; one instance per step (every micro-batch's build)."""

    def __init__(self) -> None:
        self.first: list[tf.Variable] = []  # tower 0's, in creation order
        self._first_names: list[str | None] = []  # the names they were asked for
        self._handed: dict[int, list[tf.Variable]] = {}  # each tower's, in creation order
        self._in_getter = False

    def through_getter(self, getter):
        """`getter` (get_variable's), marked so the creator scope lets its variables pass:
        the custom getter has already decided what they are."""

        def marked(*args, **kwargs):
            self._in_getter = True
            try:
                return getter(*args, **kwargs)
            finally:
                self._in_getter = False

        return marked

    @contextlib.contextmanager
    def tower(self, index: int, scope: str, first_vars: dict[str, tf.Variable],
              sharing: LaterCreations) -> Iterator[None]:
        """Around tower `index`'s model function; `scope` is its name scope ('tower_0/').

        Tower 0's variables are also entered in `first_vars` under their names.
        """
        again = index in self._handed  # built before: hand out the same variables
        handed = self._handed.setdefault(index, [])
        made = 0

        def create(next_creator, **kwargs):
            nonlocal made
            if self._in_getter:
                return next_creator(**kwargs)
            if again:
                var = self._again(index, made, kwargs.get("name"))
            elif index == 0:
                var = _outside_scope(scope, next_creator, kwargs)
                self.first.append(var)
                self._first_names.append(kwargs.get("name"))
            else:
                original = self._match(index, made, kwargs.get("name"))
                var = sharing.later_created_variable(next_creator, index, original, kwargs)
            made += 1
            if not again:
                handed.append(var)
            if index == 0:
                first_vars[var.op.name] = var
            return var

        with tf.variable_creator_scope(create):
            yield
        # None made: the tower reused objects tower 0 built (a Keras model made once),
        # which reads tower 0's variables; the sharing decides if that will do.
        expected = len(handed) if again else len(self.first)
        if index > 0 or again:
            self._check_count(index, made, expected)

    def _check_count(self, index: int, made: int, expected: int) -> None:
        if 0 < made < expected:
            missing = ", ".join(v.op.name for v in self.first[made:])
            raise ValueError(
                f"tower {index} made {made} variable(s) without get_variable where tower 0 "
                f"made {len(self.first)} (tower 0's {missing} had no counterpart); a model "
                f"must make the same variables in every tower"
            )

    def _again(self, index: int, position: int, name: str | None) -> tf.Variable:
        """What tower `index` got for its `position`-th creation when first built."""
        self._match(index, position, name)
        handed = self._handed[index]
        if position >= len(handed):
            raise ValueError(
                f"tower {index} made variable '{name}' when built again but made "
                f"{len(handed)} the first time; a model must make the same variables "
                f"every time it is called")
        return handed[position]

    def _match(self, index: int, position: int, name: str | None) -> tf.Variable:
        if position >= len(self.first):
            raise ValueError(
                f"tower {index} made variable '{name}' (its variable number {position + 1} "
                f"made without get_variable) but tower 0 made only {len(self.first)}; a "
                f"model must make the same variables in every tower"
            )
        original = self.first[position]
        if name != self._first_names[position]:
            raise ValueError(
                f"tower {index} made variable '{name}' where tower 0 made "
                f"'{original.op.name}' (variable number {position + 1}); a model must make "
                f"the same variables in the same order in every tower"
            )
        return original


def _outside_scope(scope: str, next_creator, kwargs) -> tf.Variable:
    """Make the variable under the current name scope minus the tower's prefix."""
    graph = tf.compat.v1.get_default_graph()
    current = graph.get_name_scope()
    prefix = scope.rstrip("/")
    if current != prefix and not current.startswith(scope):
        return next_creator(**kwargs)  # the model left the tower's scope itself
    stripped = current[len(prefix):].lstrip("/")
    # A name ending in "/" is entered as it is; "" is the top level.
    with graph.name_scope(stripped + "/" if stripped else ""):
        return next_creator(**kwargs)
