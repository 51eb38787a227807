"""``python -m einopt.cli``: the ``einopt`` command line."""

from einopt.cli import main

main(prog_name="einopt")
