"""Host-side prefetch: a background thread keeps lots ready ahead of the step."""

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")

_POLL_SECONDS = 0.05


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class Prefetcher(Generic[Item], Iterator[Item]):
    """Iterates `source` in a background thread, up to `depth` items ahead.

    Each item is optionally transformed in the thread (e.g. `to_microbatches`
    and `shard_microbatch`), so host work overlaps the device step. An exception
    in the thread is re-raised by `next()`. `state_dict()` returns the source's
    state after the last item *consumed* (not the ones prefetched), so a
    checkpoint resumes exactly after the last lot the step used. Use as a
    context manager, or call `close()`.
    """

    def __init__(
        self,
        source: Iterable[Any],
        *,
        transform: Callable[[Any], Item] | None = None,
        depth: int = 2,
    ):
        """Starts the background thread.

        Args:
          source: iterable of lots; if it has `state_dict()`, its state is
            recorded with every item.
          transform: applied to every item in the thread; identity if None.
          depth: items kept ready ahead of the consumer, >= 1.

        Raises:
          ValueError: `depth` < 1.
        """
        if depth < 1:
            raise ValueError(f"prefetch depth = {depth} must be at least 1.")
        self._source = source
        self._transform = transform
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._last_state: dict[str, Any] | None = (
            source.state_dict() if hasattr(source, "state_dict") else None
        )
        self._done = False
        self._thread = threading.Thread(target=self._produce, name="dpnmt-prefetch", daemon=True)
        self._thread.start()

    def _put(self, entry: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        has_state = hasattr(self._source, "state_dict")
        try:
            for item in self._source:
                state = self._source.state_dict() if has_state else None
                if self._transform is not None:
                    item = self._transform(item)
                if not self._put((item, state)):
                    return
            self._put(_END)
        except BaseException as error:  # noqa: BLE001 - re-raised in the consumer.
            self._put(_Failure(error))

    def __next__(self) -> Item:
        """The next item; re-raises an exception from the thread."""
        if self._done:
            raise StopIteration
        entry = self._queue.get()
        if entry is _END:
            self._done = True
            raise StopIteration
        if isinstance(entry, _Failure):
            self._done = True
            raise entry.error
        item, self._last_state = entry
        return item

    def state_dict(self) -> dict[str, Any] | None:
        """The source's state after the last consumed item (None if it has none)."""
        return self._last_state

    def close(self) -> None:
        """Stops the thread and waits for it; safe to call twice."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()
        self._done = True

    def __enter__(self) -> "Prefetcher[Item]":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
