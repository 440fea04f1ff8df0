"""Kolibri-1 model code: reference maths (`ops`) and the parity reference model."""
