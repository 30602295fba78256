"""Suite-wide settings.

Property tests run without hypothesis' per-example deadline: this suite runs on small shared
machines where one slow example (a scheduler hiccup, a loaded core) says nothing about the code,
and a deadline failure there would be a flaky test, not a finding. The number of examples is kept.
"""

from hypothesis import settings

settings.register_profile("agentload", deadline=None)
settings.load_profile("agentload")
