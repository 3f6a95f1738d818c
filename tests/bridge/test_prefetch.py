import threading
import time

import pytest

from dpnmt.bridge import Prefetcher


class CountingSource:
    """Counts how far the producer ran ahead; has a state_dict like a lot source."""

    def __init__(self, limit=None, fail_at=None):
        self.produced = 0
        self.limit = limit
        self.fail_at = fail_at

    def __iter__(self):
        while self.limit is None or self.produced < self.limit:
            if self.produced == self.fail_at:
                raise KeyError("corrupt shard")
            self.produced += 1
            yield self.produced - 1

    def state_dict(self):
        return {"produced": self.produced}


def wait_until(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_items_arrive_in_order_transformed_and_end_cleanly():
    with Prefetcher(CountingSource(limit=7), transform=lambda x: x * 10) as prefetcher:
        assert list(prefetcher) == [0, 10, 20, 30, 40, 50, 60]
        assert prefetcher.state_dict() == {"produced": 7}


def test_runs_ahead_by_at_most_the_queue_depth():
    source = CountingSource()
    with Prefetcher(source, depth=3) as prefetcher:
        # Ready ahead before the first next(): the queue fills (3) and the thread
        # holds one more item while it waits to put it.
        assert wait_until(lambda: source.produced == 4)
        time.sleep(0.1)
        assert source.produced == 4
        assert next(prefetcher) == 0
        assert prefetcher.state_dict() == {"produced": 1}  # consumed, not prefetched
        assert wait_until(lambda: source.produced == 5)


def test_exception_in_the_thread_is_raised_by_next():
    with Prefetcher(CountingSource(fail_at=2)) as prefetcher:
        assert next(prefetcher) == 0
        assert next(prefetcher) == 1
        with pytest.raises(KeyError, match="corrupt shard"):
            next(prefetcher)
        with pytest.raises(StopIteration):
            next(prefetcher)


def test_close_stops_the_thread_of_an_infinite_source():
    before = threading.active_count()
    prefetcher = Prefetcher(CountingSource(), depth=2)
    next(prefetcher)
    prefetcher.close()
    assert not prefetcher._thread.is_alive()
    assert threading.active_count() == before
    prefetcher.close()  # idempotent
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth = 0"):
        Prefetcher([1, 2], depth=0)
