"""Schedule policies: where a schedule comes from when none is written.

`generate(policy, mod, op, target)` returns a scheduled module and names the policy that
produced it. Policies: `default` (TVM without search: DLight rules). `auto` is the best
policy available, which the Space Builder's Roller-style heuristic and the tensor language
model will replace.
"""
from __future__ import annotations

from dataclasses import dataclass

from tensorlang.diagnostics import Diagnostic, error

POLICIES = ("auto", "default")


@dataclass
class Generated:
    mod: object | None
    policy: str
    diagnostics: list[Diagnostic]
    schedule_text: str | None = None  # .tsched statements, where the policy can express them


def generate(policy: str, mod, op, target) -> Generated:
    name = policy.split(":")[0]
    if name in ("auto", "default"):
        from tensorlang.baselines.default import default_schedule
        return default_schedule(mod, op, target)
    return Generated(None, policy, [error("TS302", f"unknown policy '{policy}'; policies: {', '.join(POLICIES)}",
                                          op.ast.name_span)])
