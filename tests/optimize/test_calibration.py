"""Calibration texts and the feeds recorded from the fp32 model."""

from __future__ import annotations

import numpy as np
import pytest

from hotrod.errors import HotrodError
from hotrod.optimize.calibration import capture_feeds
from hotrod.verification.inputs import builtin_texts, read_texts


def test_builtin_texts_are_varied_sentences():
    texts = builtin_texts()
    assert len(texts) >= 32 and len(set(texts)) == len(texts)


def test_read_texts_skips_blank_lines(tmp_path):
    file = tmp_path / "calib.txt"
    file.write_text("one\n\n  two  \n")
    assert read_texts(file) == ["one", "two"]


@pytest.mark.parametrize("content", [None, "", "\n  \n", b"\xff\xfe\x00bad"])
def test_unreadable_or_empty_calibration_file_is_one_clear_error(tmp_path, content):
    file = tmp_path / "calib.txt"
    if isinstance(content, bytes):
        file.write_bytes(content)
    elif content is not None:
        file.write_text(content)
    with pytest.raises(HotrodError, match="calibration file"):
        read_texts(file)


def test_feeds_cover_every_graph_with_the_contract_inputs(zoo, case):
    model = zoo.model(case, "onnxruntime")
    feeds = capture_feeds(model, builtin_texts()[:5], max_new_tokens=3, per_graph=4)
    assert set(feeds) == set(model.backend.contracts)
    for graph, items in feeds.items():
        assert 1 <= len(items) <= 4
        for feed in items:
            assert list(feed) == model.backend.contracts[graph].input_names
            assert all(isinstance(v, np.ndarray) for v in feed.values())
    if model.kind != "encoder":  # later decoding steps carry a real cache
        step = "decoder"
        assert any(f["past_key_values.0.key"].shape[2] > 0 for f in feeds[step])


def test_capture_leaves_the_model_as_it_was(zoo):
    model = zoo.model("gpt2", "onnxruntime")
    backend = model.backend
    capture_feeds(model, ["hello world"], max_new_tokens=2)
    assert model.backend is backend
