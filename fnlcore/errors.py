"""Exceptions that carry a message written for the user: what is wrong and how to fix it."""


class FNLError(Exception):
    """Base class of every error fnlcore raises on purpose."""


class ConfigError(FNLError, ValueError):
    """A configuration key or value is wrong. The message names the key and the fix."""


class DataError(FNLError):
    """Input data is missing, truncated, corrupted or inconsistent."""


class ChecksumError(DataError):
    """A downloaded or placed file does not match its published checksum."""


class MissingManualDataError(DataError):
    """A dataset that needs an account or a request is not where it must be placed."""


def located(where: str, fn, *args):
    """Call ``fn(*args)``; a ConfigError (or a constructor's TypeError/ValueError) gets ``where: `` in front."""
    try:
        return fn(*args)
    except (ConfigError, TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None
