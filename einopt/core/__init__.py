"""The expression core: the IR, its text syntax, the reference interpreter, canonical keys, rewriting helpers and the analytic cost."""
