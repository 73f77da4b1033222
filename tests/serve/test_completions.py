"""OpenAI's completions fields against the fake worker: stop, n, seed, logprobs, echo, include_usage."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from hotrod.serve.app import create_app
from hotrod.serve.choices import Choice
from hotrod.serve.limits import ServeLimits
from hotrod.serve.messages import TokenLogprobs
from tests.serve.fake import expected_tokens
from tests.serve.test_app import events


@pytest.fixture
def client(gpt):
    with TestClient(create_app({"gpt": gpt}, ServeLimits(max_new_tokens_limit=40, max_batch_inputs=40))) as client:
        yield client


def _text(gpt, prompt: str, count: int) -> str:
    return gpt.decode(expected_tokens(gpt.encode(prompt), count))


def _streamed(client, body: dict) -> list[dict]:
    return events(client.post("/v1/completions", json={**body, "stream": True}))


def test_stop_ends_the_text_before_the_stop_string_and_frees_the_slot(client, gpt):
    full = _text(gpt, "hi", 8)  # "jklmnopq"
    body = {"prompt": "hi", "max_tokens": 8, "stop": ["xyz", full[3:5]]}
    answer = client.post("/v1/completions", json=body).json()
    assert answer["choices"][0]["text"] == full[:3] and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == 5  # up to the token that completed the stop string
    assert gpt.tickets[-1].cancelled  # the rest is not generated
    chunks = _streamed(client, body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full[:3]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(full[3:5] not in c["choices"][0]["text"] for c in chunks)


def test_n_choices_with_a_seed_sample_with_consecutive_seeds(client, gpt):
    body = {"prompt": "hi", "max_tokens": 4, "n": 3, "seed": 5, "temperature": 0.7}
    answer = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert [params.seed for _, params in gpt.submitted] == [5, 6, 7]
    assert all(c["text"] == _text(gpt, "hi", 4) for c in answer["choices"])
    assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 12, "total_tokens": 14}
    chunks = _streamed(client, body)
    for index in range(3):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["text"] for c in mine) == _text(gpt, "hi", 4) and mine[-1]["finish_reason"] == "length"


def test_logprobs_of_each_token_and_the_most_likely_ones(client, gpt):
    answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "logprobs": 2}).json()
    logprobs = answer["choices"][0]["logprobs"]
    tokens = expected_tokens(gpt.encode("hi"), 3)
    assert logprobs["tokens"] == [gpt.decode([t]) for t in tokens]
    assert logprobs["token_logprobs"] == [-0.25, -0.5, -0.75] and logprobs["text_offset"] == [0, 1, 2]
    assert logprobs["top_logprobs"][0] == {gpt.decode([tokens[0]]): -0.25, gpt.decode([tokens[0] + 1]): -1.25}
    assert gpt.submitted[-1][1].logprobs == 2
    chunks = _streamed(client, {"prompt": "hi", "max_tokens": 3, "logprobs": 0})
    assert [c["choices"][0]["logprobs"]["token_logprobs"] for c in chunks] == [[-0.25], [-0.5], [-0.75]]
    assert chunks[0]["choices"][0]["logprobs"]["top_logprobs"] is None


def test_echo_puts_the_prompt_first(client, gpt):
    answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "echo": True}).json()
    assert answer["choices"][0]["text"] == "hi" + _text(gpt, "hi", 2)
    chunks = _streamed(client, {"prompt": "hi", "max_tokens": 2, "echo": True})
    assert chunks[0]["choices"][0]["text"] == "hi"
    assert "".join(c["choices"][0]["text"] for c in chunks) == "hi" + _text(gpt, "hi", 2)


def test_usage_is_streamed_only_when_asked(client):
    plain = _streamed(client, {"prompt": "hi", "max_tokens": 2})
    assert all("usage" not in c for c in plain)
    chunks = _streamed(client, {"prompt": "hi", "max_tokens": 2, "stream_options": {"include_usage": True}})
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert all("usage" not in c for c in chunks[:-1])


def test_a_stop_string_split_across_tokens_is_never_sent_in_part():
    pieces = ["Hel", "lo, wor", "ld", "!"]
    choice = Choice(lambda ids: "".join(pieces[i] for i in ids), ["o, world"], None)
    sent = [choice.add([i])[0] for i in range(4)] + [choice.flush()[0]]
    assert "".join(sent) == "Hell" and choice.stopped and choice.tokens == 3
    choice = Choice(lambda ids: "".join(pieces[i] for i in ids), ["world?"], None)
    sent = [choice.add([i])[0] for i in range(4)] + [choice.flush()[0]]
    assert "".join(sent) == "Hello, world!" and not choice.stopped  # held back "world", then let go


def test_logprob_tokens_are_the_text_each_token_added_in_context():
    words = ["▁Hello", "▁world", "!"]

    def sentencepiece(ids: list[int]) -> str:  # drops the leading space of what it decodes
        return "".join(words[i] for i in ids).replace("▁", " ").lstrip()

    choice = Choice(sentencepiece, [], 0)
    entry = TokenLogprobs(-1.0, [])
    text = "".join(choice.add([i], [entry])[0] for i in range(3)) + choice.flush()[0]
    assert choice.logprobs.tokens == ["Hello", " world", "!"] and "".join(choice.logprobs.tokens) == text
    assert choice.logprobs.text_offset == [0, 5, 11]


def test_an_alternative_after_a_held_back_character_is_keyed_with_it():
    pieces = [b"a", b"\xe2", b"\x82", b"\xac", b"x", b"\xac!"]  # the euro sign in three tokens

    def decode(ids: list[int]) -> str:
        return b"".join(pieces[i] for i in ids).decode("utf-8", "replace")

    choice = Choice(decode, [], 2)
    for token in (0, 1, 2):  # "a", then two bytes of a character held back
        choice.add([token], [TokenLogprobs(-0.5, [(token, -0.5)])])
    choice.add([3], [TokenLogprobs(-0.5, [(3, -0.5), (5, -1.0)])])
    assert choice.logprobs.tokens == ["a", "", "", "\u20ac"]
    assert choice.logprobs.top_logprobs[-1] == {"\u20ac": -0.5, "\u20ac!": -1.0}


def test_the_most_likely_tokens_are_keyed_by_their_text_in_context():
    words = ["▁Hello", "▁world", "!", "▁there", "▁World", "▁world"]  # 5 reads as 1 does

    def sentencepiece(ids: list[int]) -> str:
        return "".join(words[i] for i in ids).replace("▁", " ").lstrip()

    choice = Choice(sentencepiece, [], 3)
    choice.add([0], [TokenLogprobs(-0.5, [(0, -0.5)])])
    # the chosen token second in likelihood; an alternative that reads like a likelier one keeps its logprob
    choice.add([1], [TokenLogprobs(-1.0, [(4, -0.9), (1, -1.0), (3, -2.0), (5, -3.0)])])
    assert choice.logprobs.tokens == ["Hello", " world"]
    assert choice.logprobs.top_logprobs == [{"Hello": -0.5}, {" World": -0.9, " world": -1.0, " there": -2.0}]


def test_streamed_logprobs_wait_with_text_held_for_a_stop_string(client, gpt):
    full = _text(gpt, "hi", 8)
    chunks = _streamed(client, {"prompt": "hi", "max_tokens": 8, "logprobs": 0, "stop": [full[3:5]]})
    tokens = [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]
    assert "".join(tokens) == "".join(c["choices"][0]["text"] for c in chunks) == full[:3]


@pytest.mark.parametrize("name", ["gpt2", "marian"])
def test_a_decoders_text_continues_its_prompt_on_every_route(zoo, started, name):
    """A decoder's answer is read after its prompt, as the whole sequence decodes: the zoo's GPT-2 has a
    SentencePiece-style tokenizer, whose word-initial token alone loses its space ("hello world" + "▁world"
    read "hello worldworld"). An encoder-decoder's answer starts anew: it is the generated ids' own text."""
    from hotrod.serve.worker import ModelWorker, ServeOptions

    model = zoo.model(name, "torch")
    worker = started(ModelWorker(name, model, ServeOptions(max_batch_size=4, max_queue_delay_ms=1.0, max_queue=8)))
    tokenizer = model.tokenizer
    with TestClient(create_app({name: worker}, ServeLimits(max_new_tokens_limit=40))) as http:
        for prompt in ("hello world", "the quick brown fox"):
            ids = tokenizer(prompt)["input_ids"]
            answer = http.post("/v1/generate", json={"text": prompt, "max_new_tokens": 6}).json()
            whole = tokenizer.decode(ids + answer["token_ids"], skip_special_tokens=True)
            expected = whole[len(tokenizer.decode(ids, skip_special_tokens=True)):] if model.spec.continues_prompt \
                else tokenizer.decode(answer["token_ids"], skip_special_tokens=True)
            assert answer["text"] == expected
            streamed = events(http.post("/v1/generate", json={"text": prompt, "max_new_tokens": 6, "stream": True}))
            assert "".join(c["text"] for c in streamed) == expected
            body = {"prompt": prompt, "max_tokens": 6}
            assert http.post("/v1/completions", json=body).json()["choices"][0]["text"] == expected
            echoed = http.post("/v1/completions", json={**body, "echo": True}).json()["choices"][0]["text"]
            assert echoed == prompt + expected
            chunks = events(http.post("/v1/completions", json={**body, "stream": True}))
            assert "".join(c["choices"][0]["text"] for c in chunks) == expected
            v2 = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
                  "parameters": {"max_new_tokens": 6}}
            outputs = http.post(f"/v2/models/{name}/infer", json=v2).json()["outputs"]
            assert next(o for o in outputs if o["name"] == "text_output")["data"] == [expected]


def test_openai_fields_at_values_that_change_nothing_are_taken(client, gpt):
    """What LangChain's OpenAI LLM sends on every call (penalties 0, no bias, best_of = n), and OpenAI's
    nullable fields as null, answer as if left out; other values of those fields are refused by name."""
    plain = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4}).json()["choices"]
    neutral = {"prompt": "hi", "max_tokens": 4, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
               "best_of": 1, "suffix": None, "n": None, "echo": None, "stream": None, "temperature": None,
               "top_p": None, "logprobs": None, "stop": None, "seed": None, "user": None}
    answer = client.post("/v1/completions", json=neutral)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"] == plain
    default = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": None}).json()
    assert default["usage"]["completion_tokens"] == 16  # OpenAI's default, as when left out
    two = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "n": 2, "best_of": 2}).json()
    assert len(two["choices"]) == 2


def test_a_list_of_prompts_answers_each_as_alone(client, gpt):
    """OpenAI's batched prompt (LangChain's OpenAI LLM sends a list; lm-eval's batches): texts or token-id
    rows, choice i * n + j the j-th of prompt i, each as that prompt alone would get it."""
    prompts = ["hi", "yo there"]
    body = {"prompt": prompts, "max_tokens": 3, "n": 2, "seed": 3, "temperature": 0.5, "echo": True}
    answer = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    for i, prompt in enumerate(prompts):
        alone = client.post("/v1/completions", json={**body, "prompt": prompt}).json()["choices"]
        assert [c["text"] for c in answer["choices"][2 * i:2 * i + 2]] == [c["text"] for c in alone]
        assert alone[0]["text"].startswith(prompt)
    assert [p.seed for _, p in gpt.submitted[:4]] == [3, 4, 3, 4]
    assert answer["usage"]["prompt_tokens"] == sum(len(gpt.encode(p)) for p in prompts)
    assert answer["usage"]["completion_tokens"] == 12
    rows = [gpt.encode(p) for p in prompts]
    by_ids = client.post("/v1/completions", json={"prompt": rows, "max_tokens": 3}).json()["choices"]
    assert [c["text"] for c in by_ids] == [_text(gpt, p, 3) for p in prompts]
    chunks = _streamed(client, {"prompt": prompts, "max_tokens": 3})
    for index, prompt in enumerate(prompts):
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == index) == \
            _text(gpt, prompt, 3)


@pytest.mark.parametrize("prompt, words", [
    ([], "prompt: the list is empty"),
    (["hi", ""], "prompt[1]"),
    (["hi"] * 41, "41 prompts of n=1 choices make 41; this server takes at most 40"),
    (["hi", "x" * 63], "prompt[1]: the prompt's 63 tokens plus max_tokens=2 exceed"),
    (["a", "b", None], "prompt[2]: Input should be a valid string"),  # the type its first items set
    (["a", 5], "prompt[1]: Input should be a valid string"),
    ([[5, 6], [7, "x"]], "prompt[1][1]: Input should be a valid integer"),
])
def test_a_bad_list_of_prompts_is_refused_naming_it(client, gpt, prompt, words):
    answer = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert answer.status_code == 400 and words in answer.json()["error"]["message"], answer.text
    assert answer.json()["error"]["param"].startswith("prompt") and not gpt.submitted


def test_one_prompts_choices_are_bounded_by_n_alone(gpt):
    """--max-batch-inputs bounds a list of prompts' choices; one prompt's n is OpenAI's field, up to 16."""
    with TestClient(create_app({"gpt": gpt}, ServeLimits(max_batch_inputs=4))) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "n": 16})
        assert answer.status_code == 200 and len(answer.json()["choices"]) == 16


def test_the_official_client_batches_retrieves_and_reads_refusals_as_bad_requests(client, gpt):
    """The `openai` client itself, with its defaults: a list of prompts with the neutral fields LangChain
    sends, models.retrieve, and an invalid field raised as BadRequestError (a 422 was another exception)."""
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(api_key="unused", base_url="http://testserver/v1", http_client=client)
    answer = api.completions.create(model="gpt", prompt=["hi", "yo there"], max_tokens=3, presence_penalty=0,
                                    frequency_penalty=0, best_of=1, logit_bias={})
    assert [c.index for c in answer.choices] == [0, 1]
    assert [c.text for c in answer.choices] == [_text(gpt, "hi", 3), _text(gpt, "yo there", 3)]
    assert api.models.retrieve("gpt").id == "gpt"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        api.completions.create(model="gpt", prompt="hi", temperature=5)
    with pytest.raises(openai.BadRequestError, match="presence_penalty: 0.5 is not supported"):
        api.completions.create(model="gpt", prompt="hi", presence_penalty=0.5)
    with pytest.raises(openai.NotFoundError, match="'nope' is not served"):
        api.models.retrieve("nope")
    # what the client types and OpenAI takes: a negative seed, stream obfuscation
    seeded = api.completions.create(model="gpt", prompt="hi", max_tokens=2, seed=-7, temperature=0.5)
    assert seeded.choices[0].text and gpt.submitted[-1][1].seed == -7
    chunks = list(api.completions.create(model="gpt", prompt="hi", max_tokens=2, stream=True,
                                         stream_options={"include_obfuscation": True, "include_usage": True}))
    assert all(len(c.model_extra["obfuscation"]) >= 1 for c in chunks) and chunks[-1].usage.completion_tokens == 2
    assert "".join(c.choices[0].text for c in chunks[:-1]) == _text(gpt, "hi", 2)
    plain = list(api.completions.create(model="gpt", prompt="hi", max_tokens=2, stream=True))
    assert all("obfuscation" not in (c.model_extra or {}) for c in plain)
