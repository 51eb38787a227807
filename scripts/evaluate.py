"""The evaluation, run from the checkout: ``einopt evaluate`` with the working directory made the
checkout's (see :mod:`einopt.evaluation.run` for the options, or ``--help``)."""

import os
import sys
from pathlib import Path

from einopt.evaluation.run import main

if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent.parent)
    sys.exit(main(prog="scripts/evaluate.py"))
