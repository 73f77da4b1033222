"""The fusions an encoder's layers need against those its graph holds, as `hotrod info` reports them."""

from __future__ import annotations

import hotrod
from hotrod.cli import main
from hotrod.optimize.audit import CPU_NOTE, encoder_tallies, tally_line
from tests.zoo import CASES, LAYERS


def test_a_layer_short_of_a_fusion_is_named():
    fused = {"MultiHeadAttention": 2, "LayerNormalization": 5}
    tallies = encoder_tallies(fused, {"Softmax": 1, "Erf": 3}, layers=3, device="cpu")
    assert [(t.what, t.found, t.needed) for t in tallies] == [("attention", 2, 3), ("layer norm", 5, 6), ("GELU", 0, 3)]
    assert tally_line(tallies, 3, "cpu") == ("attention 2/3, layer norm 5/6, GELU 0/3 (found/needed in 3 layers); "
                                             f"not fused: attention in 1, layer norm in 1, GELU in 3; {CPU_NOTE}")


def test_a_gpu_build_needs_residual_and_bias_fused_and_a_relu_network_no_gelu():
    fused = {"MultiHeadAttention": 2, "LayerNormalization": 5}  # fused as for the CPU, and no GELU anywhere
    tallies = encoder_tallies(fused, {}, layers=2, device="cuda")
    assert tally_line(tallies, 2, "cuda") == ("attention 2/2, skip layer norm 0/4 (found/needed in 2 layers); "
                                              "not fused: skip layer norm in 4")
    assert tally_line(encoder_tallies(fused, {}, 2, "cpu"), 2, "cpu").endswith(f"all fused; {CPU_NOTE}")


def _info(capsys, artifact) -> str:
    assert main(["info", str(artifact)]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  layers"))


def test_every_encoder_fuses_what_each_layer_needs(zoo, encoder_case, capsys):
    line = _info(capsys, zoo.artifact(encoder_case))
    layers = CASES[encoder_case].config().num_hidden_layers
    assert line.startswith(f"  layers    attention {layers}/{layers}, layer norm ") and "all fused" in line
    assert f"GELU {layers}/{layers}" in line


def test_a_gpu_build_fuses_residuals_and_biases_in_every_layer(zoo, tmp_path, capsys):
    out = hotrod.optimize(zoo.checkpoint("distilbert"), tmp_path / "gpu", device="cuda", progress=False,
                          verify_examples=0)
    line = _info(capsys, out)
    assert f"skip layer norm {2 * LAYERS}/{2 * LAYERS}, bias GELU {LAYERS}/{LAYERS}" in line
    assert line.endswith("all fused")


def test_without_the_optimizer_the_gelu_is_named_unfused(zoo, tmp_path, capsys):
    out = hotrod.optimize(zoo.checkpoint("electra"), tmp_path / "plain", fusion=False, progress=False,
                          verify_examples=0)
    assert f"GELU 0/{LAYERS} (found/needed in {LAYERS} layers); not fused: GELU in {LAYERS};" in _info(capsys, out)
