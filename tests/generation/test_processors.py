"""The processors encoder-decoder checkpoints set (BART, mBART-50, Marian, M2M100/NLLB, Pegasus) give
transformers' tokens: no_repeat_ngram_size, bad_words_ids, forced_bos_token_id, forced_eos_token_id,
suppress_tokens and begin_suppress_tokens, alone and together with min_length, length_penalty and
early_stopping; greedy, beam and seeded sampling on every backend, in drafting and in the server's running
batch; bad values refused in one line.

Every setting is chosen from transformers' output without it (a token it chose, one it never chose), and
each test first asserts that the setting changes transformers' output, so a processor hotrod ignored fails.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from transformers import GenerationConfig

import hotrod
from hotrod.generation.config import merge, resolve
from hotrod.serve.messages import Params
from hotrod.serve.runner import GenerationRunner
from hotrod.serve.scheduler import ContinuousScheduler, Request
from tests.generation.test_parity import frequent_tokens
from tests.serve.test_runner import _Ticket, run_arriving
from tests.test_cli import assert_one_error_line, run
from tests.zoo import CASES, VOCAB, assert_same_tokens, load_on, prompt_batch

NAMES = ["gpt2", "t5"]  # a decoder-only model (prompt, padding and all, in its rows) and an encoder-decoder
BATCH = (7, 3, 5)
MODES = {  # (transformers' arguments, seed)
    "greedy": (dict(max_new_tokens=10), None),
    "beam": (dict(max_new_tokens=10, num_beams=4, num_return_sequences=2), None),
    "sample": (dict(max_new_tokens=10, do_sample=True, temperature=1.5), 3),
}
Generate = Callable[..., torch.Tensor]  # transformers' output for the mode, with extra arguments


def _absent(column: torch.Tensor) -> int:
    """The smallest ordinary token id (past the specials) that `column` does not hold."""
    return next(token for token in range(3, VOCAB) if token not in column.tolist())


def _forced_bos_then_begin(hf: Generate, start: int) -> tuple[dict, dict]:
    """forced_bos_token_id moves begin_suppress_tokens one token later (after the forced one)."""
    bos = _absent(hf()[:, start])
    forced = hf(forced_bos_token_id=bos)
    return dict(forced_bos_token_id=bos, begin_suppress_tokens=[int(forced[0, start + 1])]), dict(
        forced_bos_token_id=bos)


FIELDS: dict[str, Callable[[Generate, int, str], tuple[dict, dict]]] = {  # (the setting, what it must change)
    "no_repeat_ngram_size": lambda hf, start, mode: (dict(no_repeat_ngram_size=1 if mode == "sample" else 2), {}),
    "bad_words_one_token": lambda hf, start, mode: (dict(bad_words_ids=[[int(hf()[0, start])]]), {}),
    # a one-token word that is EOS is left out, as transformers does (else every row ending in EOS changes)
    "bad_words_sequence": lambda hf, start, mode: (
        dict(bad_words_ids=[hf()[0, start:start + 2].tolist(), [hf.eos]]), {}),
    "forced_bos_token_id": lambda hf, start, mode: (dict(forced_bos_token_id=_absent(hf()[:, start])), {}),
    "forced_bos_then_begin_suppress": lambda hf, start, mode: _forced_bos_then_begin(hf, start),
    "forced_eos_token_id": lambda hf, start, mode: (dict(forced_eos_token_id=_absent(hf()[:, -1])), {}),
    "forced_eos_token_ids": lambda hf, start, mode: (
        dict(forced_eos_token_id=[_absent(hf()[:, -1]) + 1, _absent(hf()[:, -1])]), {}),
    "suppress_tokens": lambda hf, start, mode: (dict(suppress_tokens=hf()[0, start:start + 2].tolist()), {}),
    "begin_suppress_tokens": lambda hf, start, mode: (dict(begin_suppress_tokens=[int(hf()[0, start])]), {}),
}


def _device(backend: str, seed: int | None) -> str:
    """A sampled run draws from its device's generator: on the GPU, compare with transformers on the GPU."""
    return "cuda" if backend == "cuda" and seed is not None else "cpu"


def _ours(model, ids, mask, seed: int | None, **kwargs) -> torch.Tensor:
    if seed is not None:
        torch.manual_seed(seed)
    return model.generate(ids, attention_mask=mask, **kwargs)


def _start(name: str, ids: torch.Tensor) -> int:
    """Where a returned row's first new token is."""
    return 1 if CASES[name].kind == "seq2seq" else ids.shape[1]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize("name", NAMES)
def test_each_setting_matches_transformers(zoo, backend, name, field, mode):
    # forced_bos_token_id acts after a row's first token: a seq2seq start token, or a one-token prompt
    lengths = (1, 1) if field.startswith("forced_bos") and CASES[name].kind == "decoder" else BATCH
    ids, mask = prompt_batch(CASES[name], lengths)
    base, seed = MODES[mode]
    device = _device(backend, seed)

    def hf(**extra) -> torch.Tensor:
        return zoo.hf_generate(name, ids, mask, seed=seed, device=device, **base, **extra)

    hf.eos = CASES[name].config().eos_token_id
    setting, without = FIELDS[field](hf, _start(name, ids), mode)
    expected = hf(**{**without, **setting})
    assert not torch.equal(expected, hf(**without)), f"{setting} should change transformers' output"
    assert_same_tokens(_ours(zoo.model(name, backend), ids, mask, seed, **base, **setting), expected)


@pytest.mark.parametrize("early_stopping, listed", [(True, False), (False, True), ("never", False)],
                         ids=["early_stopping_true", "early_stopping_false", "early_stopping_never"])
@pytest.mark.parametrize("name", [*NAMES, "bart", "pegasus"])  # and the summarizers' own families
def test_a_summarizers_settings_together(zoo, backend, name, early_stopping, listed):
    """bart-large-cnn's and mBART-50's: no_repeat_ngram_size 3, min_length, length_penalty 2, a forced first
    and last token, 4 beams; hypotheses finish often (EOS is among the tokens the model emits most)."""
    ids, mask = prompt_batch(CASES[name], BATCH)
    start = _start(name, ids)
    eos = frequent_tokens(zoo, name, ids, mask, count=4)
    base = dict(max_new_tokens=12, num_beams=4, num_return_sequences=2, eos_token_id=eos, length_penalty=2.0,
                early_stopping=early_stopping)
    plain = zoo.hf_generate(name, ids, mask, **base)
    settings = dict(no_repeat_ngram_size=3, min_length=start + 5, forced_bos_token_id=_absent(plain[:, start]),
                    forced_eos_token_id=eos[:2] if listed else eos[0])
    expected = zoo.hf_generate(name, ids, mask, **base, **settings)
    assert not torch.equal(expected, plain)
    assert_same_tokens(zoo.model(name, backend).generate(ids, attention_mask=mask, **base, **settings), expected)


@pytest.mark.parametrize("name", [*NAMES, "mbart", "m2m_100", "marian"])  # and the translators' own families
def test_sampling_a_translators_settings_together(zoo, backend, name):
    """mBART-50 / NLLB sampled: a forced target language, no repeated bigrams, suppressed and banned tokens."""
    ids, mask = prompt_batch(CASES[name], (1, 1) if name == "gpt2" else BATCH)
    base = dict(max_new_tokens=10, do_sample=True, top_k=20, num_return_sequences=2)
    device = _device(backend, 5)
    plain = zoo.hf_generate(name, ids, mask, seed=5, device=device, **base)
    start = _start(name, ids)
    settings = dict(forced_bos_token_id=_absent(plain[:, start]), no_repeat_ngram_size=2,
                    suppress_tokens=[int(plain[1, start + 1])], bad_words_ids=[plain[0, start + 1:start + 3].tolist()])
    expected = zoo.hf_generate(name, ids, mask, seed=5, device=device, **base, **settings)
    assert not torch.equal(expected, plain)
    assert_same_tokens(_ours(zoo.model(name, backend), ids, mask, 5, **base, **settings), expected)


def test_min_new_tokens_replaces_min_length_as_in_transformers(zoo, backend):
    """transformers: min_new_tokens, where set (0 too), replaces min_length (even a longer one)."""
    ids, mask = prompt_batch(CASES["t5"], BATCH)
    eos = zoo.hf_generate("t5", ids, mask, max_new_tokens=10)[:, 1].tolist()  # each row's first new token
    base = dict(max_new_tokens=10, min_length=9, eos_token_id=eos)
    expected = zoo.hf_generate("t5", ids, mask, **base, min_new_tokens=0)
    assert not torch.equal(expected, zoo.hf_generate("t5", ids, mask, **base))
    assert_same_tokens(zoo.model("t5", backend).generate(ids, attention_mask=mask, **base, min_new_tokens=0),
                       expected)


def test_the_checkpoints_generation_config_is_the_default(zoo, tmp_path):
    """generation_config.json's processors apply; a keyword argument None turns one off, as in transformers."""
    source = zoo.copy_checkpoint("t5", tmp_path / "ckpt")
    ids, mask = prompt_batch(CASES["t5"], BATCH)
    plain = zoo.hf_generate("t5", ids, mask, max_length=14, num_beams=4)
    GenerationConfig(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, max_length=14, num_beams=4,
                     no_repeat_ngram_size=3, min_length=6, length_penalty=2.0, early_stopping=True,
                     forced_bos_token_id=_absent(plain[:, 1]), forced_eos_token_id=1).save_pretrained(source)
    reference = CASES["t5"].hf_class.from_pretrained(source).eval()
    model = hotrod.load(source, backend="torch")
    for kwargs in ({}, dict(forced_bos_token_id=None)):
        with torch.no_grad():
            expected = reference.generate(ids, attention_mask=mask, **kwargs)
        assert not torch.equal(expected, plain)
        assert_same_tokens(model.generate(ids, attention_mask=mask, **kwargs), expected)


def _repeating_prompt() -> torch.Tensor:
    """A prompt that repeats itself: prompt lookup drafts from it, and no_repeat_ngram_size bans the copies."""
    base = torch.randint(3, VOCAB, (8,), generator=torch.Generator().manual_seed(5))
    return torch.cat([base, base[:4], base])[None]


@pytest.mark.parametrize("name", ["bart", "mbart", "marian", "m2m_100", "pegasus"])
def test_prompt_lookup_on_each_bart_like_family(zoo, backend, name):
    """Prompt lookup suits summarization and translation, whose outputs copy their source: drafted from it,
    plain and under a summarizer's settings, the tokens are transformers' greedy ones."""
    model = zoo.model(name, backend)
    if not model.backend.verifies_drafts:
        pytest.skip("the static engine refuses drafting (tests/generation/test_lookup.py)")
    ids = _repeating_prompt()
    mask = torch.ones_like(ids)
    plain = zoo.hf_generate(name, ids, mask, max_new_tokens=20)
    settings = dict(no_repeat_ngram_size=3, forced_bos_token_id=_absent(plain[:, 1]))
    for extra in ({}, settings):
        expected = zoo.hf_generate(name, ids, mask, max_new_tokens=20, **extra)
        assert_same_tokens(model.generate(ids, attention_mask=mask, max_new_tokens=20, prompt_lookup_num_tokens=4,
                                          **extra), expected)
    assert not torch.equal(expected, plain)


@pytest.mark.parametrize("drafter", ["prompt_lookup", "assistant"])
@pytest.mark.parametrize("name", NAMES)
def test_drafting_gives_the_processed_tokens(zoo, backend, name, drafter):
    """Every processor is a function of the row up to the token chosen, which verification gives each
    drafted position: drafting gives greedy decoding's processed tokens."""
    model = zoo.model(name, backend)
    if not model.backend.verifies_drafts:
        pytest.skip("the static engine refuses drafting (tests/generation/test_lookup.py)")
    ids = _repeating_prompt()
    mask = torch.ones_like(ids)
    base = dict(max_new_tokens=20)
    plain = zoo.hf_generate(name, ids, mask, **base)
    start = _start(name, ids)
    settings = dict(no_repeat_ngram_size=3, bad_words_ids=[plain[0, start + 2:start + 4].tolist()],
                    suppress_tokens=[int(plain[0, start + 5])], forced_eos_token_id=_absent(plain[:, -1]),
                    forced_bos_token_id=_absent(plain[:, start]), begin_suppress_tokens=[int(plain[0, start])])
    expected = zoo.hf_generate(name, ids, mask, **base, **settings)
    assert not torch.equal(expected, plain)
    drafting = (dict(prompt_lookup_num_tokens=4) if drafter == "prompt_lookup"
                else dict(assistant_model=zoo.model(f"{name}-assistant", backend), num_assistant_tokens=4))
    assert_same_tokens(model.generate(ids, attention_mask=mask, **base, **settings, **drafting), expected)


@pytest.mark.parametrize("name", NAMES)
def test_the_server_applies_them_to_each_row(zoo, name):
    """The model's generation config for every row, and each request's forced_bos_token_id and
    no_repeat_ngram_size over it: each row's tokens are generate()'s alone, in a running batch of rows with
    other settings (one speculating)."""
    model = load_on(zoo.checkpoint(name), "torch")
    config = copy.deepcopy(model.generation_config)
    config.no_repeat_ngram_size, config.suppress_tokens = 2, [7]
    model.generation_config = config
    runner = GenerationRunner(model)
    scheduler = ContinuousScheduler(4, 10**6, 100, runner.eos_ids)
    generator = torch.Generator().manual_seed(2)
    params = [Params(max_new_tokens=12), Params(max_new_tokens=9, no_repeat_ngram_size=0),
              Params(max_new_tokens=11, forced_bos_token_id=9), Params(max_new_tokens=8, no_repeat_ngram_size=3),
              Params(max_new_tokens=12, prompt_lookup=3), Params(max_new_tokens=10, forced_bos_token_id=11)]
    prompts = [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in (4, 9, 1, 6, 3, 1)]
    prompts[4] = _repeating_prompt()[0].tolist()
    requests = [Request(_Ticket(), prompt=prompt, params=p) for prompt, p in zip(prompts, params)]
    run_arriving(scheduler, runner, requests)
    changed = False
    for request in requests:
        kwargs = request.params.generate_kwargs()
        alone = _new_tokens(model, request, runner.eos_ids, **kwargs)
        assert request.tokens == alone
        changed |= alone != _new_tokens(model, request, runner.eos_ids, **{
            **kwargs, "no_repeat_ngram_size": 0, "suppress_tokens": None, "forced_bos_token_id": None})
    assert changed, "the settings should change some row's tokens"


def _new_tokens(model, request: Request, eos: tuple[int, ...], **kwargs) -> list[int]:
    out = model.generate(torch.tensor([request.prompt]), **kwargs)
    tokens = out[0, len(request.prompt) if model.kind == "decoder" else 1:].tolist()
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos), tokens)  # the server keeps no EOS


# -- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be >= 0"),
    (dict(no_repeat_ngram_size=2.5), "no_repeat_ngram_size must be an integer"),
    (dict(no_repeat_ngram_size=True), "no_repeat_ngram_size must be an integer"),
    (dict(forced_bos_token_id=100), r"forced_bos_token_id 100 is not a token id of this model \(0 \.\. 99\)"),
    (dict(forced_bos_token_id="3"), "forced_bos_token_id '3' is not a token id"),
    (dict(forced_eos_token_id=[]), "forced_eos_token_id must be a token id or a non-empty list"),
    (dict(forced_eos_token_id=[3, 100]), "forced_eos_token_id 100 is not a token id"),
    (dict(forced_eos_token_id=-2), "forced_eos_token_id -2 is not a token id"),
    (dict(bad_words_ids=[]), "bad_words_ids must be a non-empty list of non-empty lists"),
    (dict(bad_words_ids=[5]), "bad_words_ids must be a non-empty list of non-empty lists"),
    (dict(bad_words_ids=[[5], []]), "bad_words_ids must be a non-empty list of non-empty lists"),
    (dict(bad_words_ids=[[5, 100]]), "bad_words_ids 100 is not a token id"),
    (dict(bad_words_ids=[[0]], eos_token_id=0), "bans only the EOS token"),
    (dict(suppress_tokens=5), "suppress_tokens must be a list of token ids"),
    (dict(suppress_tokens=[-1]), "suppress_tokens -1 is not a token id"),
    (dict(begin_suppress_tokens=[100]), "begin_suppress_tokens 100 is not a token id"),
    (dict(forced_bos_token_id=5, suppress_tokens=[5, 6]), "forced_bos_token_id .* is all in suppress_tokens"),
    (dict(forced_eos_token_id=[5, 6], suppress_tokens=[5, 6]), "forced_eos_token_id .* is all in suppress_tokens"),
    (dict(encoder_no_repeat_ngram_size=2), "does not support"),  # still not implemented: refused
    (dict(sequence_bias={(5,): -1.0}), "does not support"),
])
def test_bad_values_are_refused_in_one_line(kwargs, message):
    with pytest.raises(hotrod.HotrodError, match=message) as caught:
        resolve(merge(None, None, {"max_new_tokens": 2, **kwargs}), 5, None, vocab_size=100)
    assert "\n" not in str(caught.value)


def test_values_that_mean_off_are_accepted():
    s = resolve(merge(None, None, dict(max_new_tokens=2, no_repeat_ngram_size=0, suppress_tokens=[],
                                       begin_suppress_tokens=[], bad_words_ids=None)), 5, None, 100)
    assert not s.constrained
    s = resolve(merge(GenerationConfig(forced_bos_token_id=4, no_repeat_ngram_size=3), None,
                      dict(max_new_tokens=2, forced_bos_token_id=None, no_repeat_ngram_size=None)), 5, None, 100)
    assert (s.forced_bos_token_id, s.no_repeat_ngram_size) == (None, 0)


def test_a_bad_value_is_a_value_error_from_generate(zoo, backend):
    ids, mask = prompt_batch(CASES["gpt2"], BATCH)
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be >= 0"):
        zoo.model("gpt2", backend).generate(ids, attention_mask=mask, no_repeat_ngram_size=-1)


def test_a_bad_value_in_the_checkpoint_is_one_cli_line(zoo, capsys, tmp_path):
    source = zoo.copy_checkpoint("t5", tmp_path / "ckpt")
    GenerationConfig(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
                     forced_bos_token_id=VOCAB + 5).save_pretrained(source)
    code, out, err = run(capsys, "generate", source, "5 6 7", "--ids", "--backend", "torch", "--max-new-tokens", 3)
    assert_one_error_line(code, out, err, 1, "forced_bos_token_id 105 is not a token id")


@pytest.mark.parametrize("fixed", [
    dict(bad_words_ids=[[4], [9]]), dict(suppress_tokens=[4, 7]), dict(begin_suppress_tokens=[4]),
    dict(forced_bos_token_id=6), dict(forced_eos_token_id=[8, 5]), dict(min_new_tokens=3),
    dict(bad_words_ids=[[4]], suppress_tokens=[7], forced_bos_token_id=6, forced_eos_token_id=5, min_new_tokens=3)])
def test_greedy_over_fixed_ids_is_the_processed_argmax_at_every_length(fixed):
    """Processors that act on fixed ids keep greedy decoding on its argmax-first path (a real Marian
    checkpoint bans its pad token and forces EOS): at every length, each row's choice is the argmax of the
    processed scores, whether the raw argmax was held back, a step forced or nothing changed."""
    from hotrod.generation.sampling import argmax, process
    from hotrod.generation.search import greedy, greedy_on_host, greedy_only

    s = resolve(merge(None, None, {"max_new_tokens": 6, "eos_token_id": 2, **fixed}), 1, None, vocab_size=12)
    assert greedy_only(s)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 12, generator=generator)
    logits[torch.arange(12), torch.arange(12)] += 10  # row i's raw argmax is token i: every id chosen somewhere
    for length in range(1, s.max_length):
        expected = argmax(process(logits, torch.zeros((12, length), dtype=torch.long), s, None))
        assert torch.equal(greedy(logits, s, length), expected), length
        assert torch.equal(torch.as_tensor(greedy_on_host(logits, s, length)), expected), length


def test_n_gram_blocking_and_longer_bad_words_leave_the_argmax_path():
    from hotrod.generation.search import greedy_only

    for reads_the_row in (dict(no_repeat_ngram_size=2), dict(bad_words_ids=[[4, 5]])):
        assert not greedy_only(resolve(merge(None, None, {"max_new_tokens": 4, **reads_the_row}), 1, None, 12))
