"""The models workloads are extracted from: built from `transformers` configs with random weights.

Nothing is downloaded. Each model comes in its real size and in a `small` variant (tiny widths,
few layers, short sequences) that keeps the same kinds of operators, for fast tests.

    spec = build("bert-base", batch=1, seq=128)   # -> ModelSpec(module, example_inputs, config, ...)
"""
from __future__ import annotations

from dataclasses import dataclass, field

MODELS = ("resnet50", "mobilenetv2", "efficientnet-b0", "bert-base", "gpt2", "llama7b-layer", "tinyllama-layer",
          "qwen2-0.5b-layer", "regnety-400mf")
VISION = ("resnet50", "mobilenetv2", "efficientnet-b0", "regnety-400mf")

DEFAULT_SEQ = 128
DEFAULT_IMAGE = 224
SMALL_SEQ = 16
SMALL_IMAGE = 32


@dataclass
class ModelSpec:
    name: str
    module: object  # torch.nn.Module, in eval mode
    inputs: tuple  # example inputs for torch.export
    config: dict  # what the manifest records: the config class, its non-default settings, shapes
    description: str = ""
    notes: list[str] = field(default_factory=list)


def _config_record(cfg, keys, **extra) -> dict:
    out = {"class": type(cfg).__name__}
    for k in keys:
        v = getattr(cfg, k, None)
        out[k] = v if isinstance(v, (int, float, str, bool, type(None))) else list(v) if isinstance(v, (list, tuple)) else str(v)
    out.update(extra)
    return out


def build(name: str, batch: int = 1, seq: int | None = None, small: bool = False, image: int | None = None) -> ModelSpec:
    """The torch module and example inputs of model `name` (one of MODELS)."""
    import torch
    import transformers as tf

    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; models: {', '.join(MODELS)}")
    torch.manual_seed(0)
    if name in VISION:
        size = image or (SMALL_IMAGE if small else DEFAULT_IMAGE)
        x = torch.randn(batch, 3, size, size)
        if name == "resnet50":
            cfg = (tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=10)
                   if small else tf.ResNetConfig(num_labels=1000))
            model = tf.ResNetForImageClassification(cfg)
            keys = ["embedding_size", "hidden_sizes", "depths", "layer_type", "num_labels"]
        elif name == "mobilenetv2":
            cfg = tf.MobileNetV2Config(tf_padding=False, num_labels=10 if small else 1000, image_size=size,
                                       **({"depth_multiplier": 0.25} if small else {}))
            model = tf.MobileNetV2ForImageClassification(cfg)
            keys = ["depth_multiplier", "tf_padding", "image_size", "num_labels"]
        elif name == "regnety-400mf":
            # RegNetY-400MF: grouped 3x3 convs (8 channels a group) and a squeeze-and-excitation block in every
            # layer -- a global mean at 56x56 to 7x7, two 1x1 convs on a 1x1 map, a sigmoid gate: the SE operators
            # no other training model has (EfficientNet-B0, held out, has its own, at other shapes).
            cfg = (tf.RegNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                                   groups_width=8, layer_type="y", num_labels=10) if small
                   else tf.RegNetConfig(embedding_size=32, hidden_sizes=[48, 104, 208, 440], depths=[1, 3, 6, 6],
                                        groups_width=8, layer_type="y", num_labels=1000))
            model = tf.RegNetForImageClassification(cfg)
            keys = ["embedding_size", "hidden_sizes", "depths", "groups_width", "layer_type", "hidden_act", "num_labels"]
        else:  # EfficientNet-B0 (EfficientNetConfig's defaults are B7's)
            kw = dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=size, dropout_rate=0.2,
                      hidden_dim=1280, num_labels=1000)
            if small:
                kw.update(width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=10)
            cfg = tf.EfficientNetConfig(**kw)
            model = tf.EfficientNetForImageClassification(cfg)
            keys = ["width_coefficient", "depth_coefficient", "image_size", "hidden_dim", "dropout_rate", "num_labels"]
        record = _config_record(cfg, keys, batch=batch, input_shape=list(x.shape), dtype="float32")
        return ModelSpec(name, model.eval(), (x,), record, f"{type(model).__name__}, input {tuple(x.shape)} f32")

    seq = seq or (SMALL_SEQ if small else DEFAULT_SEQ)
    if name == "bert-base":
        cfg = (tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             vocab_size=100, max_position_embeddings=64) if small else tf.BertConfig())
        cfg._attn_implementation = "eager"
        model = tf.BertModel(cfg)
        keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                "max_position_embeddings", "hidden_act"]
    elif name == "gpt2":
        cfg = (tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64) if small
               else tf.GPT2Config())
        cfg._attn_implementation = "eager"
        model = tf.GPT2LMHeadModel(cfg)
        keys = ["n_embd", "n_layer", "n_head", "vocab_size", "n_positions", "activation_function"]
    elif name == "tinyllama-layer":
        # One decoder layer with TinyLlama-1.1B's dimensions: grouped-query attention (4 key/value heads for
        # 32 query heads) and an MLP width, 5632 = 2^9 * 11, that is not a product of small primes -- training
        # shapes whose extents are not themselves good tile factors (the training models' widths are 7-smooth).
        cfg = (tf.LlamaConfig(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
                              num_hidden_layers=1, vocab_size=100, max_position_embeddings=64) if small
               else tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                                   num_key_value_heads=4, num_hidden_layers=1, vocab_size=32000,
                                   max_position_embeddings=2048, rms_norm_eps=1e-5))
        cfg._attn_implementation = "eager"
        model = tf.LlamaModel(cfg)
        keys = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
                "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act"]
    elif name == "qwen2-0.5b-layer":
        # One decoder layer with Qwen2-0.5B's dimensions: biased q/k/v projections, 14 query heads on 2
        # key/value heads, hidden 896 = 2^7 * 7 and an MLP width 4864 = 2^8 * 19 -- a second training model
        # whose widths carry a large odd factor (TinyLlama's 5632 = 2^9 * 11). The embedding table has
        # 32000 rows, not Qwen2's 151,936 (a 545 MB gather of the same shape per row).
        cfg = (tf.Qwen2Config(hidden_size=64, intermediate_size=152, num_attention_heads=4, num_key_value_heads=2,
                              num_hidden_layers=1, vocab_size=100, max_position_embeddings=64) if small
               else tf.Qwen2Config(hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                                   num_key_value_heads=2, num_hidden_layers=1, vocab_size=32000,
                                   max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=1000000.0))
        cfg._attn_implementation = "eager"
        model = tf.Qwen2Model(cfg)
        keys = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
                "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act"]
    else:  # one decoder layer with LLaMA-7B's dimensions (LlamaConfig's defaults are LLaMA-7B's)
        cfg = (tf.LlamaConfig(hidden_size=64, intermediate_size=172, num_attention_heads=4, num_key_value_heads=4,
                              num_hidden_layers=1, vocab_size=100, max_position_embeddings=64) if small
               else tf.LlamaConfig(num_hidden_layers=1))
        cfg._attn_implementation = "eager"
        model = tf.LlamaModel(cfg)
        keys = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
                "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act"]
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), dtype=torch.long)
    record = _config_record(cfg, keys, batch=batch, seq=seq, input_shape=[batch, seq], dtype="float32",
                            attn_implementation="eager")
    return ModelSpec(name, model.eval(), (ids,), record, f"{type(model).__name__}, input_ids ({batch}, {seq})")
