"""Recording: what a run leaves behind and what a person watches while it runs.

record.py    the append-only run record (JSONL while running, Parquet + hashes at the end) and its one reader
progress.py  live progress of one run (RunProgress) and of a whole test (TestDisplay)
"""
