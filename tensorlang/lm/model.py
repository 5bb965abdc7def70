"""The tensor language model: a GPT-2 (`transformers.GPT2LMHeadModel`) built from a `GPT2Config` -- no
download -- over the tensor-sentence vocabulary, sized by name ("4x256" = 4 layers, 256 hidden).

    model = build("4x256", seed=0)
    save(model, "out/model", card={...})      # model.safetensors + config + tokenizer + model_card.{json,md}
    model, card = load("out/model")          # from_pretrained (safetensors only), eval mode, float32

Checkpoints are safetensors (never pickle), with the tokenizer and a model card beside them. torch and
transformers are imported lazily (a few seconds of their own), so importing this module is cheap.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from tensorlang.lm import decoding_rules

DEFAULT_DIR = Path(__file__).resolve().parent / "checkpoints" / "default"
CARD_JSON, CARD_MD = "model_card.json", "README.md"
N_POSITIONS = 768  # the longest v3/v4 sentence of the corpora is 515 tokens (+ the quality token)
_SIZE = re.compile(r"^(\d+)x(\d+)$")


def parse_size(size: str) -> tuple[int, int]:
    m = _SIZE.match(size.strip())
    if not m:
        raise ValueError(f"a model size is LAYERSxHIDDEN (e.g. 4x256), not {size!r}")
    layers, hidden = int(m.group(1)), int(m.group(2))
    if layers < 1 or hidden < 16 or hidden % heads_for(hidden):
        raise ValueError(f"model size {size!r}: layers >= 1 and a hidden size divisible by its heads")
    return layers, hidden


def heads_for(hidden: int) -> int:
    """64 dimensions per head from 128 hidden up; 32 below."""
    return max(1, hidden // 64) if hidden >= 128 else max(1, hidden // 32)


def config(size: str, n_positions: int = N_POSITIONS):
    from transformers import GPT2Config

    from tensorlang.space import sentence as S
    layers, hidden = parse_size(size)
    ids = S.token_ids()
    return GPT2Config(vocab_size=len(ids), n_positions=n_positions, n_embd=hidden, n_layer=layers,
                      n_head=heads_for(hidden), n_inner=4 * hidden, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=ids["[BOS]"], eos_token_id=ids["[EOS]"], pad_token_id=ids["[PAD]"],
                      tie_word_embeddings=True, use_cache=True)


def build(size: str, seed: int = 0):
    """A freshly initialised model of that size (deterministic given the seed)."""
    import torch
    from transformers import GPT2LMHeadModel
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config(size))


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save(model, path: str | Path, card: dict | None = None, dtype: str | None = None) -> Path:
    """save_pretrained as safetensors, the tokenizer and the model card beside it. `dtype` "float16" or
    "bfloat16" halves the file (the model is loaded as float32 either way)."""
    import torch

    from tensorlang.lm import tokenizer as T
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    to_save = model
    if dtype:
        import copy
        to_save = copy.deepcopy(model).to(getattr(torch, dtype))
    to_save.save_pretrained(str(path))  # transformers 5: safetensors only
    for stale in path.glob("*.bin"):  # never leave a pickle beside it
        stale.unlink()
    T.save(path)
    card = dict(card or {})
    card.setdefault("size", f"{model.config.n_layer}x{model.config.n_embd}")
    card["parameters"] = parameters(model)
    card["dtype"] = dtype or "float32"
    card["weights_sha256"] = weights_digest(path)
    write_card(path, card)
    return path


def weights_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def version(card: dict) -> str:
    """The model's name and version as a schedule's comment names it: tlm-4x256 v<stage count>+<weights>."""
    return f"tlm-{card.get('size', '?')} {card.get('version', 'v0')}+{card.get('weights_sha256', '')[:8]}"


GENERATION_CONFIG = "generation_config.json"


def generation_config(path: str | Path) -> dict:
    """A checkpoint's generation_config.json ({} where it has none): transformers' fields and this project's
    decoding rules' switches (lm/decoding_rules.py)."""
    p = Path(path) / GENERATION_CONFIG
    return json.loads(p.read_text()) if p.exists() else {}


def _write_generation_config(path: str | Path, cfg: dict) -> None:
    (Path(path) / GENERATION_CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def generation_beams(path: str | Path) -> int:
    """The checkpoint's decoding: `num_beams` of its generation_config.json (transformers' own field and file,
    written by save_pretrained); 1 (greedy) where it is not set."""
    return int(generation_config(path).get("num_beams", 1))


def generation_rule(path: str | Path, attr: str) -> bool:
    """Whether the checkpoint decodes with the decoding rule whose Generator attribute is `attr`
    (lm/decoding_rules.py: its generation_config.json switch, or the rule's default where it is not set)."""
    r = decoding_rules.rule(attr)
    return bool(generation_config(path).get(r.key, r.default))


def set_generation_beams(path: str | Path, num_beams: int) -> None:
    """Make beam search with `num_beams` beams (1: greedy) the checkpoint's decoding."""
    cfg = generation_config(path)
    if num_beams == 1:
        cfg.pop("num_beams", None)
    else:
        cfg["num_beams"] = num_beams
    _write_generation_config(path, cfg)


# the decoding a checkpoint asks for in its generation_config.json: what a model trained from it keeps
DECODING_SWITCHES = ("num_beams",) + tuple(r.key for r in decoding_rules.RULES)


def decoding_summary(path: str | Path) -> str:
    """The checkpoint's decoding in words, e.g. 'greedy, reduction guard on, vector tile off, register tile on,
    ...' (the rules in the order they apply, lm/decoding_rules.py)."""
    beams = generation_beams(path)
    return ", ".join([f"{'greedy' if beams == 1 else f'{beams} beams'}"]
                     + [f"{r.words} {'on' if generation_rule(path, r.attr) else 'off'}" for r in decoding_rules.RULES])


def copy_decoding(src: str | Path, dst: str | Path) -> None:
    """Give checkpoint `dst` the decoding switches of `src` (a model fine-tuned from `src`): save_pretrained
    writes transformers' own generation fields only, and a round of fine-tuning that silently dropped
    `parallel_outer` would be compared, and shipped, decoding differently from the model it started from."""
    switches = {k: v for k, v in generation_config(src).items() if k in DECODING_SWITCHES}
    _write_generation_config(dst, generation_config(dst) | switches)


def tuned_cpus(card: dict) -> set[str] | None:
    """The CPUs (LLVM names) whose measurements the model was fine-tuned on; None if the card does not say."""
    stages = [s for s in card.get("stages", []) if s.get("stage") == "finetune"]
    if not stages or not any("hosts" in s for s in stages):
        return None
    return {cpu for s in stages for cpu in s.get("hosts", {})}


def load(path: str | Path | None = None, device: str = "cpu"):
    """(model, card) from a checkpoint directory (default: the shipped one), in eval mode, float32."""
    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    path = Path(path or DEFAULT_DIR)
    if not (path / "model.safetensors").exists() and not list(path.glob("*.safetensors")):
        raise FileNotFoundError(f"no safetensors checkpoint in {path}")
    model = GPT2LMHeadModel.from_pretrained(str(path), use_safetensors=True, dtype=torch.float32)
    model.to(device).eval()
    return model, read_card(path)


def read_card(path: str | Path) -> dict:
    p = Path(path) / CARD_JSON
    return json.loads(p.read_text()) if p.exists() else {}


def check_sentences(card: dict, path: str | Path) -> None:
    """Refuse a checkpoint trained on sentences of another grammar, vocabulary or space version: the token
    ids still fit, but what the model learnt to write would be read as something else (grammar 4 turned
    the order of a tile's factors around). A card that does not say is let through."""
    from tensorlang.space import sentence as S
    said = card.get("vocab", "").split()[:3]
    today = S.version_tokens()[:3]
    if said and said != today:
        raise ValueError(f"the checkpoint {path} was trained on {' '.join(said)} sentences, and this tensorlang "
                         f"writes {' '.join(today)}: train one on today's (tensorlang train) or use a tensorlang of "
                         f"its version")


def write_card(path: str | Path, card: dict) -> None:
    path = Path(path)
    (path / CARD_JSON).write_text(json.dumps(card, indent=1, sort_keys=True) + "\n")
    (path / CARD_MD).write_text(card_markdown(card))


def card_markdown(card: dict) -> str:
    lines = [f"# {version(card)}: the tensor language model", ""]
    lines += [card.get("summary", "A GPT-2 over tensor sentences v2 (docs/language.md §9)."), ""]
    lines += ["| | |", "|---|---|"]
    for k in ("size", "parameters", "dtype", "vocab", "seed", "host", "quality_conditioned", "gpu"):
        if k in card:
            lines.append(f"| {k} | {card[k]} |")
    for st in card.get("stages", []):
        lines += ["", f"## Stage: {st.get('stage')}", "", "| | |", "|---|---|"]
        for k, v in st.items():
            if k != "stage":
                lines.append(f"| {k} | {json.dumps(v) if isinstance(v, (dict, list)) else v} |")
    for k in ("data", "heldout", "validation", "selection", "benchmark", "notes"):
        if k in card:
            v = card[k]
            lines += ["", f"## {k}", ""]
            if isinstance(v, list):
                lines += [f"- {x}" for x in v]
            elif isinstance(v, dict):
                lines += [f"- {a}: {json.dumps(b) if isinstance(b, (dict, list)) else b}" for a, b in v.items()]
            else:
                lines.append(str(v))
    return "\n".join(lines) + "\n"
