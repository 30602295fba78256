"""Sim-to-real: the reference engine model checked against the real engines' own code (differential
tests over JSON-lines drivers in the engines' venvs), cost models fitted from a real engine's own
timings, and real runs replayed in the simulator."""
