"""HTTP emulator: the reference engine model served with SGLang's or vLLM's API (see server.py)."""
