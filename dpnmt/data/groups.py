"""Groups: the privacy unit a corpus names for each pair (a case report, a dialogue, a user).

A loaded split has a `group` column when its corpus names one: ClinSpEn-CC's
`file_name` (the clinical case report), BSD's scenario id (the dialogue), a
`files:` TSV's `group` column or JSONL's `group` key. A run whose unit is one
pair protects a group of k pairs less (group privacy): `summarize` gives the
sizes that statement needs.
"""

import collections
import dataclasses
import statistics

GROUP_COLUMN = "group"


@dataclasses.dataclass(frozen=True)
class GroupSizes:
    """How the pairs of one split fall into groups.

    Counts of a private split are private: publish them only under the rules
    (README, "Privacy rules the code keeps").

    Attributes:
      groups: distinct groups.
      smallest: pairs in the smallest group.
      median: median pairs a group.
      largest: pairs in the largest group (k of the group-privacy statement).
    """

    groups: int
    smallest: int
    median: float
    largest: int

    def describe(self) -> str:
        """One line for a person: "42 groups, pairs a group min 3 / median 21 / max 55"."""
        plural = "" if self.groups == 1 else "s"
        return (
            f"{self.groups:,d} group{plural}, pairs a group min {self.smallest:,d} / median "
            f"{self.median:g} / max {self.largest:,d}"
        )


def summarize(split) -> GroupSizes | None:
    """The group sizes of a loaded split (a `datasets.Dataset`), or None if it names no groups."""
    if GROUP_COLUMN not in split.column_names or len(split) == 0:
        return None
    sizes = list(collections.Counter(split[GROUP_COLUMN]).values())
    return GroupSizes(
        groups=len(sizes),
        smallest=min(sizes),
        median=float(statistics.median(sizes)),
        largest=max(sizes),
    )
