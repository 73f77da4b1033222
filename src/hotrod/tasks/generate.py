"""text-generation and text2text-generation: the language models' tasks, run by `HotrodModel.generate`
(its command and routes are `hotrod generate`, /v1/generate, /v1/completions and /v1/chat/completions)."""

from hotrod.tasks.constants import GENERATE, TEXT2TEXT
from hotrod.tasks.registry import TaskSpec, register
from hotrod.verification.measures import GENERATION

SPEC = register(TaskSpec(GENERATE, kinds=("decoder",), heads=("LMHeadModel", "ForCausalLM"), bare=True,
                         measure=GENERATION, summary="text continued from a prompt"))
SEQ2SEQ = register(TaskSpec(TEXT2TEXT, kinds=("seq2seq",), heads=("ForConditionalGeneration",), bare=True,
                            embeds=True, measure=GENERATION, summary="text generated from an input text"))
