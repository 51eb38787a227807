"""``python -m einopt``: the ``einopt`` command line."""

from einopt.cli import main

main(prog_name="einopt")
