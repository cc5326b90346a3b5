"""Internals of :mod:`sapptk.balancer`: integer views of a program (paths, live points),
per-device layout enumeration, and the CP-SAT master problems. Use :func:`sapptk.balance`."""
