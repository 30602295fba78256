"""Protocols: what a run or a stage of a test does, on top of plans, clients and drivers.

arms.py         one arm x rate x seed from its frozen plan (simulator or real engine), and a whole test
realrun.py      the real-engine path: launch or attach a server, smoke, flush + canary, drive, stop
calibration.py  calibration stages (Stage C closed populations, E0a cache-off reference)
cli.py          the `run` and `test run` commands
"""
