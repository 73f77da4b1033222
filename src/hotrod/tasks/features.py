"""feature-extraction: the bare encoder's last hidden state, pooled into sentence embeddings by
`HotrodModel.embed` (its command and routes are `hotrod embed`, /v1/embed and /v1/embeddings)."""

from hotrod.tasks.constants import FEATURES
from hotrod.tasks.registry import Output, TaskSpec, register
from hotrod.verification.measures import EMBEDDINGS

SPEC = register(TaskSpec(
    FEATURES, kinds=("encoder",), bare=True, outputs=(Output("last_hidden_state", ("batch", "sequence", "hidden")),),
    embeds=True, measure=EMBEDDINGS, summary="sentence embeddings",
))
