"""What a towers command resolves as its task in a launcher's environment (a Slurm step,
a Kubernetes Indexed Job), as the command itself resolves it (launch.distributed.cluster)."""

from launch.config import from_dict
from launch.distributed.cluster import Flags, Task, resolve


def task_of(environ: dict, command: str = "train", flags: Flags | None = None,
            **cluster) -> Task | None:
    """`towers COMMAND`'s task in this environment, with these cluster keys (None: one
    process)."""
    return resolve(from_dict({"cluster": cluster}).cluster, flags or Flags(), command, environ)
