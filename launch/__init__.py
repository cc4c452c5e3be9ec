"""Command-line entry points: job-file config and the `towers` CLI."""
