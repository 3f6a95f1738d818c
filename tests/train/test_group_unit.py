"""dp.unit = "group": the plan and results.json over groups, and the config's refusals."""

import json

import pytest

from dpnmt import config_lib, privacy
from dpnmt.config import RunConfig
from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.errors import ConfigError
from dpnmt.training import run_dir
from dpnmt.training.privacy_report import PrivacyReport, privacy_report
from tests.train.test_group_lot_size import epsilon_from_unit_record

VOCAB = VocabularyRecord("dp_sentencepiece", True, epsilon=0.5, delta=1e-9)


def _configs(**dp):
    config = config_lib.base_config()
    config.dp.update(dp)
    return config.dp, config.train


def _group_plan(**dp):
    dp, train = _configs(unit="group", group_cap=8, delta=1e-5, **dp)
    train.expected_lot_size, train.num_epochs = 6, 5
    return privacy.plan_privacy(dp, train, dataset_size=968, largest_group=55, num_groups=42)


def test_group_plan_accounts_over_groups_and_results_json_is_recomputable(tmp_path):
    plan = _group_plan(noise_multiplier=1.2)  # Given σ: no calibration (slow).
    assert (plan.unit, plan.num_groups, plan.group_cap) == ("group", 42, 8)
    assert plan.sampling_rate == pytest.approx(6 / 42) and plan.num_steps == round(5 * 42 / 6)
    record = privacy_report(plan, plan.num_steps, VOCAB)
    path = tmp_path / "results.json"
    run_dir.write_json(str(path), {"privacy": record.to_json()})
    loaded = json.loads(path.read_text())["privacy"]
    assert PrivacyReport.from_json(loaded) == record
    unit = loaded["privacy_unit"]
    assert (unit["unit"], unit["num_groups"], unit["group_cap"]) == ("group", 42, 8)
    independent = epsilon_from_unit_record(unit)  # dp_accounting, published numbers alone.
    assert unit["epsilon_per_group"] == pytest.approx(independent, rel=1e-6)
    assert 1.0 < independent < 100.0
    assert loaded["dp_sgd_epsilon"] == unit["epsilon_per_group"]
    assert "whole group" in loaded["adjacency"] and "groups" in loaded["bound"]
    # ε is already per group: no group-privacy conversion on top.
    assert "group_privacy" not in loaded


def test_example_plans_are_unchanged_and_carry_no_unit_record():
    dp, train = _configs(noise_multiplier=1.2)
    plan = privacy.plan_privacy(dp, train, dataset_size=968, largest_group=55, num_groups=42)
    assert plan.unit == "example" and plan.num_groups is None and plan.dataset_size == 968
    report = privacy_report(plan, plan.num_steps, VOCAB).to_json()
    assert "privacy_unit" not in report and "group_privacy" in report


@pytest.mark.parametrize(
    "dp, num_groups, message",
    [
        ({"group_cap": 8}, None, "names none; use dp.unit='example' or add the column"),
        ({}, 42, "dp.group_cap=None: dp.unit='group' needs an int k >= 1"),
        ({"group_cap": 0}, 42, "dp.group_cap=0"),
        ({"group_cap": 8, "sampling": "shuffle"}, 42, "needs dp.sampling='poisson'"),
        ({"group_cap": 8, "unit": "user"}, 42, "dp.unit='user' must be one of"),
    ],
)
def test_group_plans_refuse_what_they_lack(dp, num_groups, message):
    dp = {"unit": "group", "target_epsilon": 8.0, **dp}
    dp, train = _configs(**dp)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        privacy.plan_privacy(dp, train, dataset_size=968, num_groups=num_groups)


def test_config_accepts_group_unit_and_refuses_what_it_cannot_run():
    config = config_lib.make_config("eps5")
    config.dp.unit = "group"
    with pytest.raises(ConfigError, match="dp.group_cap=None"):
        RunConfig.parse(config)
    config.dp.group_cap = 8
    # The default vocabulary from scratch is DP-SentencePiece: its ε is per pair.
    with pytest.raises(ConfigError) as error:
        RunConfig.parse(config)
    assert "tokenizer.kind='dp_sentencepiece'" in str(error.value)
    assert "Use a public vocabulary" in str(error.value)
    config.tokenizer.kind = "sentencepiece_public"
    config.tokenizer.public_corpora = "files:public"
    assert RunConfig.parse(config).dp.unit == "group"
    for field, value, message in (
        ("data.length_buckets", "8,16", "data.length_buckets='8,16' with dp.unit='group'"),
        ("dp.clipping_chunk", 4, "dp.clipping_chunk=4 is not supported with dp.unit='group'"),
        ("dp.sampling", "shuffle", "needs dp.sampling='poisson'"),
    ):
        changed = config_lib.make_config("eps5")
        changed.update_from_flattened_dict(
            {
                "dp.unit": "group",
                "dp.group_cap": 8,
                "tokenizer.kind": "sentencepiece_public",
                "tokenizer.public_corpora": "files:public",
                field: value,
            }
        )
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            RunConfig.parse(changed)
    config.dp.unit = "user"
    with pytest.raises(ConfigError, match="dp.unit='user' is unknown"):
        RunConfig.parse(config)
    config.dp.unit = "example"
    assert RunConfig.parse(config).dp.unit == "example"


# --- training end to end -------------------------------------------------------

GROUP_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 6, 5, 4)  # 60 pairs in 12 groups; k = 4 caps 6.


def _grouped_files(folder) -> str:
    """A `files:` de-en TSV corpus whose `group` column puts 60 train pairs in 12 groups."""
    folder.mkdir()
    rows = [
        (f"Satz {g} Nummer {j} hier", f"Sentence {g} number {j} here", f"user{g}")
        for g, size in enumerate(GROUP_SIZES)
        for j in range(size)
    ]
    for split, split_rows in (("train", rows), ("validation", rows[:4]), ("test", rows[:4])):
        (folder / f"{split}.tsv").write_text(
            "de\ten\tgroup\n" + "".join(f"{a}\t{b}\t{c}\n" for a, b, c in split_rows)
        )
    return str(folder)


def _group_run_config(tmp_path, clipping: str):
    from tests.small_configs import smaller_config

    public = tmp_path / "news.txt"  # Public text for the vocabulary (not the corpus's).
    public.write_text(
        "".join(
            f"Die Zeitung schreibt {i} Dinge. The paper writes {i} things.\n" for i in range(200)
        )
    )
    c = smaller_config("eps8")
    c.noise_seed, c.testing_only_fixed_noise_seed_NO_PRIVACY = None, False  # A secret seed.
    c.data.corpus, c.data.pair = f"files:{_grouped_files(tmp_path / 'corpus')}", "de-en"
    c.data.max_train_examples = None
    c.tokenizer.kind, c.tokenizer.public_text_paths = "sentencepiece_public", (str(public),)
    c.dp.update(unit="group", group_cap=4, delta=1e-3, clipping=clipping)
    c.train.expected_lot_size = 4  # L_groups: q = 4 / 12, T = 3 lots in one epoch.
    c.train.physical_batch_size = 8
    return c


@pytest.mark.slow
@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
def test_group_unit_trains_and_results_json_reports_epsilon_per_group(tmp_path, clipping):
    from dpnmt.training import loop

    config = _group_run_config(tmp_path, clipping)
    loop.train_and_evaluate(RunConfig.of(config), str(tmp_path / "run"))
    loaded = json.loads((tmp_path / "run" / "results.json").read_text())["privacy"]
    assert loaded["steps_done"] == loaded["steps_planned"] == 3
    unit = loaded["privacy_unit"]
    assert (unit["unit"], unit["num_groups"], unit["group_cap"]) == ("group", 12, 4)
    assert unit["expected_groups_per_lot"] == 4 and unit["sampling_rate"] == pytest.approx(1 / 3)
    assert unit["delta"] == 1e-3
    assert unit["epsilon_per_group"] == pytest.approx(epsilon_from_unit_record(unit), rel=1e-6)
    # Of the private train split only N_groups is published, not its number of pairs.
    published = json.loads((tmp_path / "run" / "results.json").read_text())["preprocessing"]
    assert published["train"] == {"num_groups": 12}
    # A public vocabulary: the total is DP-SGD's ε per group.
    assert loaded["total_epsilon"] == unit["epsilon_per_group"] == loaded["dp_sgd_epsilon"]
    # The sampler's state (secret) went to private/ for an exact resume.
    private = tmp_path / "run" / "private"
    states = [json.loads(p.read_text()) for p in private.rglob("*.json") if "sampler" in p.name]
    assert any(state.get("sampling_scheme") == "poisson_groups" for state in states)


def test_group_report_names_n_groups_and_k_as_assumed_public():
    plan = _group_plan(noise_multiplier=1.2)
    public = privacy_report(plan, plan.num_steps, VOCAB).to_json()["assumed_public"]
    assert public[0].startswith("dataset_size (N = N_groups") and "group_cap (k)" in public[0]


def test_group_unit_refuses_a_pretrained_export_whose_per_pair_epsilon_composes(monkeypatch):
    from dpnmt.training import preflight, pretrained_privacy
    from dpnmt.training.privacy_report import PretrainedClaim

    config = config_lib.make_config("eps5")
    config.model.name_or_path = "/models/earlier-dp-export"
    config.dp.unit, config.dp.group_cap = "group", 4
    run = RunConfig.parse(config)

    def claim(epsilon, composed=True, parallel=False):
        return PretrainedClaim(
            True, composed, parallel, epsilon, 1e-8, "an export", parallel=parallel
        )

    for epsilon, composed, parallel, refused in (
        (3.0, True, False, True),
        (3.0, False, False, False),  # Declared disjoint, a public export: not composed.
        (3.0, False, True, True),  # Declared disjoint, a DP export: its per-pair ε, the max.
        (float("inf"), True, False, False),  # Composes to ε = ∞: reported as no guarantee.
    ):
        monkeypatch.setattr(
            pretrained_privacy,
            "pretrained_claim",
            lambda run, e=epsilon, c=composed, p=parallel: claim(e, c, p),
        )
        problems = preflight._group_pretrained_problems(run)  # noqa: SLF001
        assert bool(problems) == refused
        if refused and parallel:  # Already declared: not told to set it.
            assert "declared disjoint (model.pretrained_data_disjoint=True)" in problems[0]
            assert "the larger of its own ε=3" in problems[0] and "not per group" in problems[0]
            assert "Set model.pretrained_data_disjoint" not in problems[0]
        elif refused:
            assert "Set model.pretrained_data_disjoint=True" in problems[0]
            assert "share no group (user or document" in problems[0]
            assert "no example" not in problems[0]


def test_group_unit_refuses_validation_carved_from_train_pair_by_pair(tmp_path):
    """Carving cuts groups: some of a group's pairs would be scored unnoised in validation."""
    from dpnmt.training import pieces, preflight

    config = _group_run_config(tmp_path, "vmap")
    (tmp_path / "corpus" / "validation.tsv").unlink()
    config.data.validation_size = 5
    workdir = str(tmp_path / "run")
    with pytest.raises(ConfigError) as error:
        preflight.check_run(RunConfig.of(config), workdir, load_corpus=pieces.load_corpus)
    message = str(error.value)
    assert "dp.unit='group' with a validation split carved" in message
    assert "data.validation_size" in message and "own validation split" in message
    assert not (tmp_path / "run").exists()
    config.dp.unit = "example"  # Carving stays allowed per pair (reported as not covered).
    preflight.check_run(RunConfig.of(config), workdir, load_corpus=pieces.load_corpus)


def test_an_example_run_from_a_group_export_says_the_whole_group_must_be_removed():
    from dpnmt.training.privacy_report import PretrainedClaim, adjacency

    group_adjacency = adjacency(_group_plan(noise_multiplier=1.2))
    dp, train = _configs(delta=1e-5, noise_multiplier=1.2)
    train.expected_lot_size, train.num_epochs = 6, 1
    plan = privacy.plan_privacy(dp, train, dataset_size=968)
    export = PretrainedClaim(True, True, False, 3.0, 1e-9, "an export", None, group_adjacency)
    composition = privacy_report(plan, plan.num_steps, VOCAB, pretrained=export).composition
    assert "different neighbouring datasets" in composition
    assert "under the export's group relation it holds only if the example's whole group" in (
        composition
    )
    same = PretrainedClaim(True, True, False, 3.0, 1e-9, "an export", None, adjacency(plan))
    assert "whole group" not in privacy_report(plan, 1, VOCAB, pretrained=same).composition


def test_a_group_run_publishes_n_groups_not_the_number_of_pairs():
    from dpnmt.training.loop import published_train_counts

    assert published_train_counts(_group_plan(noise_multiplier=1.2)) == {"num_groups": 42}
    dp, train = _configs(delta=1e-5, noise_multiplier=1.2)
    train.expected_lot_size, train.num_epochs = 6, 1
    example = privacy.plan_privacy(dp, train, dataset_size=968)
    assert published_train_counts(example) == {"num_kept": 968}  # N, as before.


def test_setup_refuses_a_sampler_whose_q_is_not_the_plan_s():
    from dpnmt import bridge
    from dpnmt.training.setup import check_sampler_matches_plan

    plan = _group_plan(noise_multiplier=1.2)  # q = 6 / 42.
    groups = [f"user{i % 42}" for i in range(84)]  # Group label of each of 84 examples.
    check_sampler_matches_plan(bridge.PoissonGroupLots(groups, 6, 8, seed=1), plan)
    with pytest.raises(RuntimeError, match="differs from the privacy plan's"):
        fewer = bridge.PoissonGroupLots(groups[:41], 6, 8, seed=1)  # N_groups 41.
        check_sampler_matches_plan(fewer, plan)
