"""SLURM: the local single-node cluster (`slurm.local`) and scheduler facts (`slurm.scheduler`).

Job scripts that enforce registrations and the submitit submission build on these two.
"""
