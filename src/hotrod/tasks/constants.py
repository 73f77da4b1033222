"""The built-in tasks' names, as transformers' pipelines call them: what families name in their own head
tables and what `--task` takes. Each task's spec is in its own module of this package."""

FEATURES = "feature-extraction"  # the bare encoder: last hidden state (embeddings)
CLASSIFY = "text-classification"  # sequence classification, regression, cross-encoders
RERANK = "rerank"  # a variant of text-classification: a one-label head's score of (query, document) pairs
ZERO_SHOT = "zero-shot-classification"  # a variant of text-classification: an NLI head's entailment of labels
TOKENS = "token-classification"  # NER, POS
ANSWER = "question-answering"  # extractive: start and end logits
GENERATE = "text-generation"
TEXT2TEXT = "text2text-generation"
SPARSE = "sparse-embedding"  # a masked-LM head run as SPLADE: one weight per vocabulary entry
