"""Error types: every user-facing failure is one of these, with a message that names
the file, the field, the value and what was expected."""

from __future__ import annotations


class SapptkError(ValueError):
    """Base class for errors caused by what the user gave sapptk."""


class ProfileError(SapptkError):
    """A layer profile is malformed (missing key, bad value, unknown type, ...)."""


class ScheduleError(SapptkError):
    """A schedule cannot be built for the given arguments, or a program is invalid."""


class DeadlockError(ScheduleError):
    """A program's op order has a dependency cycle; ``cycle`` lists the ops on it."""

    def __init__(self, message: str, cycle: tuple = ()) -> None:
        super().__init__(message)
        self.cycle = cycle


class ConfigError(SapptkError):
    """A pipeline configuration or a hand-made plan is invalid."""


class CalibrationError(SapptkError):
    """Dry-run observations cannot be read or cannot determine a profile (which file,
    which field, what was expected; for an under-determined fit, which observation would fix it)."""


class TraceError(SapptkError):
    """A profiler trace cannot be read, or holds no event that matches the layer names given."""


class FileError(SapptkError):
    """A file cannot be read or written safely: missing, not a regular file, too large, not
    UTF-8 text, not valid JSON/YAML/TOML, nested too deeply; or a folder is not writable."""


class SapptkWarning(UserWarning):
    """Something the user should know that did not stop the work (e.g. a damaged sweep cache
    part that was skipped)."""
