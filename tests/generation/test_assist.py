"""Assisted decoding: greedy decoding's tokens and sampling's distribution, drafted by a smaller model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hotrod
from hotrod.generation import config as gen_config
from hotrod.generation.assist import Assist
from hotrod.generation.drafts import MAX_DRAFT_TOKENS
from hotrod.generation.sampling import top_k
from tests.zoo import ASSISTANT_CASES, build_checkpoint, load_on, save_roberta_tokenizer

NAMES = ["gpt2", "t5"]  # a decoder-only and an encoder-decoder case, each with a smaller assistant in the zoo


def _prompts(vocab: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    base = torch.randint(2, vocab, (8,), generator=generator)
    return [torch.cat([base, base[:4], base])[None], base[None], torch.randint(2, vocab, (1, 20), generator=generator)]


def _assistant(zoo, name: str, backend: str, own: bool) -> hotrod.HotrodModel:
    return zoo.model(name if own else f"{name}-assistant", backend)


def _drafter(model, assistant, ids: torch.Tensor, draft_tokens: int = 5, **kwargs) -> tuple[Assist, torch.Tensor]:
    """Assisted decoding as generate() runs it, keeping the drafter for its counts."""
    values = gen_config.merge(model.generation_config, None, kwargs)
    settings = model.settings(ids.shape[1], values)
    drafter = Assist(model.decoding_state(settings), settings, assistant.decoding_state(settings), draft_tokens)
    return drafter, drafter.generate(ids, torch.ones_like(ids))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("own", [False, True], ids=["smaller", "itself"])
def test_assisted_decoding_gives_greedy_decodings_tokens(zoo, backend, name, own):
    model, assistant = zoo.model(name, backend), _assistant(zoo, name, backend, own)
    if not model.backend.verifies_drafts:
        with pytest.raises(hotrod.HotrodError, match="static engine"):
            model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, assistant_model=assistant)
        return
    for ids in _prompts(model.dims.vocab_size):
        plain = model.generate(ids, max_new_tokens=24, min_new_tokens=24)
        for draft in (1, 5, 9):
            assert torch.equal(model.generate(ids, max_new_tokens=24, min_new_tokens=24, assistant_model=assistant,
                                              num_assistant_tokens=draft), plain)


@pytest.mark.parametrize("name", NAMES)
def test_a_model_assisting_itself_has_every_draft_kept(zoo, name):
    model = zoo.model(name, "onnxruntime")
    ids = _prompts(model.dims.vocab_size)[2]
    drafter, out = _drafter(model, model, ids, max_new_tokens=30, min_new_tokens=30)
    assert torch.equal(out, model.generate(ids, max_new_tokens=30, min_new_tokens=30))
    assert drafter.drafted > 0 and drafter.accepted == drafter.drafted
    assert drafter.n > 5  # the schedule lengthened its drafts


@pytest.mark.parametrize("name", NAMES)
def test_a_smaller_assistant_has_some_drafts_rejected_and_the_tokens_stay(zoo, name):
    model, assistant = zoo.model(name, "onnxruntime"), zoo.model(f"{name}-assistant", "onnxruntime")
    ids = _prompts(model.dims.vocab_size)[2]
    drafter, out = _drafter(model, assistant, ids, max_new_tokens=30, min_new_tokens=30)
    assert torch.equal(out, model.generate(ids, max_new_tokens=30, min_new_tokens=30))
    assert 0 <= drafter.accepted < drafter.drafted


def test_draft_lengths_follow_transformers_heuristic_schedule():
    drafter = Assist(None, None, None, 5)
    lengths = []
    for drafted, kept in [(5, 5), (7, 7), (9, 3), (8, 0), (7, 0), (6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0)]:
        drafter.verified(drafted, kept)
        lengths.append(drafter.n)
    assert lengths == [7, 9, 8, 7, 6, 5, 4, 3, 2, 1, 1]
    drafter.n = MAX_DRAFT_TOKENS - 1
    drafter.verified(MAX_DRAFT_TOKENS - 1, MAX_DRAFT_TOKENS - 1)
    assert drafter.n == MAX_DRAFT_TOKENS


def test_speculative_sampling_draws_from_the_models_distribution():
    """Drafts drawn from the assistant's q, kept with probability min(1, p/q), else the next token drawn from
    max(0, p - q): each token follows p, however far q is from it (here q favours a token p never draws)."""
    settings = gen_config.resolve(gen_config.merge(None, None, {"do_sample": True, "max_new_tokens": 4}), 1, None)
    p, q = torch.tensor([0.5, 0.3, 0.2, 0.0]), torch.tensor([0.1, 0.1, 0.1, 0.7])
    every = p.log()[None, None].expand(1, 2, 4)
    drafter = Assist(None, settings, None)
    torch.manual_seed(0)
    trials = 4000
    counts = torch.zeros(4)
    for _ in range(trials):
        drafter.q = [q]
        kept, token = drafter.accept(every, [1], [int(torch.multinomial(q, 1))])
        counts[(kept or [token])[0]] += 1
    assert (counts / trials - p).abs().max() < 0.03


def _sampled(model, assistant, ids, seed: int, **kwargs) -> torch.Tensor:
    torch.manual_seed(seed)
    return model.generate(ids, do_sample=True, assistant_model=assistant, **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_sampling_with_an_assistant_honours_the_seed(zoo, name):
    model, assistant = zoo.model(name, "onnxruntime"), zoo.model(f"{name}-assistant", "onnxruntime")
    ids = _prompts(model.dims.vocab_size)[0]
    length = {"max_new_tokens": 16, "min_new_tokens": 16}
    first = _sampled(model, assistant, ids, 3, **length)
    assert torch.equal(_sampled(model, assistant, ids, 3, **length), first)
    assert not torch.equal(_sampled(model, assistant, ids, 4, **length), first)
    greedy = model.generate(ids, **length)
    assert torch.equal(_sampled(model, assistant, ids, 4, top_k=1, **length), greedy)  # one candidate a step


def test_sampled_tokens_with_an_assistant_follow_plain_samplings_distribution(zoo):
    """The first two tokens' joint frequencies over many seeds, against the model's own probabilities: the
    second comes from the first verifying pass (top_k=3 keeps the outcomes few and the assistant's drafts
    often outside them, so rejections happen)."""
    model, assistant = zoo.model("gpt2", "onnxruntime"), zoo.model("gpt2-assistant", "onnxruntime")
    ids = _prompts(model.dims.vocab_size)[1]

    def probabilities(logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(top_k(logits, 3), dim=-1)

    first = probabilities(model(ids).logits[:, -1])[0]
    expected = {}
    for a in first.nonzero().flatten().tolist():
        second = probabilities(model(torch.cat([ids, torch.tensor([[a]])], dim=1)).logits[:, -1])[0]
        expected.update({(a, b): float(first[a] * second[b]) for b in second.nonzero().flatten().tolist()})
    trials = 600
    counts: dict[tuple[int, int], int] = {}
    for seed in range(trials):
        out = _sampled(model, assistant, ids, seed, top_k=3, max_new_tokens=3, min_new_tokens=3)
        pair = tuple(out[0, ids.shape[1]:ids.shape[1] + 2].tolist())
        counts[pair] = counts.get(pair, 0) + 1
    assert set(counts) <= set(expected)
    distance = sum(abs(counts.get(pair, 0) / trials - chance) for pair, chance in expected.items()) / 2
    assert distance < 0.1


@pytest.fixture(scope="module")
def misfits(tmp_path_factory) -> dict[str, hotrod.HotrodModel]:
    """Decoders that cannot assist the zoo's gpt2, loaded on torch: another vocabulary size, another tokenizer
    of the same size, fewer positions."""
    root, base = tmp_path_factory.mktemp("misfits"), ASSISTANT_CASES["gpt2-assistant"]

    def variant(name: str, tokenizer=base.tokenizer, **changes) -> hotrod.HotrodModel:
        def config():
            made = base.config()
            for key, value in changes.items():
                setattr(made, key, value)
            return made

        case = dataclasses.replace(base, name=name, config=config, tokenizer=tokenizer)
        return load_on(build_checkpoint(case, root / name), "torch")

    return {"vocabulary": variant("vocabulary", tokenizer=None, vocab_size=120),
            "tokenizer": variant("tokenizer", tokenizer=save_roberta_tokenizer),
            "positions": variant("positions", n_positions=16)}


@pytest.mark.parametrize(("assistant", "kwargs", "message"), [
    (lambda z, m: object(), {}, "assistant_model must be a model loaded with hotrod.load, got object"),
    (lambda z, m: z.reference("gpt2"), {}, "loaded with hotrod.load, got GPT2LMHeadModel"),
    (lambda z, m: z.model("bert", "onnxruntime"), {}, "assistant_model is a model of kind encoder"),
    (lambda z, m: z.model("t5", "onnxruntime"), {}, "kind seq2seq; this model, of kind decoder"),
    (lambda z, m: m["vocabulary"], {}, "assistant_model has 120 tokens in its vocabulary, this model 100"),
    (lambda z, m: m["tokenizer"], {}, "assistant_model's tokenizer differs from this model's"),
    (lambda z, m: m["positions"], {"max_new_tokens": 20}, "assistant_model has 16 positions, fewer than the 23"),
    (lambda z, m: z.model("gpt2-assistant", "static"), {}, "the assistant's static engine"),
    (lambda z, m: z.model("gpt2-assistant", "onnxruntime"), {"num_beams": 2}, "assistant_model runs with greedy"),
    (lambda z, m: z.model("gpt2-assistant", "onnxruntime"), {"do_sample": True, "num_return_sequences": 2},
     "assistant_model decodes one row at a time"),
    (lambda z, m: z.model("gpt2-assistant", "onnxruntime"), {"prompt_lookup_num_tokens": 3},
     "assistant_model or prompt_lookup_num_tokens, not both"),
    (lambda z, m: z.model("gpt2-assistant", "onnxruntime"), {"num_assistant_tokens": 0}, "from 1 to 64, got 0"),
    (lambda z, m: z.model("gpt2-assistant", "onnxruntime"), {"num_assistant_tokens": 65}, "from 1 to 64, got 65"),
    (lambda z, m: z.model("gpt2-assistant", "onnxruntime"), {"num_assistant_tokens": True}, "from 1 to 64"),
    (lambda z, m: None, {"num_assistant_tokens": 3}, "pass assistant_model too"),
], ids=["object", "transformers", "encoder", "seq2seq", "vocabulary", "tokenizer", "positions", "static", "beams",
        "returns", "lookup", "zero", "many", "bool", "no_assistant"])
def test_bad_assistants_and_settings_are_one_line(zoo, misfits, assistant, kwargs, message):
    model = zoo.model("gpt2", "onnxruntime")
    with pytest.raises(hotrod.HotrodError, match=message) as caught:
        model.generate(torch.tensor([[3, 4, 5]]), assistant_model=assistant(zoo, misfits),
                       **{"max_new_tokens": 4, **kwargs})
    assert "\n" not in str(caught.value)


def test_an_encoder_decoder_takes_an_encoder_decoder_assistant_and_one_row(zoo):
    model = zoo.model("t5", "onnxruntime")
    with pytest.raises(hotrod.HotrodError, match="of kind decoder; this model, of kind seq2seq"):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, assistant_model=zoo.model("gpt2", "onnxruntime"))
    with pytest.raises(hotrod.HotrodError, match="one row at a time; got 2"):
        model.generate(torch.tensor([[3, 4], [5, 6]]), max_new_tokens=4,
                       assistant_model=zoo.model("t5-assistant", "onnxruntime"))


def test_an_assistant_drafts_for_a_padded_row(zoo):
    """A left-padded row: the caches hold its real tokens, the row its padding too."""
    model, assistant = zoo.model("gpt2", "onnxruntime"), zoo.model("gpt2-assistant", "onnxruntime")
    ids, mask = torch.tensor([[0, 0, 7, 8, 9, 10]]), torch.tensor([[0, 0, 1, 1, 1, 1]])
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=12, min_new_tokens=12)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=12, min_new_tokens=12,
                                      assistant_model=assistant), plain)


def test_a_tokenizer_changed_after_a_call_is_compared_again(zoo):
    model, assistant = zoo.model("gpt2", "onnxruntime"), hotrod.load(zoo.artifact("gpt2-assistant"))
    model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, assistant_model=assistant)
    assistant.tokenizer.add_tokens(["zebra-quartz"])
    with pytest.raises(hotrod.HotrodError, match="tokenizer differs"):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, assistant_model=assistant)
