"""dpnmt.sigma_hints: the σ cache `plan_privacy` keeps, and that a bad file cannot lower σ."""

import importlib.metadata
import json
import os

import ml_collections
import numpy as np
import pytest

from dpnmt import core, privacy, sigma_hints

KEY = sigma_hints.key("poisson", 8.0, 0.01, 100, 1e-6, accountant="rdp")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPNMT_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_recorded_sigma_is_found_under_its_exact_key_only():
    assert sigma_hints.lookup(KEY) is None
    sigma_hints.record(KEY, 1.25)
    assert sigma_hints.lookup(KEY) == 1.25
    close = sigma_hints.key("poisson", 8.0, 0.010000000000000002, 100, 1e-6, accountant="rdp")
    assert close != KEY and sigma_hints.lookup(close) is None
    assert sigma_hints.key("shuffle", 8.0, 0.01, 100, 1e-6, accountant="rdp") != KEY


def test_a_number_that_is_not_an_int_or_float_gives_no_key_and_no_hint():
    for odd in [np.float32(1e-6), "1e-6", True, None]:
        assert sigma_hints.key("poisson", 8.0, 0.01, 100, odd, accountant="rdp") is None
    sigma_hints.record(None, 1.0)
    assert sigma_hints.lookup(None) is None


def test_the_key_names_the_accountant_library_version():
    assert importlib.metadata.version("dp-accounting") in json.loads(KEY)


def test_a_damaged_file_or_a_non_float_is_no_hint(cache):
    os.makedirs(os.path.dirname(sigma_hints.path()))
    nested = "[" * 100_000 + "]" * 100_000
    for text in ["{not json", "[1.0]", json.dumps({KEY: "1.25"}), json.dumps({KEY: 2}), nested]:
        with open(sigma_hints.path(), "w") as f:
            f.write(text)
        assert sigma_hints.lookup(KEY) is None
    sigma_hints.record(KEY, 1.5)  # Rewrites the damaged file.
    assert sigma_hints.lookup(KEY) == 1.5


def test_the_oldest_entries_go_beyond_the_limit(monkeypatch):
    monkeypatch.setattr(sigma_hints, "MAX_ENTRIES", 3)
    keys = [sigma_hints.key("poisson", 8.0, 0.01, t, 1e-6, accountant="rdp") for t in range(5)]
    for t, k in enumerate(keys):
        sigma_hints.record(k, float(t + 1))
    assert [sigma_hints.lookup(k) for k in keys] == [None, None, 3.0, 4.0, 5.0]


def test_an_unwritable_cache_is_ignored(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("DPNMT_CACHE_DIR", str(blocker))  # A file where the folder should be.
    sigma_hints.record(KEY, 1.0)
    assert sigma_hints.lookup(KEY) is None


def _dp(sampling):
    return ml_collections.ConfigDict(
        dict(enabled=True, target_epsilon=4.0, noise_multiplier=None, l2_clip=1.0, delta=1e-6,
             accountant="rdp", sampling=sampling, unit="example")
    )  # fmt: skip


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_plan_privacy_reuses_its_answer_and_a_tampered_hint_cannot_change_sigma(
    sampling, monkeypatch
):
    train = ml_collections.ConfigDict(dict(expected_lot_size=50, num_epochs=3))
    fresh = privacy.plan_privacy(_dp(sampling), train, 1000).noise_multiplier
    (hint_key,) = json.loads(open(sigma_hints.path()).read())
    assert sigma_hints.lookup(hint_key) == fresh
    hints = []
    name = {"poisson": "", "shuffle": "_shuffled"}[sampling]
    name = f"calibrate_noise_multiplier{name}"
    original = getattr(core, name)

    def spy(*args, **kwargs):
        hints.append(kwargs["hint"])
        return original(*args, **kwargs)

    monkeypatch.setattr(core, name, spy)
    assert privacy.plan_privacy(_dp(sampling), train, 1000).noise_multiplier == fresh
    for tampered in (fresh / 2, fresh * 2):  # Less noise would void ε; more would cost utility.
        sigma_hints.record(hint_key, tampered)
        assert privacy.plan_privacy(_dp(sampling), train, 1000).noise_multiplier == fresh
    assert hints == [fresh, fresh / 2, fresh * 2]


def test_the_suites_committed_hints_are_for_this_accountant_and_search():
    """tests/sigma_hints.json (the conftest seeds the suite's cache with it) is current.

    A stale file costs CI a full σ search per calibration, never a wrong σ: refresh
    it as WORKSPACE.md says when dp-accounting or `sigma_hints._KEY_VERSION` changes.
    """
    with open(os.path.join(os.path.dirname(__file__), sigma_hints.FILE), encoding="utf-8") as f:
        hints = json.load(f)
    assert hints, "tests/sigma_hints.json holds no hint: refresh it (WORKSPACE.md)"
    current = [sigma_hints._KEY_VERSION, importlib.metadata.version("dp-accounting")]
    stale = [k for k, sigma in hints.items() if json.loads(k)[:2] != current]
    assert not stale, f"{len(stale)} stale keys in tests/sigma_hints.json: refresh (WORKSPACE.md)"
    assert all(isinstance(sigma, float) and sigma > 0 for sigma in hints.values())
