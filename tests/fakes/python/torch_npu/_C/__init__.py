from . import _profiler  # noqa: F401
