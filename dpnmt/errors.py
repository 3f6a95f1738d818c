"""Errors a user fixes by changing an input: the apps print them as one line.

Each carries a message naming the bad input (config field, flag, file) and the
fix. The apps (`dpnmt.cli.run`) print it without a traceback and exit with
status 2; any other exception is a bug and keeps its traceback. The subclasses
also derive from the built-in type callers already catch (ValueError,
FileNotFoundError, RuntimeError).
"""


class InputError(Exception):
    """A bad input the user can fix; the message names it and the fix."""


class ConfigError(InputError, ValueError):
    """A config field, flag or workdir that cannot work (one problem per line)."""


class MissingInputError(InputError, FileNotFoundError):
    """A file or folder the run needs is not there."""


class UnreachableError(InputError, RuntimeError):
    """Data or a model must come from the network, which cannot be reached."""


class ModelUnavailableError(InputError, OSError):
    """A pretrained model or tokenizer is neither a local folder nor reachable on the hub."""


def raise_problems(problems: list[str]) -> None:
    """Raises every problem at once as one `ConfigError`, one per line (nothing when empty)."""
    if problems:
        if len(problems) == 1:
            raise ConfigError(problems[0])
        raise ConfigError(f"{len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems))
