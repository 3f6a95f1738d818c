"""Where a training run's wall time goes: a phase timer and its table (`train.profile`).

`PhaseTimer` splits the session's wall time into exclusive phases (start-up
pieces, waiting on the lot prefetcher, device steps, evaluation, checkpoints):
a phase entered inside another ("evaluation / decoding") pauses the outer
one, so the phases sum to the time spent inside them, and "other" is the rest
of the session. JAX's own compilation events (`jax.monitoring`: tracing, lowering, XLA compile or a
persistent-cache load) are summed per phase as "of which compile".

Off (the default), every method is a no-op and `sync` returns at once, so the
loop keeps JAX's asynchronous dispatch; on, `sync` blocks on device results
so that device time is charged to the phase that queued it.

Privacy: a private run's step and preparation times depend on its realised lot
sizes, so its profile is written under `private/` and not logged
(`dpnmt.training.run_dir.RunDir.write_profile`).
"""

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax

# jax.monitoring duration events that make up compile time (jax/_src/dispatch.py).
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",  # XLA compile, or a persistent-cache load.
)
CACHE_SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"


class PhaseTimer:
    """Exclusive wall-clock time (s) per named phase, and JAX compile time within each."""

    def __init__(self, enabled: bool, clock: Callable[[], float] = time.perf_counter):
        """Starts the clock (`clock`: seconds); `enabled=False` makes every method a no-op."""
        self.enabled = enabled
        self._clock = clock
        self._seconds: dict[str, float] = {}
        self._compile: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._stack: list[str] = []
        self._since = self._clock()
        self._started = self._since
        self._compile_total = 0.0
        self._cache_saved = 0.0
        self._by_event = dict.fromkeys(COMPILE_EVENTS, 0.0)
        self._cache_events = {CACHE_HIT_EVENT: 0, CACHE_MISS_EVENT: 0}
        self._compile_mark = 0.0
        self._lock = threading.Lock()
        if enabled:
            jax.monitoring.register_event_duration_secs_listener(self._on_duration)
            jax.monitoring.register_event_listener(self._on_event)

    def _on_event(self, event: str, **_: Any) -> None:
        with self._lock:
            if event in self._cache_events:
                self._cache_events[event] += 1

    def _on_duration(self, event: str, duration: float, **_: Any) -> None:
        with self._lock:
            if event in COMPILE_EVENTS:
                self._compile_total += duration
                self._by_event[event] += duration
            elif event == CACHE_SAVED_EVENT:
                self._cache_saved += duration

    def _charge(self) -> None:
        """Charges the time (and compile time) since the last switch to the current phase."""
        now = self._clock()
        with self._lock:
            compiled = self._compile_total - self._compile_mark
            self._compile_mark = self._compile_total
        if self._stack:
            name = self._stack[-1]
            self._seconds[name] = self._seconds.get(name, 0.0) + now - self._since
            self._compile[name] = self._compile.get(name, 0.0) + compiled
        else:
            self._compile["other"] = self._compile.get("other", 0.0) + compiled
        self._since = now

    def start(self, name: str) -> None:
        """Enters phase `name` (qualified by an enclosing one: "evaluation / decoding")."""
        if not self.enabled:
            return
        self._charge()
        if self._stack:
            name = f"{self._stack[-1]} / {name}"
        self._stack.append(name)
        self._counts[name] = self._counts.get(name, 0) + 1

    def stop(self) -> None:
        """Leaves the innermost phase; the enclosing one resumes."""
        if not self.enabled:
            return
        self._charge()
        self._stack.pop()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charges the time spent inside to `name` (`start`/`stop` around the block)."""
        self.start(name)
        try:
            yield
        finally:
            self.stop()

    def sync(self, value: Any) -> Any:
        """Blocks until `value`'s device work is done when profiling; returns `value`."""
        if self.enabled:
            jax.block_until_ready(value)
        return value

    def close(self) -> None:
        """Stops listening to JAX's compile events."""
        if self.enabled:
            self._charge()
            jax.monitoring.unregister_event_duration_listener(self._on_duration)
            jax.monitoring.unregister_event_listener(self._on_event)
            self.enabled = False

    def summary(self) -> dict:
        """The profile so far: phases (seconds, fraction of the session, compile s, entries).

        Returns:
          {"total_seconds", "compile_seconds" (tracing + lowering + XLA compile or
          cache load), "compile_seconds_by_step" ({"trace", "lower", "xla"}),
          "compile_seconds_saved_by_cache", "cache_hits", "cache_misses",
          "phases": [{"phase", "seconds", "fraction", "compile_seconds", "count"}]},
          phases in first-entered order, then "other" (time in no phase).
        """
        if self.enabled:
            self._charge()
        total = self._clock() - self._started
        rows = [
            {
                "phase": name,
                "seconds": seconds,
                "fraction": seconds / total if total > 0 else 0.0,
                "compile_seconds": self._compile.get(name, 0.0),
                "count": self._counts.get(name, 0),
            }
            for name, seconds in self._seconds.items()
        ]
        other = max(total - sum(self._seconds.values()), 0.0)
        rows.append(
            {
                "phase": "other",
                "seconds": other,
                "fraction": other / total if total > 0 else 0.0,
                "compile_seconds": self._compile.get("other", 0.0),
                "count": 0,
            }
        )
        return {
            "total_seconds": total,
            "compile_seconds": self._compile_total,
            "compile_seconds_by_step": {
                step: self._by_event[event]
                for step, event in zip(("trace", "lower", "xla"), COMPILE_EVENTS, strict=True)
            },
            "compile_seconds_saved_by_cache": self._cache_saved,
            "cache_hits": self._cache_events[CACHE_HIT_EVENT],
            "cache_misses": self._cache_events[CACHE_MISS_EVENT],
            "phases": rows,
        }


def format_table(summary: dict) -> str:
    """`summary()` as a Markdown table (seconds, % of wall time, of which compile)."""
    lines = [
        "| phase | seconds | % of wall | of which compile (s) | entries |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in summary["phases"]:
        lines.append(
            f"| {row['phase']} | {row['seconds']:.1f} | {100 * row['fraction']:.1f} | "
            f"{row['compile_seconds']:.1f} | {row['count']} |"
        )
    lines.append(
        f"| **total** | {summary['total_seconds']:.1f} | 100.0 | "
        f"{summary['compile_seconds']:.1f} | |"
    )
    by_step = summary["compile_seconds_by_step"]
    lines.append(
        f"\nCompile: trace {by_step['trace']:.1f} s, lower {by_step['lower']:.1f} s, XLA "
        f"compile or cache load {by_step['xla']:.1f} s; persistent cache: "
        f"{summary['cache_hits']} hits, {summary['cache_misses']} misses, "
        f"{summary['compile_seconds_saved_by_cache']:.1f} s of compiling saved."
    )
    return "\n".join(lines)
