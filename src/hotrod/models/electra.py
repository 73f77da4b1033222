"""ELECTRA's discriminator: BERT's layers over embeddings of their own size (`embedding_size`), projected to
the hidden size by `embeddings_project` where the two differ. Checkpoints carry the `electra.` prefix; the
classification head is `classifier.dense`, GELU, `classifier.out_proj` on the first token."""

from __future__ import annotations

import functools

from torch import nn

from hotrod.models.bert import BertEmbeddings, BertEncoder, bert_dims
from hotrod.models.heads import ProjectedClassifier
from hotrod.registry import Family, register
from hotrod.tasks.constants import CLASSIFY


class ElectraEmbeddings(BertEmbeddings):
    def __init__(self, config):
        super().__init__(config, width=config.embedding_size)


class ElectraEncoder(BertEncoder):
    embeddings_class = ElectraEmbeddings
    checkpoint_prefixes = ("electra.",)

    def __init__(self, config):
        super().__init__(config)
        differ = config.embedding_size != config.hidden_size
        self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size) if differ else nn.Identity()

    def embed(self, input_ids, token_type_ids):
        return self.embeddings_project(self.embeddings(input_ids, token_type_ids))


FAMILY = register(
    Family(name="electra", model_types=("electra",), kind="encoder", sizes=bert_dims, build=ElectraEncoder,
           onnx_optimizer="bert",
           heads={CLASSIFY: functools.partial(ProjectedClassifier, activation="gelu")})
)
