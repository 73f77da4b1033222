"""ModernBERT's own variations, beyond the table's case: its sliding window, both poolings of its classifier,
the bias switches of its linear layers and norms, and the rotary variants it refuses."""

from __future__ import annotations

import pytest
import torch

import hotrod
from tests.zoo import CASES, POSITIONS, build_checkpoint, head_case, load_on, prompt_batch

CASE = CASES["modernbert"]


def test_local_layers_see_only_their_window(zoo, backend):
    """The table's lengths pass the local window: without it the hidden states move far past the 1e-4
    the parity tests allow, so those tests hold the window to transformers'."""
    ids, mask = prompt_batch(CASE, (12, 5))
    real = mask.bool()
    ours = zoo.model("modernbert", backend)(input_ids=ids, attention_mask=mask).last_hidden_state
    wide = CASE.hf_class.from_pretrained(zoo.checkpoint("modernbert"), local_attention=2 * POSITIONS).eval()
    with torch.no_grad():
        everywhere = wide(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (ours[real] - everywhere[real]).abs().max() > 1e-3


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    """A classifier pooling the first token, with a bias in every linear layer and norm."""
    case = head_case(CASE, "cls", classifier_pooling="cls", norm_bias=True, attention_bias=True, mlp_bias=True,
                     classifier_bias=True)
    root = tmp_path_factory.mktemp("modernbert-variant")
    checkpoint = build_checkpoint(case, root / "checkpoint", seed=4)
    artifact = hotrod.optimize(checkpoint, root / "artifact", progress=False, verify_examples=0)
    return case, checkpoint, artifact


def test_cls_pooling_and_biases_match_transformers(variant, backend):
    case, checkpoint, artifact = variant
    model = load_on(artifact if backend == "onnxruntime" else checkpoint, backend)
    ids, mask = prompt_batch(case, (9, 4, 6), seed=5)
    reference = case.hf_class.from_pretrained(checkpoint).eval()
    assert reference.config.classifier_pooling == "cls" and reference.model.layers[1].attn.Wqkv.bias is not None
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, expected, atol=1e-4, rtol=0)


def test_scaled_rotary_embeddings_are_refused_by_name(tmp_path):
    case = head_case(CASE, "cls")
    checkpoint = build_checkpoint(case, tmp_path / "checkpoint")
    config = (checkpoint / "config.json").read_text()
    (checkpoint / "config.json").write_text(config.replace('"rope_type": "default"', '"rope_type": "linear", "factor": 2.0'))
    with pytest.raises(hotrod.HotrodError, match="default rotary embeddings, not 'linear'"):
        hotrod.load(checkpoint, backend="torch")
