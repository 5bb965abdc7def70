"""The tokenizer of tensor sentences as a library object: a `tokenizers` WordLevel model over the fixed
vocabulary of `space/sentence.py` (one id per word, whitespace-split: a sentence is already its tokens),
wrapped as `transformers.PreTrainedTokenizerFast`, so a Hugging Face model trains and decodes with it and
`save_pretrained` / `from_pretrained` carry it with the model.

    tok = tokenizer()
    ids = tok(" ".join(sentence))["input_ids"]     # == [sentence.token_ids()[t] for t in sentence]
    tok.save_pretrained("out/tokenizer")

Ids are the vocabulary's order, so NextTokens' `allowed_ids()` / `mask()` index the model's logits
directly. The special tokens ([PAD], [EOS], ...) and the reserved quality buckets Q0..Q3 are words of
the vocabulary like any other; nothing is added around a sentence (it carries its own [EOS]).
"""
from __future__ import annotations

from pathlib import Path


def tokenizer():
    """A PreTrainedTokenizerFast over the current sentence vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tensorlang.space import sentence as S
    core = Tokenizer(models.WordLevel(vocab=dict(S.token_ids()), unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # no decoder: decode() joins the words with spaces
    versions = " ".join(S.version_tokens())
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]",
                                   eos_token="[EOS]", sep_token="[SEP]", mask_token="[MASK]", cls_token="[CLS]",
                                   model_max_length=4096, clean_up_tokenization_spaces=False,
                                   additional_special_tokens=list(S.QUALITY), name_or_path=f"tensorlang {versions}")


def save(path: str | Path) -> Path:
    """Write the tokenizer (tokenizer.json and its config) to a directory."""
    tok = tokenizer()
    tok.save_pretrained(str(path))
    return Path(path)


def load(path: str | Path):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast.from_pretrained(str(path))
