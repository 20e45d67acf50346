"""`python launch_toy.py ARGS…` = `spanlm ARGS…` with the toy objective registered (for subprocess tests)."""

import sys

import toy_objective  # noqa: F401  (registers "toy")
from spanlm.cli import main

sys.exit(main(sys.argv[1:]))
