"""A checkpoint written as a GGUF file, the format llama.cpp loads, with llama.cpp's own `gguf` library.

llama.cpp's converter script ships only in its source tree (pip installs llama-cpp-python without it),
and it reads the checkpoint's tokenizer, which the workload checkpoints do not have. So the bench writes
the file itself the way that script does for these architectures: tensor names from gguf's own name
table (`gguf.get_tensor_name_map`, the table the script uses), the same hyperparameter keys, GPT-2's
Conv1D weights transposed as the script does, a tied output projection left out (llama.cpp reuses the
token embedding, as for the hub's files). In place of a tokenizer the file declares no vocabulary and
only its size: the bench hands llama.cpp token ids, never text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class Layout:
    """How one model_type becomes GGUF: its architecture, its hyperparameters, and its tensors' quirks."""

    arch: str  # a name of gguf.MODEL_ARCH
    hyperparameters: Callable[[object, object], None]  # (config, writer)
    skip: tuple[str, ...] = ()  # name suffixes llama.cpp does not read
    transposed: tuple[str, ...] = ()  # name suffixes stored [in, out] (Conv1D) that GGUF wants [out, in]
    blocks: Callable[[object], int] = lambda config: config.num_hidden_layers


def _gpt2(config, writer) -> None:
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(config.n_inner or 4 * config.n_embd)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)


def _bert(config, writer) -> None:
    import gguf

    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_layer_norm_eps(config.layer_norm_eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.NONE)  # every token's hidden state, as last_hidden_state
    writer.add_token_type_count(config.type_vocab_size)


def _t5(config, writer) -> None:
    if config.num_decoder_layers > config.num_layers:
        raise ValueError(f"llama.cpp sizes T5's layers by the encoder's: a decoder of {config.num_decoder_layers} "
                         f"layers over an encoder of {config.num_layers} does not load")
    writer.add_context_length(getattr(config, "n_positions", None) or 512)
    writer.add_embedding_length(config.d_model)
    writer.add_feed_forward_length(config.d_ff)
    writer.add_decoder_block_count(config.num_decoder_layers)
    writer.add_head_count(config.num_heads)
    writer.add_key_length(config.d_kv)
    writer.add_value_length(config.d_kv)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_layer_norm_rms_eps(config.layer_norm_epsilon)
    writer.add_relative_attn_buckets_count(config.relative_attention_num_buckets)
    writer.add_decoder_start_token_id(config.decoder_start_token_id)


LAYOUTS = {
    "gpt2": Layout("GPT2", _gpt2, skip=(".attn.bias", ".attn.masked_bias"),
                   transposed=(".c_attn.weight", ".c_proj.weight", ".c_fc.weight"), blocks=lambda c: c.n_layer),
    "bert": Layout("BERT", _bert, skip=("position_ids", "pooler.dense.weight", "pooler.dense.bias")),
    "t5": Layout("T5", _t5, skip=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"),
                 blocks=lambda c: c.num_layers),
}
LAYOUTS["mt5"] = LAYOUTS["t5"]  # llama.cpp runs mT5 as T5: the same graph, a larger vocabulary


def supported(model_type: str) -> bool:
    return model_type in LAYOUTS


def write(model: torch.nn.Module, path: Path) -> None:
    """`model` (a transformers model) as an fp32 GGUF file at `path`."""
    import gguf

    config = model.config
    layout = LAYOUTS.get(config.model_type)
    if layout is None:
        raise ValueError(f"no GGUF layout for model_type {config.model_type!r}; "
                         f"known: {', '.join(sorted(LAYOUTS))}")
    arch = gguf.MODEL_ARCH[layout.arch]
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_block_count(layout.blocks(config))
    layout.hyperparameters(config, writer)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("no_vocab")  # ids in, ids out: llama.cpp adds that many dummy tokens
    writer.add_vocab_size(config.vocab_size)
    deepest = max(layout.blocks(config), getattr(config, "num_decoder_layers", 0) or 0)  # T5's decoder may be deeper
    for name, tensor in tensors(model, layout, gguf.get_tensor_name_map(arch, deepest)):
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tensors(model: torch.nn.Module, layout: Layout, names) -> Iterator[tuple[str, np.ndarray]]:
    """Each weight under its GGUF name; a weight the name table does not know is an error, not a drop."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    for name, tensor in model.state_dict().items():
        if name.endswith(layout.skip) or (tied and name == "lm_head.weight"):
            continue
        data = tensor.detach().float()
        if name.endswith(layout.transposed):
            data = data.t()
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise ValueError(f"gguf's tensor table has no name for {name!r}")
        yield mapped, data.contiguous().numpy()
