"""The trainer's start-up milestones as its log states them (`benchmarks.first_lot`)."""

import re

# Log lines that mark the start-up's milestones, in order (the first match counts).
MILESTONES = (
    ("privacy plan", re.compile(r"Privacy plan:")),
    ("model ready", re.compile(r"Model ready in")),
    ("initial validation loss", re.compile(r"eval before training")),
    ("bucket phase starts", re.compile(r"Compiling the training step for \d+ length bucket")),
    ("first lot starts", re.compile(r"Compiled the training step for every length bucket")),
)
