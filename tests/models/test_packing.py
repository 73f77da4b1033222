"""Encoders without padding: the packed way through BERT and RoBERTa equals the padded way at every real
position, in fp32 and in the static engine's half precision, and never computes a padded one. A family
without a packed way (ModernBERT's sliding windows are masks, which the packed attention takes none of)
runs the padded way even where packing is asked for."""

from __future__ import annotations

import pytest
import torch

import hotrod
from hotrod.models import get_family
from hotrod.models.attention import multi_head_attention
from hotrod.models.packing import Packing, packed_attention
from tests.zoo import CASES, ENCODER_CASES, prompt_batch

LENGTHS = (7, 3, 5, 1)
PACKED = {name: hasattr(get_family(CASES[name].model_type).build, "packed_graphs") for name in ENCODER_CASES}


def test_pack_and_unpack_keep_the_real_tokens_in_row_order():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    packing = Packing.of(mask)
    x = torch.arange(12.0).view(3, 4, 1)
    assert packing.pack(x).flatten().tolist() == [0, 1, 2, 4, 8, 9, 10, 11]
    assert packing.offsets.tolist() == [0, 3, 4, 8]
    assert torch.equal(packing.unpack(packing.pack(x)), x * mask[..., None])


def test_packed_attention_equals_masked_padded_attention():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    q, k, v = (torch.randn(3, 5, 16) for _ in range(3))
    bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    padded = multi_head_attention(q, k, v, bias.expand(-1, -1, 5, -1), 4, 0.5)
    packing = Packing.of(mask)
    got = packed_attention(packing.pack(q), packing.pack(k), packing.pack(v), packing, 4, 0.5)
    assert torch.allclose(packing.unpack(got), padded * mask[..., None], atol=1e-6)


def _hidden(model, ids, mask):
    return model(ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("precision, atol", [("fp32", 1e-5), ("bf16", None)])
@pytest.mark.parametrize("packed_case", [name for name, packed in PACKED.items() if packed])
def test_the_engine_packs_batches_with_padding(zoo, packed_case, precision, atol):
    ids, mask = prompt_batch(CASES[packed_case], LENGTHS)
    real = mask.bool()
    reference = _hidden(zoo.model(packed_case, "torch"), ids, mask)
    model = hotrod.load(zoo.checkpoint(packed_case), backend="torch", static=True, precision=precision)
    model.backend.packed = model.backend.module.packed_graphs()  # on a GPU by default; here by hand
    eager_before = model.backend.recorded.stats.eager
    got = _hidden(model, ids, mask)
    assert model.backend.recorded.stats.eager == eager_before + 1  # the packed way (never recorded)
    assert torch.count_nonzero(got[~real]) == 0  # nothing computed at a padded position
    if atol is not None:
        assert torch.allclose(got[real], reference[real], atol=atol)
    else:
        cosine = torch.nn.functional.cosine_similarity(got[real], reference[real], dim=-1)
        assert cosine.min() > 0.99
    vectors = model.embed(ids.tolist() and [row[: int(n)] for row, n in zip(ids.tolist(), mask.sum(1))])
    assert vectors.shape == (len(LENGTHS), reference.shape[-1])


@pytest.mark.parametrize("packed, expected", [(None, set()), (True, {"encoder"}), (False, set())])
def test_packing_is_on_only_where_asked(zoo, packed, expected):
    from hotrod.runtime.static import EngineOptions, StaticBackend

    model = hotrod.load(zoo.checkpoint("bert"), backend="torch", static=True)
    backend = StaticBackend(model.backend.module, model.backend.contracts,
                            EngineOptions(device="cpu", precision="fp32", packed=packed))
    assert set(backend.packed) == expected


@pytest.mark.parametrize("unpacked_case", [name for name, packed in PACKED.items() if not packed])
def test_a_family_without_a_packed_way_runs_padded_where_packing_is_asked(zoo, unpacked_case):
    from hotrod.runtime.static import EngineOptions, StaticBackend

    model = hotrod.load(zoo.checkpoint(unpacked_case), backend="torch", static=True, precision="fp32")
    model.backend = StaticBackend(model.backend.module, model.backend.contracts,
                                  EngineOptions(device="cpu", precision="fp32", packed=True))
    assert model.backend.packed == {}
    ids, mask = prompt_batch(CASES[unpacked_case], LENGTHS)
    real = mask.bool()
    reference = _hidden(zoo.model(unpacked_case, "torch"), ids, mask)
    assert torch.allclose(_hidden(model, ids, mask)[real], reference[real], atol=1e-5)
