"""The pipeline's stages after translation: search, cost prediction, selection, acceptance, post-optimisation, assembly."""
