"""Derivation rules (installed as ``einopt.rules``).

Each rule is a small named object in a registry; see method.md section 3.
The rules themselves arrive with issue 4; the expression core they operate
on lives in ``einopt.ir``.
"""

__all__: list[str] = []
