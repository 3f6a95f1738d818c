"""Runs lots through the DP lot step: secret keys, bucket shapes, micro-batches.

The loop (`dpnmt.training.loop`) asks a `LotRunner` for its lot source and
then for one lot at a time; the runner owns the keys of the secret schedule
and never hands them out.
"""

import dataclasses
import logging
import os
import time
from concurrent import futures

import jax
import jax.numpy as jnp

from dpnmt import bridge, core
from dpnmt.config import DataConfig, PrivacyConfig, TrainConfig
from dpnmt.training import ema
from dpnmt.training.profile import PhaseTimer
from dpnmt.training.records import RunPieces
from dpnmt.training.run_dir import derived_seed
from dpnmt.training.state import LoopState


class LotRunner:
    """One lot at a time through `run.step.step_fns`, with the run's secret keys."""

    def __init__(self, run: RunPieces, dp: PrivacyConfig, timer: PhaseTimer):
        """Places the frozen parameters; derives the noise and dropout keys.

        Args:
          run: the session's pieces (`setup.build_run`).
          dp: the `dp` section (`secure_rng`: fresh keys every session).
          timer: charges lot preparation and device steps (`train.profile`).
        """
        self._run, self._timer = run, timer
        # Parameters and optimizer state live replicated on the data mesh.
        self.replicated = bridge.replicated_sharding(run.step.mesh)
        self.frozen = jax.device_put(run.model.frozen, self.replicated)
        self._noise_seed = run.secrets.noise_seed
        self._dp = dp
        self._noise_base = self._dropout_base = None

    def place(self, state: LoopState) -> LoopState:
        """`state` with its parameters, average and optimizer state replicated on the mesh."""
        trainable, opt_state, average = jax.device_put(
            (state.trainable, state.opt_state, state.average), self.replicated
        )
        return dataclasses.replace(state, trainable=trainable, opt_state=opt_state, average=average)

    def derive_keys(self) -> None:
        """The secret noise and dropout bases (after a resume has been restored)."""
        noise_base = core.key_from_seed(derived_seed(self._noise_seed, "noise"))
        # Dropout keys are secret too: an example's key follows its row position in
        # the lot, and adding an example shifts the others' rows. With public keys
        # that would change the other examples' (known) dropout masks, moving the
        # clipped sum by more than C; with secret keys the others' masks stay iid.
        dropout_base = core.key_from_seed(derived_seed(self._noise_seed, "dropout"))
        if self._dp.secure_rng and self._run.privacy.plan.private:
            # Fresh secure lots after a resume: never pair them with replayed keys.
            session = self._run.files.run_dir.count_session()
            noise_base = jax.random.fold_in(noise_base, session)
            dropout_base = jax.random.fold_in(dropout_base, session)
        self._noise_base, self._dropout_base = noise_base, dropout_base

    def source(self, data: DataConfig, train: TrainConfig, trainable):
        """The lots, prepared a lot ahead; every length bucket compiled first.

        Args:
          data: the `data` section (length buckets, maximum lengths).
          train: the `train` section (`physical_batch_size`).
          trainable: the current trainable parameters (to compile against).

        Returns:
          `bridge.device_lots`' prefetcher (`next`, `state_dict`, `close`).
        """
        run = self._run
        group_cap = run.privacy.plan.group_cap
        if group_cap is not None:
            # dp.unit="group": micro-batches of whole groups, k rows each, at the max
            # lengths (length buckets would split a group; config refuses explicit ones).
            rows = bridge.group_microbatch_rows(
                train.physical_batch_size, group_cap, run.step.mesh.shape[bridge.DATA_AXIS]
            )
            logging.info(
                "Group micro-batches: %d groups of k=%d rows (%d rows; no length buckets).",
                rows // group_cap,
                group_cap,
                rows,
            )
            return bridge.device_lots(
                run.step.lots,
                run.step.mesh,
                rows,
                pad_values=run.data.train_examples.pad_values,
                rows_from=run.data.train_examples,
            )
        buckets = bridge.resolve_length_buckets(
            data.length_buckets,
            data.max_source_length,
            data.max_target_length,
            lengths_known=hasattr(run.data.train_examples, "lengths"),
        )
        if buckets is not None:
            with self._timer.phase("start-up: compile every length bucket"):
                self._compile_buckets(buckets, train.physical_batch_size, trainable)
        # Host side (sampling, micro-batching, sharding) runs a lot ahead in a thread.
        return bridge.device_lots(
            run.step.lots,
            run.step.mesh,
            train.physical_batch_size,
            pad_values=run.data.train_examples.pad_values,
            rows_from=run.data.train_examples,
            # Shapes per lot depend on its rows, like the micro-batch count: never logged.
            length_buckets=buckets,
        )

    def _compile_buckets(self, buckets, rows: int, trainable) -> None:
        """Compiles the micro-batch step for every bucket shape, before any lot.

        Which shapes compile, and when, then says nothing about the lots (see
        `bridge.padding_microbatches`). The lot's update (`apply_lot`, one
        shape) compiles alongside. Each shape is lowered here on padding
        rows (never run) and its XLA compile goes to a thread pool, so a
        multi-core machine compiles several buckets at once; `jax.jit`'s own
        cache then serves the lots' calls. Bucket shapes are public (the
        config's), so the progress is logged; nothing about a lot is.
        """
        run = self._run
        examples, mesh = run.data.train_examples, run.step.mesh
        micros = bridge.padding_microbatches(
            buckets, examples.field_specs(), rows, examples.pad_values
        )
        acc = jax.device_put(core.init_accumulator(trainable), self.replicated)
        count = len(micros)
        workers = max(1, min(count + 1, _cpu_count()))  # The buckets and the update.
        logging.info(
            "Compiling the training step for %d length bucket%s (%d at a time)…",
            count,
            "" if count == 1 else "s",
            workers,
        )
        started = time.perf_counter()
        with futures.ThreadPoolExecutor(workers, thread_name_prefix="compile") as pool:
            pending = []
            # Largest first: the longest compiles start earliest. Lowering (tracing)
            # stays in this thread; XLA's compiles run in the pool meanwhile.
            for index in reversed(range(count)):
                source_length, target_length = buckets.shapes[index]
                lowered = run.step.step_fns.add_microbatch.lower(
                    acc,
                    trainable,
                    self.frozen,
                    bridge.shard_microbatch(micros[index], mesh),
                    self._dropout_base,  # Lowering reads its type, never its value.
                )
                what = (
                    f"the training step for length bucket {index + 1}/{count} (source "
                    f"{source_length}, target {target_length} tokens)"
                )
                pending.append(pool.submit(_compile_one, lowered, what))
            # The lot's update has one shape; compiled here, it leaves the first lot too.
            opt_state = jax.device_put(run.step.opt_state, self.replicated)  # As `place`.
            lot_state = core.TrainState(jnp.int32(0), trainable, opt_state)
            lowered = run.step.step_fns.apply_lot.lower(lot_state, acc, self._noise_base)
            pending.append(
                pool.submit(_compile_one, lowered, "the lot's update (noise once, optimizer)")
            )
            for done in pending:
                done.result()  # A compile error is raised here, in the loop's thread.
        logging.info(
            "Compiled the training step for every length bucket and the update in %.1f s.",
            time.perf_counter() - started,
        )

    def run_lot(self, state: LoopState, source) -> tuple[LoopState, jax.Array]:
        """The next lot from `source` applied to `state`.

        Returns:
          (the state after the lot, the lot's mean training loss: a device
          scalar, an un-noised statistic of the private lot).
        """
        step_fns, timer = self._run.step.step_fns, self._timer
        # On a CPU forced to several devices, one multi-device program at a time:
        # with many queued, a collective once never completed (WORKSPACE.md, CI).
        one_at_a_time = jax.default_backend() == "cpu" and self._run.step.mesh.devices.size > 1
        with timer.phase("lot preparation (waiting on the prefetcher)"):
            microbatches = next(source)  # Empty for an empty lot: still a step.
        step = state.step
        timer.start("device steps")
        # Placed like the step's output, so add_microbatch compiles once, not twice.
        acc = jax.device_put(core.init_accumulator(state.trainable), self.replicated)
        loss_sum = jnp.zeros(())
        for index, micro in enumerate(microbatches):
            key = core.dropout_key(self._dropout_base, step, index)
            acc, micro_loss = step_fns.add_microbatch(acc, state.trainable, self.frozen, micro, key)
            if one_at_a_time:
                jax.block_until_ready(acc)
            loss_sum = loss_sum + micro_loss
        # The lot's mean loss, divided on device by its (private) size.
        train_loss = loss_sum / jnp.maximum(acc.num_examples, 1)
        # At most two lots in flight: wait for the previous lot's update
        # before queueing more. Unbounded asynchronous dispatch queues every
        # lot's programs at once; on a forced multi-device CPU that is where
        # a collective once never completed (WORKSPACE.md, CI).
        jax.block_until_ready(state.trainable)
        # The core's key schedule: lot `step` is noised with
        # noise_key_for_step(noise_base, step), inside the step.
        lot_state = core.TrainState(jnp.int32(step), state.trainable, state.opt_state)
        lot_state = step_fns.apply_lot(lot_state, acc, self._noise_base)
        average = state.average
        if average is not None:  # Post-processing of the released iterate: no privacy spent.
            decay = self._run.config.train.ema_decay
            average = ema.update(average, lot_state.params, jnp.int32(step + 1), decay=decay)
            if one_at_a_time:
                jax.block_until_ready(average)
        timer.sync(lot_state.params)  # Profiling only: charge the lot's device time here.
        timer.stop()
        state = dataclasses.replace(
            state,
            step=step + 1,
            trainable=lot_state.params,
            opt_state=lot_state.opt_state,
            average=average,
        )
        return state, train_loss


def _cpu_count() -> int:
    """CPU cores this process may use (compile threads)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Not on Linux.
        return os.cpu_count() or 1


def _compile_one(lowered, what: str) -> None:
    """XLA-compiles one lowered step program, logging its start and its seconds."""
    logging.info("Compiling %s…", what)
    started = time.perf_counter()
    lowered.compile()
    logging.info("Compiled %s in %.1f s.", what, time.perf_counter() - started)
