"""`tensorlang train`: the tensor language model, trained in stages with `transformers.Trainer`.

    tensorlang train --stage pretrain --size 4x256 --max-tokens 2000000 --minutes 15 -o runs/4x256/pretrain
    tensorlang train --stage finetune --init runs/4x256/pretrain --minutes 5 -o runs/4x256/finetune

1. pretrain: the sampled sentences (data/pretrain/*), loss on the decisions (data.decision_mask);
2. finetune: every correct measured record (data/measured/*), prefixed by its quality token;
3. --iterate R: rounds of the model's own candidates measured, then fine-tuned on (lm/iterate.py):

    tensorlang train --iterate 2 --init runs/4x256/finetune -o runs/4x256/iterate --collect-minutes 20

Held-out tasks (data/split.json) never reach fine-tuning: `train` refuses records of them. The validation
tasks (data.is_validation) are kept out of both stages; each stage ends with its validation loss.

The whole run holds the machine-wide measurement lock (no kernel is timed beside it; the background
collector waits). Trainer checkpoints go to OUT/checkpoints (`--resume` continues from the last one); the
final model is OUT itself (safetensors, tokenizer, model card). Deterministic given `--seed`; the same code
on CPU and CUDA.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from tensorlang.lm import data as D
from tensorlang.lm import model as M


def _trainer_class():
    from transformers import Trainer

    class TLMTrainer(Trainer):
        """Trainer whose logs (the progress bar's lines) carry tokens/s."""

        def log(self, logs, start_time=None):
            seen = getattr(self.state, "num_input_tokens_seen", 0) or 0
            if self._tlm_t0 is not None and "loss" in logs:
                dt = time.monotonic() - self._tlm_t0
                if dt > 0:
                    logs["tokens_per_s"] = round((seen - self._tlm_seen0) / dt, 1)
                logs["tokens_seen"] = int(seen)
            super().log(logs, start_time)

    return TLMTrainer


def _callbacks(deadline: float | None):
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self, trainer_ref):
            self.ref = trainer_ref

        def on_train_begin(self, args, state, control, **kw):
            t = self.ref[0]
            t._tlm_t0, t._tlm_seen0 = time.monotonic(), getattr(state, "num_input_tokens_seen", 0) or 0

        def on_step_end(self, args, state, control, **kw):
            if deadline is not None and time.time() > deadline:
                control.should_training_stop = True
                control.should_save = True
            return control

    return Clock


def train(stage: str, out: str | Path, *, size: str = "4x256", init: str | Path | None = None,
          max_tokens: int | None = None, minutes: float | None = None, resume: bool = False, seed: int = 0,
          batch_size: int = 16, lr: float | None = None, epochs: float | None = None,
          pretrain_dirs=D.DEFAULT_PRETRAIN, measured_dirs=D.DEFAULT_MEASURED, split_path="data/split.json",
          exclude_heldout_pretrain: bool = False, validation_cap: int = 400, save_steps: int = 200,
          logging_steps: int = 10, dtype: str | None = None, lock: bool = True, best_only: bool = False,
          best_within: float = 1.0, best_top: int = 1, min_records: int = 0, host_cpus=None, eval_steps: int = 0,
          decoding_from: str | Path | None = None, log=print) -> dict:
    """Run one stage; returns its entry of the model card (also written to OUT).
    `best_only` (finetune): the best record per task and machine alone, without quality tokens -- the
    OSDI'24 recipe, for the ablation against quality conditioning. `min_records` (with `best_only`): the
    tasks measured fewer times than that on a machine are left out (data.best_records). `host_cpus`
    (finetune): only the records timed on these CPUs (LLVM names) -- e.g. a model that has seen no measurement
    of this machine's CPU, to show what adapting it to a new CPU gains. `eval_steps`: the validation loss every
    that many steps too (the card's `validation_curve`), not only at the end -- how many epochs a recipe wants. `decoding_from`: the checkpoint
    whose decoding switches (generation_config.json: beams, the reduction guard, vector, register and parallel tiles,
    the partial-sums rule) the result decodes with; default `init`'s. A fine-tune of a fresh pre-training would
    otherwise decode with none of the shipped model's switches, and a comparison of the two would measure the
    switches, not the weights."""
    if stage not in ("pretrain", "finetune"):
        raise ValueError(f"stage is pretrain or finetune, not {stage!r}")
    if init is not None:  # before the corpus is built: a refused checkpoint costs nothing
        M.check_sentences(M.read_card(init), init)
    if decoding_from is not None and not Path(decoding_from, M.GENERATION_CONFIG).exists():
        raise ValueError(f"--decoding-from {decoding_from}: no {M.GENERATION_CONFIG} there")
    decoding_from = decoding_from if decoding_from is not None else init
    import torch
    from transformers import TrainingArguments, set_seed
    from transformers.trainer_utils import get_last_checkpoint

    out = Path(out)
    heldout = D.HeldOut.load(split_path)
    set_seed(seed)
    if stage == "pretrain":
        records = D.pretrain_records(pretrain_dirs)
        corpus = D.build(records, False, heldout, max_tokens=max_tokens, seed=seed, validation_cap=validation_cap,
                         include_heldout=not exclude_heldout_pretrain)
        sources = list(map(str, pretrain_dirs))
    else:
        records = D.measured_records(measured_dirs)
        D.refuse_heldout(records, heldout, f"train --stage finetune ({', '.join(map(str, measured_dirs))})")
        if host_cpus:
            cpus = set(host_cpus)
            records = [r for r in records if (r.get("host") or {}).get("cpu") in cpus]
        if best_only:
            records = D.best_records(records, best_within, best_top, min_records)
        corpus = D.build(records, not best_only, heldout, max_tokens=max_tokens, seed=seed,
                         validation_cap=validation_cap)
        sources = list(map(str, measured_dirs))
    if not corpus.train:
        raise ValueError(f"{stage}: no training examples in {', '.join(sources)}")
    log(f"{stage}: {corpus.stats['train_examples']} sentences ({corpus.stats['train_tokens']:,} tokens, "
        f"{corpus.stats['train_label_tokens']:,} with loss) of {corpus.stats['train_tasks']} tasks; validation "
        f"{corpus.stats['validation_examples']} sentences of {corpus.stats['validation_tasks']} tasks", file=sys.stderr)

    card: dict = {}
    if init is not None:
        model, card = M.load(init)
        model.train()
        size = card.get("size", f"{model.config.n_layer}x{model.config.n_embd}")
    else:
        if stage == "finetune":
            raise ValueError("finetune starts from a pre-trained model: --init DIR")
        model = M.build(size, seed)
    cuda = torch.cuda.is_available()
    epochs = epochs if epochs is not None else (1.0 if stage == "pretrain" else 4.0)
    lr = lr if lr is not None else (1e-3 if stage == "pretrain" else 3e-4)
    steps = max(1, math.ceil(len(corpus.train) / batch_size * epochs))
    ckpt_dir = out / "checkpoints"
    args = TrainingArguments(
        output_dir=str(ckpt_dir), per_device_train_batch_size=batch_size, per_device_eval_batch_size=batch_size,
        max_steps=steps, learning_rate=lr, weight_decay=0.01, warmup_steps=max(1, steps // 20),
        lr_scheduler_type="cosine", logging_steps=logging_steps, save_strategy="steps", save_steps=save_steps,
        save_total_limit=2, seed=seed, data_seed=seed, report_to=[], dataloader_num_workers=0,
        remove_unused_columns=False, use_cpu=not cuda, include_num_input_tokens_seen="non_padding", train_sampling_strategy="group_by_length", disable_tqdm=False,
        eval_strategy="steps" if eval_steps and corpus.validation else "no", eval_steps=eval_steps or None,
        max_grad_norm=1.0)
    ref: list = []
    trainer = _trainer_class()(model=model, args=args, data_collator=D.collate, train_dataset=D.Examples(corpus.train),
                               eval_dataset=D.Examples(corpus.validation) if eval_steps and corpus.validation else None,
                               callbacks=[_callbacks(time.time() + minutes * 60 if minutes else None)(ref)])
    trainer._tlm_t0, trainer._tlm_seen0 = None, 0
    ref.append(trainer)
    last = get_last_checkpoint(str(ckpt_dir)) if resume and ckpt_dir.exists() else None
    if resume and last is None:
        log(f"{stage}: no checkpoint in {ckpt_dir}; starting afresh", file=sys.stderr)

    from tensorlang.bench.lock import measure_lock
    import contextlib
    with (measure_lock() if lock else contextlib.nullcontext()) as held:
        if held is not None and held.wait_s > 1:
            log(f"{stage}: waited {held.wait_s:.0f} s for the measurement lock", file=sys.stderr)
        t0 = time.time()
        result = trainer.train(resume_from_checkpoint=last)
        train_s = time.time() - t0
        curve = [[h["step"], round(h["eval_loss"], 4)] for h in trainer.state.log_history if "eval_loss" in h]
        val_loss = None
        if corpus.validation:
            val_loss = trainer.evaluate(eval_dataset=D.Examples(corpus.validation))["eval_loss"]
        # the other stage's validation loss too, where it exists: how much pre-training is kept / fine-tuning adds
        other = {}
        try:
            if stage == "finetune":
                pv = D.build(D.pretrain_records(pretrain_dirs), False, heldout, seed=seed, validation_cap=validation_cap,
                             max_tokens=0)
                if pv.validation:
                    other["validation_loss_pretrain_sentences"] = trainer.evaluate(
                        eval_dataset=D.Examples(pv.validation))["eval_loss"]
        except Exception as e:  # reported, never fatal
            other["validation_loss_pretrain_sentences_error"] = str(e)[:200]
    state = trainer.state
    seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
    entry = {"stage": stage, "data": sources, **{k: v for k, v in corpus.stats.items()}, "steps": state.global_step,
             "planned_steps": steps, "epochs_planned": epochs, "batch_size": batch_size, "lr": lr,
             "tokens_seen": seen, "train_seconds": round(train_s, 1),
             "tokens_per_s": round(seen / train_s, 1) if train_s > 0 and not last else None,
             "train_loss": round(float(result.training_loss), 4), "validation_loss": None if val_loss is None
             else round(float(val_loss), 4), "seed": seed, "device": "cuda" if cuda else "cpu",
             "resumed_from": str(last) if last else None, "stopped_by_time": state.global_step < steps,
             **({"best_only": True} if best_only else {}),
             **({"best_within": best_within} if best_only and best_within > 1.0 else {}),
             **({"best_top": best_top} if best_only and best_top > 1 else {}),
             **({"min_records": min_records} if best_only and min_records > 1 else {}),
             **({"host_cpus_only": sorted(host_cpus)} if host_cpus and stage == "finetune" else {}),
             **({"validation_curve": curve} if eval_steps else {}),
             **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in other.items()}}
    if stage == "pretrain":
        entry["heldout_tasks_unmeasured_samples"] = ("excluded" if exclude_heldout_pretrain else
                                                     f"included ({corpus.stats['heldout_tasks_in_training']} held-out "
                                                     f"tasks' unmeasured samples; no measurement of them)")
    # every stage run is kept, in order: pre-training continued from a checkpoint, fine-tuning rounds
    stages = list(card.get("stages", [])) + [entry]
    if init is not None:
        # the checkpoint started from: its figures (benchmark, selection) described it, not this one
        entry["init"] = M.version(card) if card else str(init)
        for k in ("benchmark", "selection"):
            card.pop(k, None)
        if card.get("summary"):
            card["summary"] = (f"{card['summary']} Then {stage} from {entry['init']}: {entry.get('train_examples', 0):,} "
                               f"examples of {entry.get('train_tasks', 0)} tasks, {epochs} epochs, lr {lr}.")
    from tensorlang.space import sentence as S
    conditioned = any(s["stage"] == "finetune" and not s.get("best_only") for s in stages)
    card.update({"size": size, "seed": seed, "stages": stages, "version": f"v{len(stages)}",
                 "vocab": " ".join(S.version_tokens()), "host": _trained_on(cuda),
                 "quality_conditioned": conditioned,
                 "generation_quality_token": D.TOP_QUALITY if conditioned else None,
                 "quality_buckets": {f"Q{i}": f"<= {b}x the best known for the task on that machine"
                                     for i, b in enumerate(D.QUALITY_BOUNDS)} | {"Q3": "slower"},
                 "gpu": "untuned for GPUs: no GPU measurement was in fine-tuning; CUDA generation is constrained "
                        "(legal) but its choices are only the pre-training distribution's"})
    if decoding_from is not None and decoding_from != init:
        entry["decoding_from"] = str(decoding_from)
    M.save(trainer.model, out, card, dtype=dtype)
    if decoding_from is not None:
        M.copy_decoding(decoding_from, out)
    log(f"{stage}: {state.global_step} steps, {seen:,} tokens seen in {train_s:.0f} s; train loss "
        f"{entry['train_loss']}, validation loss {entry['validation_loss']}; model in {out}, decoding with "
        f"{M.decoding_summary(out)}", file=sys.stderr)
    return entry


def _trained_on(cuda: bool) -> str:
    """What the model card says the stage ran on: the GPU where it ran on one (a lent GPU machine has no
    TVM, whose LLVM names CPUs), else the host CPU as LLVM names it."""
    if cuda:
        import torch
        return f"{torch.cuda.get_device_name(0)} (cuda)"
    from tensorlang import machine
    try:
        return f"{machine.host().name} ({machine.host().cores} cores)"
    except ImportError:  # no TVM (no LLVM to name the CPU): the CPU's own name
        return f"{machine._model_name()} ({machine.usable_cores()} cores)"


def _stage_options(args) -> dict:
    """The options a stage's train() takes from the command line -- the same for `--stage` and for each
    round of `--iterate`."""
    return dict(seed=args.seed, batch_size=args.batch_size, lr=args.lr, split_path=args.split, dtype=args.dtype,
                measured_dirs=args.measured or D.DEFAULT_MEASURED, best_only=args.best_only,
                best_within=args.best_within, best_top=args.best_top, min_records=args.min_records,
                host_cpus=args.host_cpu,
                eval_steps=args.eval_steps, decoding_from=args.decoding_from, log=lambda *a, **k: print(*a, **k))


def main_train(args) -> int:
    from tensorlang.lm.data import HeldOutRefused
    if (args.stage is None) == (args.iterate is None):
        print("tensorlang train: error: one of --stage pretrain|finetune or --iterate R", file=sys.stderr)
        return 2
    if args.iterate is not None:
        if not args.init:
            print("tensorlang train: error: --iterate starts from a model: --init DIR", file=sys.stderr)
            return 2
        from tensorlang.lm.iterate import DEFAULT_TASKS, iterate
        try:
            iterate(args.iterate, args.init, args.output, tasks=args.tasks or DEFAULT_TASKS, target=args.target,
                    measured_out=args.collect_into, samples=args.samples, collect_minutes=args.collect_minutes,
                    minutes=args.minutes, epochs=args.epochs if args.epochs is not None else 2.0,
                    **_stage_options(args))
        except (HeldOutRefused, ValueError) as e:
            print(f"tensorlang train: error: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        train(args.stage, args.output, size=args.size, init=args.init, max_tokens=args.max_tokens,
              minutes=args.minutes, resume=args.resume, epochs=args.epochs,
              pretrain_dirs=args.pretrain or D.DEFAULT_PRETRAIN, exclude_heldout_pretrain=args.exclude_heldout,
              **_stage_options(args))
    except HeldOutRefused as e:
        print(f"tensorlang train: error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"tensorlang train: error: {e}", file=sys.stderr)
        return 2
    return 0


def add_arguments(p) -> None:
    p.add_argument("--stage", choices=("pretrain", "finetune"))
    p.add_argument("--iterate", type=int, metavar="R",
                   help="R rounds from --init: the model's candidates per training task measured (collect), then "
                        "fine-tuned on all measurements; each round's result in OUT/iterate.json")
    p.add_argument("--size", default="4x256", help="LAYERSxHIDDEN (default 4x256)")
    p.add_argument("--init", help="start from this checkpoint (required for finetune)")
    p.add_argument("--max-tokens", type=int, default=None, help="cap the stage's training sentences at N tokens")
    p.add_argument("--minutes", type=float, default=None, help="stop (and save) after M minutes")
    p.add_argument("--decoding-from", metavar="DIR",
                   help="decode like this checkpoint (its generation_config.json's switches: beams, reduction "
                        "guard, vector, register and parallel tiles, partial-sums rule); default: --init's. E.g. a fine-tune of "
                        "a fresh pre-training that will be compared with, or replace, the shipped model")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in OUT/checkpoints")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--epochs", type=float, default=None, help="passes over the stage's sentences (1 / 4)")
    p.add_argument("--pretrain", action="append", help="pre-training dataset dirs (default data/pretrain/*)")
    p.add_argument("--measured", action="append", help="measured dataset dirs (default data/measured/*)")
    p.add_argument("--host-cpu", action="append", metavar="CPU",
                   help="finetune: only the records timed on this CPU (LLVM name, e.g. znver4; repeatable)")
    p.add_argument("--split", default="data/split.json", help="the held-out split")
    p.add_argument("--exclude-heldout", action="store_true",
                   help="also keep the held-out tasks' unmeasured samples out of pre-training")
    p.add_argument("--dtype", choices=("float16", "bfloat16"), help="save the weights in half precision")
    p.add_argument("--best-only", action="store_true",
                   help="finetune on the best record per task alone, no quality tokens (the OSDI'24 recipe)")
    p.add_argument("--best-within", type=float, default=1.0, metavar="R",
                   help="--best-only: every schedule within R x the task's best (e.g. 1.05), not the best alone")
    p.add_argument("--eval-steps", type=int, default=0, metavar="N",
                   help="the validation loss every N steps too (the card's validation_curve), not only at the end")
    p.add_argument("--best-top", type=int, default=1, metavar="K",
                   help="--best-only: the K fastest distinct schedules of each task and machine, not the best alone")
    p.add_argument("--min-records", type=int, default=0, metavar="N",
                   help="--best-only: leave out the tasks measured fewer than N times on a machine (their best "
                        "is not known yet)")
    p.add_argument("--tasks", action="append", help="--iterate: the tasks' .tsched files or dirs "
                   "(default data/workloads, data/workloads-variants, examples)")
    p.add_argument("--target", default="llvm", help="--iterate: the target measured (default llvm)")
    p.add_argument("--samples", type=int, default=8, help="--iterate: the model's candidates per task (default 8)")
    p.add_argument("--collect-minutes", type=float, default=None, help="--iterate: each round's measuring budget")
    p.add_argument("--collect-into", default="data/measured/llvm", help="--iterate: where the measurements go")
    p.add_argument("-o", "--output", required=True)
