"""How an audit is run: `AuditOptions` (the run itself is described by its config)."""

import dataclasses

from dpnmt.auditing import canaries as canary_lib


@dataclasses.dataclass(frozen=True)
class AuditOptions:
    """How to audit (the run itself is described by its config).

    Attributes:
      num_canaries: M canaries, about half inserted.
      repeats: r copies of each inserted canary (1 audits the per-example claim).
      key_length: digits of each canary's source key.
      secret_length: digits of each secret (10**secret_length possible secrets).
      num_candidates: other secrets each secret is ranked against for exposure
        (all of them when at least 10**secret_length - 1).
      confidence: confidence of the ε lower bound, in (0.5, 1).
      source_template: source with one "{key}".
      target_template: target with one "{secret}".
    """

    num_canaries: int = 100
    repeats: int = 1
    key_length: int = 4
    secret_length: int = 4
    num_candidates: int = 1000
    confidence: float = 0.95
    source_template: str = canary_lib.SOURCE_TEMPLATE
    target_template: str = canary_lib.TARGET_TEMPLATE

    def __post_init__(self):
        canary_lib.check_templates(self.source_template, self.target_template)
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats} must be at least 1.")
        if self.num_candidates < 1:
            raise ValueError(f"num_candidates={self.num_candidates} must be at least 1.")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence} must be in (0.5, 1), e.g. 0.95.")
