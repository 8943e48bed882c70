"""Modules that configs in tests refer to (never collected as tests)."""
