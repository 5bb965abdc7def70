"""The tokenizer as a library object: a WordLevel model over the sentence vocabulary, wrapped as a
transformers PreTrainedTokenizerFast, saved and loaded with save_pretrained / from_pretrained."""
from tensorlang import api
from tensorlang.lm import tokenizer as T
from tensorlang.space import sentence as S
from tensorlang.space.space import Space

from conftest import ROOT


def test_ids_are_the_vocabulary_and_survive_save_and_load(tmp_path):
    doc = api.load(ROOT / "examples" / "conv2d.tsched")
    space = Space(doc.model.ops["conv2d"], doc.primfunc("conv2d"), doc.model.targets["cpu"])
    (p,), _ = space.sample(1, seed=1)
    words = S.encode(space, p)
    tok = T.tokenizer()
    ids = tok(" ".join(words))["input_ids"]
    assert ids == [S.token_ids()[w] for w in words]  # nothing added around the sentence, one id per word
    assert tok.decode(ids) == " ".join(words)
    assert len(tok) == len(S.vocabulary())
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == tuple(S.token_ids()[w] for w in
                                                                          ("[PAD]", "[EOS]", "[UNK]"))
    assert tok("Q0 Q3 no-such-word")["input_ids"] == [S.token_ids()["Q0"], S.token_ids()["Q3"], tok.unk_token_id]
    T.save(tmp_path / "tok")
    assert {"tokenizer.json", "tokenizer_config.json"} <= {f.name for f in (tmp_path / "tok").iterdir()}
    again = T.load(tmp_path / "tok")
    assert again(" ".join(words))["input_ids"] == ids and again.decode(ids) == " ".join(words)
    # NextTokens' masks index the same ids
    nt = S.NextTokens(space)
    for w in S.split(words)[1]:
        assert tok.convert_tokens_to_ids(w) in nt.allowed_ids()
        nt.push(w)
