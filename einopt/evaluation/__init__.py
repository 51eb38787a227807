"""The evaluation: every generated model at batch 1 and 16 and every shared exporter model optimized and
benchmarked, one row at a time (:mod:`~einopt.evaluation.run`, ``einopt evaluate``), the side checks
against OpenVINO and PyTorch's outputs (:mod:`~einopt.evaluation.checks`), and the tables with their
targets (:mod:`~einopt.evaluation.tables`, ``targets.json``)."""
