"""Bundled example expressions in the text syntax (``einopt examples`` lists them)."""
