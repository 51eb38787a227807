"""ONNX Runtime services: model I/O and sessions, timing, benchmarking, the measurement cache, operator costs, verification."""
