"""The derivation search (installed as ``einopt.search``).

Explorative and converging derivation with fingerprint pruning
(method.md section 5); it builds on ``einopt.rules`` and ``einopt.keys``.
"""

__all__: list[str] = []
