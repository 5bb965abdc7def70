"""Schedule policies: where a schedule comes from when none is written.

`generate(policy, mod, op, target)` returns a scheduled module, the .tsched statements that
produce it (where the policy can say), and names the policy:
- `roller`: a Roller-style constructive heuristic on the Space Builder's space (baselines/roller.py);
- `random[:SEED]`: a uniform sample of the space;
- `default`: TVM without search (DLight rules; no .tsched text);
- `metaschedule[:N]`: MetaSchedule tuning with N trials (default 64), its best trace as .tsched text;
- `tlm`: the tensor language model (baselines/tlm.py: one pass, legal by construction); `tlm:K`: K distinct
  legal candidates measured, the fastest kept; `tlm-ranked:K`: the K candidates ranked by the cost model
  (cost/), none measured; without a model checkpoint, `roller` (warning TS409);
- `auto`: the best available policy -- `tlm` where the model checkpoint exists, else `roller` (the
  language server's workers too: the model loads there once, in the background, at start).
"""
from __future__ import annotations

from dataclasses import dataclass

from tensorlang.diagnostics import Diagnostic, error

POLICIES = ("auto", "tlm", "tlm-ranked", "roller", "random", "default", "metaschedule")


@dataclass
class Generated:
    mod: object | None
    policy: str
    diagnostics: list[Diagnostic]
    schedule_text: str | None = None  # .tsched statements, one per line, where the policy can express them


# What `auto` means in this process when set (tests, or a process that wants one policy everywhere).
AUTO_POLICY: str | None = None


def auto_policy() -> str:
    """What `auto` means here: AUTO_POLICY when a process set it, else `tlm` where the shipped checkpoint exists."""
    if AUTO_POLICY:
        return AUTO_POLICY
    from tensorlang.baselines.tlm import checkpoint_missing
    return "roller" if checkpoint_missing() else "tlm"


def generate(policy: str, mod, op, target, written=()) -> Generated:
    """`written`: statements a user has written in the schedule block (the editor, `generate` on a partly
    written block): the model keeps their decisions; the other policies make their schedule as always."""
    name, _, arg = policy.partition(":")
    if name == "auto":
        name = auto_policy()
    if name == "tlm":
        from tensorlang.baselines.tlm import tlm_schedule
        return tlm_schedule(mod, op, target, int(arg) if arg else None, written=written)
    if name == "tlm-ranked":
        from tensorlang.baselines.tlm import RANKED_SAMPLES, tlm_schedule
        return tlm_schedule(mod, op, target, int(arg) if arg else RANKED_SAMPLES, written=written, ranked=True)
    if name == "default":
        from tensorlang.baselines.default import default_schedule
        return default_schedule(mod, op, target)
    if name == "metaschedule":
        from tensorlang.baselines.metaschedule import metaschedule_schedule
        return metaschedule_schedule(mod, op, target, int(arg or 64))
    if name in ("auto", "roller", "random"):
        from tensorlang.space.space import Infeasible, Space
        label = "roller" if name == "auto" else name
        try:
            space = Space(op, mod, target)
            if label == "roller":
                from tensorlang.baselines.roller import roller_point
                point = roller_point(space)
            else:
                points, _ = space.sample(1, seed=int(arg or 0))
                if not points:
                    raise Infeasible("no sample was accepted by the postprocessors")
                point = points[0]
        except (Infeasible, ValueError) as e:
            return Generated(None, label, [error("TS406", f"policy {label} found no schedule for '{op.name}': {e}",
                                                 op.ast.name_span)])
        from tensorlang.space.render import statements_text
        text = statements_text(point.stmts)
        return Generated(point.mod, label, [], text)
    return Generated(None, policy, [error("TS302", f"unknown policy '{policy}'; policies: {', '.join(POLICIES)}",
                                          op.ast.name_span)])
