"""`python -m launch` runs the `towers` command."""

import sys

from launch.cli import main

sys.exit(main())
