"""The review of a test as a whole: what combines registration, scheduler, provenance and analysis.

A reviewer's questions each need several layers at once: the registered verdict at the registration's
commit (`registered.py`: which runs are bound, judged by which code), where a test stands
(`status.py`), its timeline, labels and blindness (`timeline.py`), whole-test verification
(`verify.py`), predictions scored from their tag (`score_report.py`) and the HTML page (`html/`),
all reading one test directory (`testdir.py`, `records.py`). Everything below this package judges or
runs one part; nothing below imports it.
"""
