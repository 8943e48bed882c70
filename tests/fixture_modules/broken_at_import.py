"""A builder module with a bug at import time (tests/e2e/bad_configs)."""
raise RuntimeError("this module is broken on purpose")
