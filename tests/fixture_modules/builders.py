"""Builders that configs in tests refer to."""


def raises_when_built(**_):
    """Resolves at validation (it exists, takes any argument) but fails when
    the job is built: a failure only the run can find."""
    raise RuntimeError("the builder failed on purpose")
