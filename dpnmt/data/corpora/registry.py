"""The corpus registry: each corpus's loader and the typed options it accepts."""

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import datasets

from dpnmt.data.corpora.bsd import BsdOptions, load_bsd
from dpnmt.data.corpora.clinspen import ClinSpEnOptions, load_clinspen
from dpnmt.data.corpora.files import FilesOptions, load_files
from dpnmt.data.corpora.hub import HubOptions, load_hub
from dpnmt.data.corpora.wmt16 import Wmt16Options, load_wmt16
from dpnmt.data.languages import LanguagePair
from dpnmt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Corpus:
    """One registry entry.

    Attributes:
      name: "wmt16", or a prefix ("hub", "files") written `<name>:<argument>`.
      options: the frozen dataclass of keyword options its loader accepts.
      load: `(argument or None, pair, options) -> DatasetDict`.
      takes_argument: written `<name>:<argument>` (hub id, folder).
    """

    name: str
    options: type
    load: Callable[[str | None, str | LanguagePair, Any], datasets.DatasetDict]
    takes_argument: bool = False


def _plain(loader):
    return lambda _, pair, options: loader(pair, **dataclasses.asdict(options))


def _with_argument(loader):
    return lambda argument, pair, options: loader(argument, pair, **dataclasses.asdict(options))


CORPORA: dict[str, Corpus] = {
    corpus.name: corpus
    for corpus in (
        Corpus("wmt16", Wmt16Options, _plain(load_wmt16)),
        Corpus("bsd", BsdOptions, _plain(load_bsd)),
        Corpus("clinspen", ClinSpEnOptions, _plain(load_clinspen)),
        Corpus("hub", HubOptions, _with_argument(load_hub), takes_argument=True),
        Corpus("files", FilesOptions, _with_argument(load_files), takes_argument=True),
    )
}
# The plain names (no argument), for messages and old callers.
LOADERS = {name: corpus for name, corpus in CORPORA.items() if not corpus.takes_argument}


def lookup(name: str) -> tuple[Corpus, str | None]:
    """The registry entry and argument of a corpus name ("wmt16", "files:<dir>", ...).

    Raises:
      ConfigError: an unknown name (with the closest known one) or a missing argument.
    """
    prefix, colon, argument = name.partition(":")
    corpus = CORPORA.get(prefix)
    if corpus is None or corpus.takes_argument != bool(colon):
        names = sorted(LOADERS) + ["hub:<dataset id>", "files:<folder>"]
        close = difflib.get_close_matches(prefix, list(CORPORA), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"Unknown corpus {name!r} (data.corpus); {hint}use one of {names}.")
    if corpus.takes_argument and not argument:
        raise ConfigError(f"data.corpus={name!r} needs its argument after the colon.")
    return corpus, (argument if corpus.takes_argument else None)


def accepted_options(name: str) -> tuple[str, ...]:
    """The keyword options the loader of corpus `name` accepts."""
    corpus, _ = lookup(name)
    return tuple(field.name for field in dataclasses.fields(corpus.options))


def make_options(name: str, **kwargs):
    """The corpus's options dataclass from keyword arguments.

    Raises:
      ConfigError: an option the corpus does not accept, naming those it does.
    """
    corpus, _ = lookup(name)
    accepted = accepted_options(name)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ConfigError(
            f"Corpus {name!r} does not take {unknown}; it takes {list(accepted)}. Unset them."
        )
    return corpus.options(**kwargs)


def load_corpus(name: str, pair: str | LanguagePair, **kwargs) -> datasets.DatasetDict:
    """Loads a corpus by registry name.

    Args:
      name: "wmt16", "bsd", "clinspen", "hub:<dataset id>" or "files:<folder>".
      pair: direction, e.g. "de-en".
      **kwargs: the corpus's options (its dataclass in `CORPORA`: data_dir,
        train_split, validation_size, ...).

    Returns:
      DatasetDict with train/validation/test of {"translation": {source, target}};
      each split's `info.description` says where it came from.

    Raises:
      ConfigError: unknown name (listing the known ones) or an option it does not take.
    """
    corpus, argument = lookup(name)
    return corpus.load(argument, pair, make_options(name, **kwargs))
