"""The support matrix: every model shape through every feature (tests/integration/test_support_matrix.py)."""
