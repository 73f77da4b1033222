"""Synthetic but realistic data for the demo heads trained on all-MiniLM-L6-v2 (`train_demo_models.py`).

- intents: short requests to an assistant ("wake me up at 6:30 tomorrow") labelled with one of ten intents;
- ner: sentences naming people and places ("Maria Lopez flew from Rio de Janeiro to Oslo"), each word
  tagged O, B-PER, I-PER, B-LOC or I-LOC.

Templates are shared between training and held-out data, but the slot values are not: every filler list is
split in two by a seeded shuffle, and held-out sentences are written only from the held-out half, so the
held-out accuracy measures names, cities and songs the model never saw in training.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

FIRST_NAMES = """james mary john patricia robert jennifer michael linda william elizabeth david barbara richard susan
joseph jessica thomas sarah charles karen maria lucia sofia mateo diego carmen jose ana pedro elena ivan olga
dmitri natasha hans greta klaus ingrid pierre amelie louis chloe marco giulia luca chiara akira yuki hiroshi sakura
wei mei li chen raj priya arjun ananya omar fatima ahmed layla kwame amara chidi ngozi liam emma noah olivia
lars astrid sven freya pablo isabel tomas marta jan eva piotr zofia""".split()
SURNAMES = """smith johnson williams brown jones garcia miller davis rodriguez martinez hernandez lopez gonzalez
wilson anderson thomas taylor moore jackson martin lee thompson white harris clark lewis robinson walker young
allen king wright scott green baker adams nelson hill campbell mitchell roberts carter phillips evans turner torres
parker collins edwards stewart morris murphy cook rogers morgan peterson cooper reed bailey bell kim tanaka sato
suzuki nakamura wang zhang liu patel sharma singh khan ali okafor mensah nguyen tran muller schmidt schneider
fischer weber dubois moreau rossi russo ferrari esposito novak kowalski nowak petrov ivanov larsen hansen
johansson lindqvist""".split()
CITIES = """london paris berlin madrid rome lisbon vienna prague warsaw budapest dublin oslo stockholm helsinki
copenhagen amsterdam brussels zurich geneva athens istanbul cairo nairobi lagos accra johannesburg tokyo osaka
kyoto seoul beijing shanghai mumbai delhi bangalore karachi dubai riyadh tehran moscow kiev toronto montreal
vancouver chicago boston seattle denver houston dallas miami atlanta phoenix sydney melbourne auckland lima
bogota santiago quito caracas havana manila jakarta bangkok hanoi singapore""".split() + [
    "new york", "los angeles", "san francisco", "rio de janeiro", "buenos aires", "mexico city", "hong kong",
    "cape town", "tel aviv", "las vegas", "new delhi", "kuala lumpur", "sao paulo", "san diego", "abu dhabi",
    "st petersburg", "new orleans", "salt lake city", "ho chi minh city", "addis ababa"]
SONGS = """bohemian rhapsody|hotel california|imagine|yesterday|wonderwall|hey jude|billie jean|purple rain|
smells like teen spirit|like a rolling stone|hallelujah|dancing queen|superstition|respect|clocks|yellow|
viva la vida|shape of you|blinding lights|bad guy|rolling in the deep|hello|uptown funk|happy|thriller|
sweet child o mine|back in black|africa|take on me|toxic|crazy in love|halo|umbrella|despacito|
someone like you|let it be|come together|a day in the life|heroes|space oddity""".replace("\n", "").split("|")
ARTISTS = """adele|queen|the beatles|coldplay|beyonce|rihanna|drake|taylor swift|ed sheeran|radiohead|nirvana|
abba|prince|madonna|david bowie|bob dylan|the weeknd|billie eilish|dua lipa|bruno mars""".replace("\n", "").split("|")
FOODS = "italian|thai|sushi|indian|mexican|chinese|french|greek|vegan|korean|pizza|steak|seafood|ramen".split("|")
LANGUAGES = "french|spanish|german|italian|japanese|chinese|korean|portuguese|russian|arabic|dutch|swedish".split("|")
PHRASES = ["good morning", "where is the station", "thank you very much", "how much does this cost",
           "i would like a coffee", "nice to meet you", "see you tomorrow", "the bill please", "i am lost",
           "what time is it", "happy birthday", "where is the bathroom", "i love you", "good night"]

Pools = dict[str, list[str]]


def split_pools(seed: int) -> tuple[Pools, Pools]:
    """Each filler list shuffled with `seed` and cut 75/25 into training and held-out pools, values of each
    word count apart, so that both halves hold multi-word names and cities."""
    lists = {"first": FIRST_NAMES, "last": SURNAMES, "city": CITIES, "song": SONGS, "artist": ARTISTS,
             "food": FOODS, "language": LANGUAGES, "phrase": PHRASES}
    train: Pools = {key: [] for key in lists}
    heldout: Pools = {key: [] for key in lists}
    for key, values in lists.items():
        for words in sorted({len(v.split()) for v in values}):  # multi-word values are split apart
            shuffled = sorted({v for v in values if len(v.split()) == words})
            random.Random(f"{key}-{words}-{seed}").shuffle(shuffled)
            cut = max(1, len(shuffled) // 4) if len(shuffled) > 1 else 0
            heldout[key] += shuffled[:cut]
            train[key] += shuffled[cut:]
    return train, heldout


def _time(rng: random.Random) -> str:
    hour, minute = rng.randint(1, 12), rng.choice([0, 0, 15, 30, 45, 5, 20, 10])
    return rng.choice([f"{hour}:{minute:02d}", f"{hour} {rng.choice(['am', 'pm'])}", f"{hour}:{minute:02d} pm",
                       f"half past {hour}", "noon", "midnight"])


def _when(rng: random.Random) -> str:
    return rng.choice(["today", "tomorrow", "tonight", "this weekend", "on monday", "on friday", "next week",
                       "this afternoon", "on saturday morning", "right now"])


def _amount(rng: random.Random) -> str:
    value = rng.choice([5, 10, 20, 25, 40, 50, 75, 100, 120, 200, 250, 500, 1000, 1500])
    return rng.choice([f"${value}", f"{value} dollars", f"{value} euros", f"€{value}", f"{value} pounds"])


def _minutes(rng: random.Random) -> str:
    return rng.choice(["5 minutes", "ten minutes", "20 minutes", "half an hour", "an hour", "90 seconds",
                       "three minutes", "45 minutes", "2 hours"])


# Each intent: templates over slots; {city}, {person}, {song}... are filled from the pools.
INTENTS: dict[str, list[str]] = {
    "weather": ["what's the weather like in {city} {when}", "will it rain in {city} {when}",
                "do i need an umbrella {when}", "how hot will it be in {city}", "weather forecast for {city}",
                "is it going to snow {when}", "how cold is it outside", "tell me the temperature in {city}"],
    "set_alarm": ["wake me up at {time}", "set an alarm for {time} {when}", "alarm at {time} please",
                  "i need to get up at {time} {when}", "can you set my alarm to {time}",
                  "make sure i'm awake by {time}"],
    "set_timer": ["set a timer for {minutes}", "start a {minutes} timer", "countdown {minutes}",
                  "remind me in {minutes} to check the oven", "timer {minutes} please",
                  "let me know when {minutes} have passed"],
    "play_music": ["play {song}", "play {song} by {artist}", "put on some {artist}", "i want to hear {song}",
                   "can you play something by {artist}", "start my playlist with {song}", "play {artist} {when}"],
    "book_restaurant": ["book a table for {count} at a {food} place {when}", "reserve a {food} restaurant for {count}",
                        "find me a table for {count} {when}", "i'd like to book dinner for {count} in {city}",
                        "get us a reservation at a {food} restaurant at {time}"],
    "transfer_money": ["send {amount} to {person}", "transfer {amount} to {person} {when}", "pay {person} {amount}",
                       "move {amount} to my savings account", "i owe {person} {amount}, send it",
                       "wire {amount} to {person}'s account"],
    "call_contact": ["call {person}", "phone {person} {when}", "give {person} a ring", "dial {person}'s number",
                     "can you call {person} on speaker", "video call {person}"],
    "navigate": ["how do i get to {city}", "directions to {city}", "take me to the airport in {city}",
                 "navigate to {city} avoiding tolls", "how long is the drive to {city}",
                 "what's the fastest route to {city} {when}"],
    "translate": ["how do you say {phrase} in {language}", "translate {phrase} into {language}",
                  "what is {phrase} in {language}", "say {phrase} in {language}",
                  "i need the {language} for {phrase}"],
    "book_flight": ["book a flight to {city} {when}", "find flights from {city} to {city2}",
                    "i need a plane ticket to {city}", "cheapest flight to {city} {when}",
                    "get me on a flight to {city} at {time}", "are there direct flights from {city} to {city2}"],
}


def _fill(template: str, pools: Pools, rng: random.Random) -> str:
    city, city2 = rng.sample(pools["city"], 2)
    slots: dict[str, Callable[[], str]] = {
        "city": lambda: city, "city2": lambda: city2, "when": lambda: _when(rng), "time": lambda: _time(rng),
        "minutes": lambda: _minutes(rng), "song": lambda: rng.choice(pools["song"]),
        "artist": lambda: rng.choice(pools["artist"]), "food": lambda: rng.choice(pools["food"]),
        "count": lambda: rng.choice(["two", "four", "2", "3", "6", "five", "the family"]),
        "amount": lambda: _amount(rng), "language": lambda: rng.choice(pools["language"]),
        "phrase": lambda: rng.choice(pools["phrase"]),
        "person": lambda: rng.choice([rng.choice(pools["first"]), _person(pools, rng)]),
    }
    return template.format(**{key: make() for key, make in slots.items() if "{" + key in template})


def _styled(text: str, rng: random.Random) -> str:
    """As people type requests: capitalized or not, with or without a final '?' / '.', sometimes polite."""
    if rng.random() < 0.2:
        text = rng.choice(["please ", "hey, ", "could you ", "ok "]) + text
    if rng.random() < 0.5:
        text = text[0].upper() + text[1:]
    return text + rng.choice(["", "", "?", ".", " please"])


def intent_examples(pools: Pools, rng: random.Random) -> Iterator[tuple[str, str]]:
    """An endless stream of (request, intent): intents drawn uniformly, then a template, then its slots."""
    names = sorted(INTENTS)
    while True:
        intent = rng.choice(names)
        yield _styled(_fill(rng.choice(INTENTS[intent]), pools, rng), rng), intent


# ---------------------------------------------------------------------------------------------------------
# NER: each template is a list of literal words and {per} / {loc} slots, so word tags are known exactly.

NER_TEMPLATES = [
    "{per} flew from {loc} to {loc} last week .",
    "yesterday {per} met {per} in {loc} .",
    "{per} was born in {loc} and moved to {loc} in 1998 .",
    "the mayor of {loc} , {per} , opened the new bridge .",
    "{per} and {per} are getting married in {loc} next spring .",
    "our office in {loc} is run by {per} .",
    "after the match in {loc} , {per} thanked the fans .",
    "{per} said the trains between {loc} and {loc} will run again on monday .",
    "i am visiting {per} in {loc} for a few days .",
    "the concert in {loc} was cancelled , according to {per} .",
    "{per} works as a nurse in {loc} .",
    "send the package to {per} at the {loc} address .",
    "police in {loc} are looking for {per} .",
    "{per} will take over as coach when the team returns from {loc} .",
    "a new museum opened in {loc} on friday .",
    "{per} has lived in {loc} for ten years .",
    "flights from {loc} were delayed because of the storm .",
    "the book by {per} is set in {loc} during the war .",
    "thanks to {per} , the festival in {loc} raised a lot of money .",
    "{per} called from {loc} to say she is fine .",
    "we drove through {loc} on our way to {loc} .",
    "{per} interviewed {per} about the elections .",
    "the weather in {loc} is lovely this time of year .",
    "professor {per} gave a talk in {loc} about climate change .",
]
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _person(pools: Pools, rng: random.Random) -> str:
    """A first name and surname, sometimes only the surname or only the first name, sometimes two first names."""
    first, last = rng.choice(pools["first"]), rng.choice(pools["last"])
    return rng.choices([f"{first} {last}", last, first, f"{first} {rng.choice(pools['first'])} {last}"],
                       weights=[6, 2, 2, 2])[0]


PLACE_PREFIXES = ["new", "san", "st", "port", "fort", "santa", "el", "la", "north", "south", "east", "west", "lake"]
PLACE_SUFFIXES = ["city", "beach", "springs", "falls", "bay", "heights", "hills", "de la sierra", "del mar", "on sea"]


def _city(pools: Pools, rng: random.Random, compounds: bool = False) -> str:
    """A city, multi-word ones ("rio de janeiro") a third of the time: their inner words are what teaches
    I-LOC. Few cities have several words, so training also makes some up ("port lima", "oslo heights")."""
    several = [c for c in pools["city"] if " " in c]
    if compounds and rng.random() < 0.25:
        city = rng.choice(pools["city"])
        return f"{rng.choice(PLACE_PREFIXES)} {city}" if rng.random() < 0.5 else f"{city} {rng.choice(PLACE_SUFFIXES)}"
    return rng.choice(several if several and rng.random() < 0.35 else pools["city"])


def ner_example(pools: Pools, rng: random.Random, compounds: bool = False) -> tuple[list[str], list[str]]:
    """(words, tags) of one sentence; names and places capitalized in most sentences, as in running text;
    `compounds` (training) makes up some multi-word places."""
    capitalize = rng.random() < 0.8
    words, tags = [], []
    for piece in rng.choice(NER_TEMPLATES).split():
        if piece in ("{per}", "{loc}"):
            kind = "PER" if piece == "{per}" else "LOC"
            value = _person(pools, rng) if kind == "PER" else _city(pools, rng, compounds)
            for i, word in enumerate(value.split()):
                words.append(word.capitalize() if capitalize else word)
                tags.append(("B-" if i == 0 else "I-") + kind)
        else:
            words.append(piece)
            tags.append("O")
    if capitalize:
        words[0] = words[0][0].upper() + words[0][1:]
    return words, tags


def ner_examples(pools: Pools, rng: random.Random, compounds: bool = False) -> Iterator[tuple[list[str], list[str]]]:
    while True:
        yield ner_example(pools, rng, compounds)


def sentence(words: list[str]) -> str:
    """Words joined as text, with no space before punctuation."""
    text = ""
    for word in words:
        text += word if word in {",", ".", "?", "!"} or not text else " " + word
    return text


@dataclass(frozen=True)
class Entity:
    label: str
    text: str


def entities(words: list[str], tags: list[str]) -> list[Entity]:
    """Entities of a tagged sentence: a B- tag opens one, I- tags of the same type extend it."""
    found: list[tuple[str, list[str]]] = []
    for word, tag in zip(words, tags):
        if tag.startswith("B-") or (tag.startswith("I-") and (not found or found[-1][0] != tag[2:])):
            found.append((tag[2:], [word]))
        elif tag.startswith("I-"):
            found[-1][1].append(word)
        else:
            found.append(("O", []))
    return [Entity(label, " ".join(ws)) for label, ws in found if label != "O"]


def distinct(stream: Iterator, count: int, key: Callable, exclude: set | None = None) -> list:
    """`count` items of `stream` with distinct keys, none of them in `exclude`."""
    seen, items = set(exclude or ()), []
    while len(items) < count:
        item = next(stream)
        k = key(item)
        if k not in seen:
            seen.add(k)
            items.append(item)
    return items


# ---------------------------------------------------------------------------------------------------------
# Question answering: a context of several facts, a question about one of them, the answer a span of it.
# Each fact is a sentence over named slots and the questions it answers, each naming the slot that answers.

QA_FACTS: list[tuple[str, list[tuple[str, str]]]] = [
    ("{per} flew from {loc} to {loc2} last week.",
     [("Who flew from {loc} to {loc2}?", "per"), ("Where did {per} fly from?", "loc"),
      ("Where did {per} fly to last week?", "loc2")]),
    ("{per} was born in {loc} and moved to {loc2} in {year}.",
     [("Where was {per} born?", "loc"), ("Where did {per} move in {year}?", "loc2"),
      ("When did {per} move to {loc2}?", "year")]),
    ("The mayor of {loc}, {per}, opened the new bridge.",
     [("Who is the mayor of {loc}?", "per"), ("Which city is {per} the mayor of?", "loc")]),
    ("Our office in {loc} is run by {per}.",
     [("Who runs the office in {loc}?", "per"), ("Where is the office that {per} runs?", "loc")]),
    ("{per} works as a nurse in {loc}.",
     [("Where does {per} work?", "loc"), ("Who works as a nurse in {loc}?", "per")]),
    ("{per} has lived in {loc} for {count} years.",
     [("How long has {per} lived in {loc}?", "count"), ("Who has lived in {loc} for {count} years?", "per")]),
    ("Professor {per} gave a talk about climate change in {loc}.",
     [("Who gave a talk about climate change?", "per"), ("Where was the talk about climate change?", "loc")]),
    ("The train from {loc} to {loc2} leaves at {time}.",
     [("When does the train to {loc2} leave?", "time"), ("Where does the train to {loc2} start?", "loc")]),
    ("{per} paid {amount} for a concert ticket in {loc}.",
     [("How much did {per} pay for the ticket?", "amount"), ("Who paid {amount} for a concert ticket?", "per")]),
    ("The new museum in {loc} was designed by {per} and opened in {year}.",
     [("Who designed the museum in {loc}?", "per"), ("When did the museum in {loc} open?", "year")]),
    ("Police in {loc} are looking for {per}.",
     [("Who are the police looking for?", "per"), ("Where are the police looking for {per}?", "loc")]),
    ("{per} sold {count} paintings at the art fair in {loc}.",
     [("How many paintings did {per} sell?", "count"), ("Where was the art fair?", "loc")]),
]
QA_YEARS = [str(year) for year in range(1950, 2025, 3)]
QA_COUNTS = ["two", "three", "five", "seven", "ten", "twelve", "fifteen", "twenty", "4", "6", "8", "11", "30"]


@dataclass(frozen=True)
class QaExample:
    question: str
    context: str
    answer: str  # as written in the context
    start: int  # its first character there


def _qa_slots(pools: Pools, rng: random.Random, capitalize: bool) -> dict[str, str]:
    city, city2 = rng.sample(pools["city"], 2)
    slots = {"per": _person(pools, rng), "loc": city, "loc2": city2}
    if capitalize:
        slots = {key: " ".join(w.capitalize() for w in value.split()) for key, value in slots.items()}
    return {**slots, "year": rng.choice(QA_YEARS), "count": rng.choice(QA_COUNTS), "time": _time(rng),
            "amount": _amount(rng)}


def qa_example(pools: Pools, rng: random.Random) -> QaExample:
    """A context of two to five facts (distinct kinds, so each question has one answer) and a question
    about one of them; names and places capitalized in most contexts, as in running text."""
    capitalize = rng.random() < 0.8
    facts = rng.sample(QA_FACTS, rng.randint(2, 5))
    asked = rng.randrange(len(facts))
    context, answer, start, question = "", "", 0, ""
    for i, (template, questions) in enumerate(facts):
        slots = _qa_slots(pools, rng, capitalize)
        text = template.format(**slots)
        text = text[0].upper() + text[1:] if capitalize else text.lower()
        if i == asked:
            wording, slot = rng.choice(questions)
            question = wording.format(**slots)
            question = question if capitalize else question.lower()
            before = template[:template.index("{" + slot + "}")].format(**slots)
            answer, start = slots[slot], len(context) + (1 if context else 0) + len(before)
        context += (" " if context else "") + text
    assert context[start:start + len(answer)].lower() == answer.lower()
    return QaExample(question, context, context[start:start + len(answer)], start)


def qa_examples(pools: Pools, rng: random.Random) -> Iterator[QaExample]:
    while True:
        yield qa_example(pools, rng)


# ---------------------------------------------------------------------------------------------------------
# Reranking: a question and candidate passages, one of which answers it. The others are the same kind of fact
# about other people and places, facts about the same person or place that do not answer, and other facts.


@dataclass(frozen=True)
class RerankExample:
    query: str
    passages: list[str]
    answer: int  # the index of the passage that answers


def _fact(template: str, slots: dict[str, str], capitalize: bool) -> str:
    text = template.format(**slots)
    return text[0].upper() + text[1:] if capitalize else text.lower()


def rerank_example(pools: Pools, rng: random.Random, candidates: int = 10) -> RerankExample:
    """A question that names its fact's person or place, its fact, and `candidates - 1` passages that do not
    answer it: two to four of the same kind with other values, a few about the same person or place (other
    kinds of fact), the rest anything."""
    capitalize = rng.random() < 0.8
    named = [(t, q) for t, qs in QA_FACTS for q in qs if "{" in q[0]]
    template, (wording, _) = rng.choice(named)
    slots = _qa_slots(pools, rng, capitalize)
    query = wording.format(**slots)
    passages, seen = [_fact(template, slots, capitalize)], {wording.format(**slots).lower()}
    while len(passages) < rng.randint(3, 5):  # the same kind of fact, asked of other values: does not answer
        other = _qa_slots(pools, rng, capitalize)
        if wording.format(**other).lower() not in seen:
            seen.add(wording.format(**other).lower())
            passages.append(_fact(template, other, capitalize))
    kinds = [t for t, _ in QA_FACTS if t != template]
    for kind in rng.sample(kinds, candidates - len(passages)):  # other kinds, some about the same person or place
        other = _qa_slots(pools, rng, capitalize)
        if rng.random() < 0.4:
            other.update({k: slots[k] for k in ("per", "loc") if "{" + k + "}" in wording})
        passages.append(_fact(kind, other, capitalize))
    order = list(range(candidates))
    rng.shuffle(order)
    return RerankExample(query if capitalize else query.lower(), [passages[i] for i in order], order.index(0))


def rerank_examples(pools: Pools, rng: random.Random) -> Iterator[RerankExample]:
    while True:
        yield rerank_example(pools, rng)
