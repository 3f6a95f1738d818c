"""Does DP span-corruption pre-training on in-domain text help DP fine-tuning? (issue 32, item 4)

The question at equal total ε: a person's private in-domain data are either a
sentence pair (parallel, half A) or a text (monolingual, half B), never both.
Multi30K de-en's train split (29,000 captions, treated AS IF private) is cut
into two disjoint halves by
`PYTHONPATH=. python docs/results/span_then_translate/make_files.py --out=$DPNMT_DATA_DIR`
(A: `files:multi30k_half_a`, 14,501 pairs; B: `files:multi30k_half_b`, 14,499;
no normalised sentence in both; validation and test: Multi30K's own, public).

Variants (a stage, then a privacy variant, eps8 by default):
  * `translate` (a, default): the public model (configs/public_de_en.py's export,
    T5 v1.0 3+3, d_model 256, its public 8k vocabulary) DP fine-tuned on A.
  * `span` (b, stage 1): the public model DP pre-trained with T5 span corruption
    on B's German side; the public tokenizer has no sentinels, so
    `tokenizer.sentinels = 16` appends them and grows the embedding by 16 public
    rows (docs/data.md, "Sentinels for a pretrained model without them").
  * `span_translate` (b, stage 2): stage 1's export DP fine-tuned on A, exactly
    as (a) but for the starting point.
  * `prefix` and `prefix_translate` (c): the same with prefix LM (no sentinels).

Why German (the source side), for both objectives: span corruption's input is
the whole text (the encoder reads all of it) and its target only the masked
spans, so what it trains is mostly the encoder, which reads German in the
translation task; prefix LM on the same side keeps the language fixed, so (b)
against (c) changes the objective alone. `--config.data.objective_language=en`
trains on B's English side instead (the decoder's language).

Privacy: every stage is DP at ε = 8 (δ = 1e-8) with configs/multi30k_from_public.py's
recipe functions (L = 1,024, 20 epochs, lr 1e-3, C = 1, Poisson lots; not tuned
for pre-training). Stage 2 declares stage 1's data disjoint
(`model.pretrained_data_disjoint=True`): parallel composition, total
ε = max(8, 8) = 8 for (b) and (c) as for (a) (docs/fine_tuning.md). The
guarantee is for halves A and B as given datasets: a person with data in
both halves is covered by neither declaration. What dpnmt checks of the
declaration, before training: the corpus folder stage 1's export records
(the same `files:` folder as A is refused), and, when that recorded folder
is found here (as named, or under $DPNMT_DATA_DIR), a text overlap check:
refused when its train text holds more than 1% of the normalised sentences of
>= 20 characters of one side of A (10 for CJK). Nothing
else (paraphrases, short sentences, the same person's other sentences) is
checked: the rest is the make script's split and the user's word. The public
model's data are public and disjoint too (declared as in multi30k_from_public).

    python -m dpnmt.train --config=configs/span_then_translate.py:translate --workdir=runs/stt_a
    python -m dpnmt.train --config=configs/span_then_translate.py:span --workdir=runs/stt_span
    python -m dpnmt.export --workdir=runs/stt_span --out=runs/exported/span_then_translate_span
    python -m dpnmt.train --config=configs/span_then_translate.py:span_translate \\
        --workdir=runs/stt_b

Model paths are relative to where the command runs (`--config.model.name_or_path`
gives another). Compare the test BLEU of (a) and (b) (and (c)); all at ε = 8.
"""

from dpnmt import config_lib

from_public = config_lib.sibling_config(__file__, "multi30k_from_public")
multi30k = config_lib.sibling_config(__file__, "multi30k")

PUBLIC_STAGE = from_public.PUBLIC_STAGE  # The public model every chain starts from.
PUBLIC_MODEL = from_public.PUBLIC_MODEL
HALF_A = "files:multi30k_half_a"  # Private parallel data (fine-tuning).
HALF_B = "files:multi30k_half_b"  # Private monolingual text (its German side).
TEXT_LANGUAGE = "de"
SENTINELS = 16  # Appended to the public tokenizer (a 47-token text needs 2).
OBJECTIVES = {"span": "span_corruption", "prefix": "prefix_lm"}
STAGES = ("translate", "span", "prefix", "span_translate", "prefix_translate")


def pretrained_export(objective: str) -> str:
    """Where stage 1's export is expected (`python -m dpnmt.export --out=...`)."""
    return f"runs/exported/span_then_translate_{objective}"


def _customize(c, stage: str) -> None:
    multi30k.data_and_model(c)  # Lengths 48, eval sizes; the public model replaces the model.
    c.data.length_buckets = "16,24,32,48"
    objective = stage.removesuffix("_translate")
    if stage in OBJECTIVES:  # Stage 1: pre-training on B's German side.
        from_public.from_public_model(c, PUBLIC_MODEL)
        c.data.corpus = HALF_B
        c.data.objective = OBJECTIVES[stage]
        c.data.objective_language = TEXT_LANGUAGE
        if stage == "span":
            c.tokenizer.sentinels = SENTINELS
        return
    start = PUBLIC_MODEL if stage == "translate" else pretrained_export(objective)
    from_public.from_public_model(c, start)  # Declared disjoint: B (or public data), not A.
    c.data.corpus = HALF_A


def get_config(arg=None):
    stage, rest = config_lib.one_variant(arg, STAGES, "translate", "stage")
    if stage in OBJECTIVES and "lora" in rest.split(","):
        raise ValueError("Variant lora with a pre-training stage: its sentinel rows must train.")
    config = from_public.make(rest, lambda c, extras: _customize(c, stage), scratch_ok=False)
    config.variant = arg or ""
    return config
