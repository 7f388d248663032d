"""Exceptions that carry a message written for the user: what is wrong and how to fix it."""


class FNLError(Exception):
    """Base class of every error fnlcore raises on purpose."""


class ConfigError(FNLError, ValueError):
    """A configuration key or value is wrong. The message names the key and the fix."""


class DataError(FNLError):
    """Input data is missing, truncated, corrupted or inconsistent."""


class StorageError(FNLError):
    """The disk cannot hold what must be written (checked before a checkpoint, or ENOSPC while writing)."""


class NotRetried(FNLError):
    """An earlier attempt of this job failed for a reason a retry cannot fix; this attempt did not run."""


class RunIncomplete(FNLError):
    """A run stopped before its job's time limit, after writing a checkpoint: not a failure, the
    next job of the same run continues from the checkpoint (exit status :data:`EXIT_CONTINUE`)."""

    def __init__(self, message: str, next_round: int, total_rounds: int):
        super().__init__(message)
        self.next_round = next_round
        self.total_rounds = total_rounds


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


#: The exit status of a training job that stopped before its time limit with a checkpoint
#: (:class:`RunIncomplete`): EX_TEMPFAIL of sysexits.h, "try again later"; the workflow's
#: next attempt of the job continues the run.
EXIT_CONTINUE = 75

# Messages of PyTorch's shape checks: the same code on the same data fails the same way every time.
_SHAPE_ERRORS = ("shapes cannot be multiplied", "size mismatch", "must match the size", "expected input",
                 "does not match the shape", "channels, but got")


def retry_cannot_fix(err: BaseException) -> bool:
    """True for failures that repeat on every attempt: a bad configuration, a corrupt or
    inconsistent input, a tensor shape error. Not for a full disk, memory, a kill or a flaky node."""
    if isinstance(err, (ConfigError, DataError, NotRetried)):
        return True
    if isinstance(err, RuntimeError) and not isinstance(err, FNLError):
        msg = str(err).lower()
        return "out of memory" not in msg and any(s in msg for s in _SHAPE_ERRORS)
    return False
