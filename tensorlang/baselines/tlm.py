"""`tlm`: the tensor language model's schedule (lm/generate.py) in one pass -- greedy or beam search, as the
checkpoint's generation_config.json says -- constrained to the Space Builder's legal tokens, so it never fails
to be legal. `tlm:K`: up to K distinct legal candidates (the one-pass one,
then seeded samples), measured with the bench harness, the fastest kept ("TLM + K trials"). `tlm-ranked:K`: the
same K candidates and the model's greedy schedule in each sketch they miss, ranked by the cost model (cost/:
XGBoost over each scheduled loop nest's features), none built or timed; a candidate replaces the one-pass
schedule only where it is predicted clearly faster (cost.model.choose).

The default checkpoint (lm/checkpoints/default) is loaded once per process, on first use. Without one, the
policy falls back to `roller` and says why.
"""
from __future__ import annotations

from tensorlang.baselines import Generated
from tensorlang.diagnostics import error, warning


def checkpoint_missing(path=None) -> str | None:
    from tensorlang.lm import model as M
    from pathlib import Path
    p = Path(path or M.DEFAULT_DIR)
    if not p.is_dir() or not list(p.glob("*.safetensors")):
        return f"no model checkpoint at {p}"
    return None


# tlm-ranked without a count: 16 samples (~1 s to generate and rank). benchmarks/cost_ranking.py on the validation
# tasks: the kept candidate 1.13x the one-pass schedule's throughput from 16 samples and the other sketches'
# greedy schedules, 1.13x from the 16 alone, 1.10x from 8 and the other sketches (earlier runs: 1.11x and 1.17x
# from 16 alone).
RANKED_SAMPLES = 16


def tlm_schedule(mod, op, target, samples: int | None = None, seed: int = 0, written=(),
                 ranked: bool = False) -> Generated:
    """`written`: statements a user has written (any order): the schedule keeps their decisions
    (space/constraints.py); a statement outside the space is left out of the constraints and said (TS314).
    `ranked`: choose among the `samples` candidates with the cost model instead of measuring them."""
    from tensorlang.space.space import Infeasible, Space
    missing = checkpoint_missing()
    if missing:
        from tensorlang.baselines import generate
        gen = generate("roller", mod, op, target)
        gen.diagnostics = [warning("TS409", f"policy tlm: {missing}; the roller policy made this schedule",
                                   op.ast.name_span)] + list(gen.diagnostics)
        return gen
    from tensorlang.lm.generate import default_generator, fastest
    notes = []
    try:
        space = Space(op, mod, target)
        gen = default_generator()
        cons = None
        if written:
            from tensorlang.space.constraints import constraints
            cons = constraints(space, tuple(written))
            if cons.outside is not None:
                notes.append(warning("TS314", f"policy tlm: {cons.outside}; the schedule keeps the other written "
                                              f"statements' decisions", op.ast.name_span))
            if not cons.sketches:
                cons = None
        policy = f"tlm-ranked:{samples}" if ranked else f"tlm:{samples}" if samples else "tlm"
        if samples and samples > 1 and ranked:
            outs = candidates(gen, space, samples, seed=seed, constraints=cons, per_sketch=True)
            kept, why = rank_candidates(outs, space, target)
            best = outs[kept]
            notes += [warning("TS411", f"policy {policy}: {why}", op.ast.name_span)] if why else []
        elif samples and samples > 1:
            outs = gen.sample(space, samples, seed=seed, constraints=cons)
            if target.is_gpu:  # no GPU here to time them: the one-pass one
                best = outs[0]
            else:
                best, _ = fastest(outs, op, target)
                if best is None:
                    return Generated(None, f"tlm:{samples}", [error(
                        "TS406", f"policy tlm:{samples}: none of {len(outs)} candidates ran correctly", op.ast.name_span)])
        else:
            best = gen.generate(space, cons)
    except (Infeasible, ValueError) as e:
        return Generated(None, "tlm", [error("TS406", f"policy tlm found no schedule for '{op.name}': {e}",
                                             op.ast.name_span)])
    notes += untuned_cpu_note(gen.card, target, op)
    return Generated(best.point.mod, policy, notes, best.schedule_text)


def candidates(gen, space, k: int, seed: int = 0, constraints=None, per_sketch: bool = False,
               num_beams: int | None = None) -> list:
    """What tlm-ranked:K ranks: `gen.sample`'s K (the one-pass schedule first, then samples), and with
    `per_sketch` also `other_sketches`' (not with written constraints: they choose the sketches)."""
    outs = gen.sample(space, k, seed=seed, constraints=constraints, num_beams=num_beams)
    if per_sketch and constraints is None:
        outs += other_sketches(gen, space, outs, num_beams)
    return outs


def other_sketches(gen, space, outs: list, num_beams: int | None = None) -> list:
    """The model's one-pass schedule in every usable sketch that none of `outs` is in: a sketch the model gives
    little mass (a reduction's rfactor) is seldom sampled, yet may be the fast one."""
    from tensorlang.space.constraints import Constraints
    seen = {o.point.sketch for o in outs}
    return [gen.generate(space, Constraints((), {s: {}}), num_beams=num_beams) for s in space.usable if s not in seen]


def rank_candidates(outs: list, space, target) -> tuple[int, str | None]:
    """(the index of the candidate the cost model keeps, why it kept the one-pass one without asking, or None).
    GPU targets and a missing cost model keep the one-pass schedule (index 0): the cost model was trained on CPU
    measurements only."""
    if target.is_gpu:
        return 0, "the cost model knows CPU measurements only; the one-pass schedule is kept on a GPU target"
    try:
        model = cost_model()
    except (FileNotFoundError, ValueError) as e:
        return 0, f"{e}; the one-pass schedule is kept"
    from tensorlang.cost.model import choose
    return choose(model.rank(space, [o.point.mod for o in outs])), None


_COST_MODEL = None


def cost_model():
    """The shipped cost model, loaded once per process."""
    global _COST_MODEL
    if _COST_MODEL is None:
        from tensorlang.cost.model import CostModel
        _COST_MODEL = CostModel.load()
    return _COST_MODEL


_SAID: set = set()  # (model, cpu) pairs already reported in this process


def untuned_cpu_note(card: dict, target, op) -> list:
    """Once per process and CPU: a warning when the model was fine-tuned on no measurement from the target's
    CPU (its choices there are the other CPUs'; the CPU's features are in the prompt). GPU targets: the card's
    own `gpu` line says it."""
    from tensorlang.lm import model as M
    from tensorlang.machine import target_cpu
    cpus = M.tuned_cpus(card)
    if target.is_gpu or cpus is None:
        return []
    cpu = target_cpu(target.params).name
    if cpu in cpus or (M.version(card), cpu) in _SAID:
        return []
    _SAID.add((M.version(card), cpu))
    return [warning("TS410", f"policy tlm: model {M.version(card)} was fine-tuned on measurements from "
                             f"{', '.join(sorted(cpus))}, none from {cpu}: its schedules here are untuned; "
                             f"`tensorlang collect ... --model DIR` on this CPU, then `tensorlang train --stage finetune "
                             f"--init DIR`, adapt it", op.ast.name_span)]
