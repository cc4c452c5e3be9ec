"""`python -m launch` runs the `towers` command."""

import sys

from launch.cli import main
from launch.runtime.signals import ignore_from_now

status = main()
# The command is over: a stop signal arriving while the interpreter shuts down (its
# threads, TensorFlow's) would otherwise end with -SIGTERM (143) a process that
# finished, which an orchestrator takes for a failure and restarts.
ignore_from_now()
sys.exit(status)
