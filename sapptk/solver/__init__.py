"""Internals of :mod:`sapptk.balance`: integer views of a program (paths, live points),
per-device layout enumeration, and the CP-SAT master problems. Use :func:`sapptk.balance`."""
