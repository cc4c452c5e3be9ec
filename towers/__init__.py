"""Data-parallel tower training: split a batch across devices, share variables, one update."""

from towers.context import Features, ModelFn, TowerContext, TowerOutputs

__all__ = ["Features", "ModelFn", "TowerContext", "TowerOutputs"]
