"""Drivers: the thin loops that give a sans-IO client a clock and an engine.

virtual.py  virtual time: an event heap over the client and the reference engine model (the simulator)
wall.py     wall time: asyncio over HTTP to a real server or the emulator, plan time = wall x time scale

Both drive any `harness.client.contract.Client` and write the same run record, so one analysis
reads simulated and real runs alike.
"""
