"""The decoding rules a checkpoint switches on: preferences of the Space Builder (space/*.py) that narrow a
decision's legal values to those the measurements favour. The Generator applies the ones on, in RULES' order,
each yielding where it would leave nothing (constraints.preferring): the register tile narrows what the vector
tile leaves, and the parallel tile what both leave.

One entry per rule names everything that refers to it: the checkpoint's switch (generation_config.json), the
Generator's attribute, the words of model.decoding_summary, benchmarks/compare_models.py's option and tags, and
the preference with its RULE -- the name a benchmark's cache of generated schedules keys them by (a rule's
module changes it with what the rule keeps). Pure data: importing this module imports no rule.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodingRule:
    attr: str  # the Generator's attribute; compare_models' option is --attr-with-dashes
    key: str  # generation_config.json's switch
    default: bool  # where a checkpoint does not set it
    words: str  # in decoding_summary: "<words> on|off"
    module: str  # tensorlang.space.<module> holds the preference and its RULE
    function: str
    tags: tuple[str, str]  # compare_models: a model's name suffix when on / off against the checkpoint's own

    def preference(self):
        """`function(space, point, decisions, sketch) -> values | None`: ConstrainedTokens' `prefer`."""
        return getattr(importlib.import_module(f"tensorlang.space.{self.module}"), self.function)

    @property
    def cache_name(self) -> str:
        return importlib.import_module(f"tensorlang.space.{self.module}").RULE


RULES: tuple[DecodingRule, ...] = (
    # no compute-at site that repeats a reduction's work where one that does not is legal: not a heuristic, on
    # unless a checkpoint says otherwise
    DecodingRule("guard", "no_repeated_reductions", True, "reduction guard", "recompute", "no_repeated_reduction",
                 ("@guard", "@noguard")),
    # a vector-width multiple as the innermost factor of a stage's last spatial loop
    DecodingRule("vector_tile", "vector_innermost", False, "vector tile", "vector_tile", "vector_innermost",
                 ("@vector", "@novector")),
    # a multi-level tile's register tile within the vector register file
    DecodingRule("register_tile", "fitting_register_tile", False, "register tile", "register_tile",
                 "fitting_register_tile", ("@registers", "@noregisters")),
    # a single-accumulator tile unrolled around its inner reduction
    DecodingRule("single_accumulator", "unrolled_single_accumulator", False, "single accumulator rule",
                 "single_accumulator", "unrolled_single_accumulator", ("@accumulator", "@noaccumulator")),
    # outer tile levels that give every core work
    DecodingRule("parallel_tile", "parallel_outer", False, "parallel tile", "parallel_tile", "parallel_outer",
                 ("@parallel", "@noparallel")),
    # an rfactor's strided partial sums at the root unless their loop unrolls
    DecodingRule("partial_sums", "unrolled_partial_sums", False, "partial sums rule", "partial_sums",
                 "unrolled_partial_sums", ("@partials", "@nopartials")),
)


def rule(attr: str) -> DecodingRule:
    """The rule whose Generator attribute is `attr`."""
    found = next((r for r in RULES if r.attr == attr), None)
    if found is None:
        raise KeyError(f"no decoding rule {attr!r}: one of {[r.attr for r in RULES]}")
    return found
