"""Each ``--kernels tvm`` output timed side by side with the ``--kernels onnx`` output of the same row
(:mod:`einopt.evaluation.forms`; ``--help`` for the options)."""

import sys

from einopt.evaluation.forms import main

if __name__ == "__main__":
    sys.exit(main())
