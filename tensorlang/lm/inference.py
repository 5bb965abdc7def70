"""GPT-2's forward pass for inference, in torch alone: the Generator's engine where start-up time counts.

The model is `transformers.GPT2LMHeadModel` (lm/model.py): trained, saved and loaded as such. To run it,
though, a cold `tensorlang lower` spent more time importing transformers than on everything else it does:
`from transformers import GPT2LMHeadModel` takes 2.5-5 s on these 2 cores (its lazy-import scan of the
package, torch.distributed.tensor, torch._dynamo), while torch itself is already imported by TVM's FFI.
This module reads the same checkpoint (config.json + model.safetensors, written by `save_pretrained`) and
computes the same function with the same torch calls (addmm for Conv1D, layer_norm, tanh-GELU,
scaled_dot_product_attention), so the two agree to float rounding -- tests/test_lm.py checks logits and
generated schedules against GPT2LMHeadModel. Nothing here trains; the Trainer uses transformers.

    dec = GPT2Decoder.from_pretrained("tensorlang/lm/checkpoints/default")
    logits, cache = dec(torch.tensor([ids]))             # prefill: logits [batch, len, vocab]
    logits, cache = dec(torch.tensor([[next_id]]), cache)  # one step on the KV cache
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# the GPT2Config fields this forward implements; a checkpoint that sets another value is refused
_SUPPORTED = {"activation_function": "gelu_new", "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
              "reorder_and_upcast_attn": False, "add_cross_attention": False, "tie_word_embeddings": True}


@dataclass
class KVCache:
    """Keys and values of every layer, each [batch, heads, positions, head_dim]."""
    layers: list

    def get_seq_length(self) -> int:
        return self.layers[0][0].shape[2] if self.layers else 0

    def batch_repeat_interleave(self, n: int) -> None:
        """Each batch row repeated n times (as transformers' Cache does), for a batched look-ahead."""
        self.layers = [(k.repeat_interleave(n, dim=0), v.repeat_interleave(n, dim=0)) for k, v in self.layers]

    def batch_select_indices(self, indices) -> None:
        """Only these batch rows kept (as transformers' Cache does): the rows of a batch still decoding."""
        self.layers = [(k[indices], v[indices]) for k, v in self.layers]


class GPT2Decoder:
    """GPT2LMHeadModel's forward (eval mode, no dropout) over a checkpoint's tensors."""

    def __init__(self, config: dict, tensors: dict, device: str = "cpu"):
        wrong = {k: config.get(k, v) for k, v in _SUPPORTED.items() if config.get(k, v) != v}
        if wrong:
            raise ValueError(f"GPT2Decoder does not implement {wrong}")
        self.config = config
        self.n_layer, self.n_embd, self.n_head = config["n_layer"], config["n_embd"], config["n_head"]
        self.eps = config.get("layer_norm_epsilon", 1e-5)
        self.device = device
        t = {k.removeprefix("transformer."): v.to(device) for k, v in tensors.items()}
        self.wte, self.wpe = t["wte.weight"], t["wpe.weight"]
        self.ln_f = (t["ln_f.weight"], t["ln_f.bias"])
        self.blocks = [{name: t[f"h.{i}.{name}"] for name in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
            "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
            "mlp.c_proj.weight", "mlp.c_proj.bias")} for i in range(self.n_layer)]

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu") -> "GPT2Decoder":
        from safetensors.torch import load_file
        path = Path(path)
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no safetensors checkpoint in {path}")
        tensors = {}
        for f in files:
            tensors.update(load_file(str(f)))
        tensors = {k: v.float() for k, v in tensors.items()}  # a float16 checkpoint runs as float32
        return cls(json.loads((path / "config.json").read_text()), tensors, device)

    def __call__(self, input_ids, cache: KVCache | None = None, attention_mask=None, position_ids=None):
        """(logits [batch, len, vocab], the cache extended by these positions). Every position attends to
        the cached ones and to those before it. Rows of different lengths (a batch of samples, each its own
        number of forced tokens a step) come padded, as transformers takes them: `attention_mask` [batch,
        cached + len] says which positions are real (a padded one is never attended to) and `position_ids`
        [batch, len] each row's own positions; without them every position is real and rows share positions."""
        import torch
        import torch.nn.functional as F
        with torch.inference_mode():
            b, n = input_ids.shape
            past = cache.get_seq_length() if cache is not None else 0
            if position_ids is None:
                pos = torch.arange(past, past + n, device=self.device)
                h = self.wte[input_ids] + self.wpe[pos].unsqueeze(0)
            else:
                h = self.wte[input_ids] + self.wpe[position_ids]
            mask = None  # n == 1: the one query sees everything; no past: plain causal
            if attention_mask is not None or (n > 1 and past):
                mask = torch.ones(n, past + n, dtype=torch.bool, device=self.device).tril(past)
                if attention_mask is not None:  # [b, 1, n, past + n]: real keys, causal among the new ones
                    mask = attention_mask.bool()[:, None, None, :] & mask
            layers = []
            d = self.n_embd // self.n_head
            for i, w in enumerate(self.blocks):
                a = F.layer_norm(h, (self.n_embd,), w["ln_1.weight"], w["ln_1.bias"], self.eps)
                qkv = _conv1d(a, w["attn.c_attn.weight"], w["attn.c_attn.bias"])
                q, k, v = (x.view(b, n, self.n_head, d).transpose(1, 2) for x in qkv.split(self.n_embd, dim=2))
                if cache is not None:
                    k = torch.cat([cache.layers[i][0], k], dim=2)
                    v = torch.cat([cache.layers[i][1], v], dim=2)
                layers.append((k, v))
                att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=d ** -0.5,
                                                     is_causal=mask is None and n > 1 and not past)
                att = att.transpose(1, 2).reshape(b, n, self.n_embd)
                h = h + _conv1d(att, w["attn.c_proj.weight"], w["attn.c_proj.bias"])
                m = F.layer_norm(h, (self.n_embd,), w["ln_2.weight"], w["ln_2.bias"], self.eps)
                m = _gelu_new(_conv1d(m, w["mlp.c_fc.weight"], w["mlp.c_fc.bias"]))
                h = h + _conv1d(m, w["mlp.c_proj.weight"], w["mlp.c_proj.bias"])
            h = F.layer_norm(h, (self.n_embd,), self.ln_f[0], self.ln_f[1], self.eps)
            return F.linear(h, self.wte), KVCache(layers)


def _conv1d(x, weight, bias):
    """transformers' Conv1D: x @ weight + bias, weight stored [in, out]."""
    import torch
    return torch.addmm(bias, x.reshape(-1, x.size(-1)), weight).view(*x.shape[:-1], weight.size(1))


def _gelu_new(x):
    """GPT-2's tanh approximation of GELU ("gelu_new"), written as transformers writes it."""
    import torch
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
