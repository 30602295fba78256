"""Workload: what the client will send, fixed before any run.

draws.py  the session law (turn counts, tool times, token ids) and the seeded per-session draws
plans.py  frozen, hashed open-loop plans with common random numbers across rates, arms and cells
"""
