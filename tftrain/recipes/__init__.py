"""Runnable recipes (`python -m tftrain.recipes.<name>`), sharing one driver."""
