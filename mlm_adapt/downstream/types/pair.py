"""``pair_classification``: one class per text pair (CLUE AFQMC, OCNLI, CMNLI; paraphrase, matching).

A sequence classification whose second text is required; the columns default to CLUE's jsonl
(``sentence1``, ``sentence2``, ``label``), so those files work as they are. Rows are ``tokenizer(text,
text_pair)``: ``[CLS] text [SEP] pair [SEP]`` with segment ids for BERT, each family's own format otherwise.
"""

from __future__ import annotations

from mlm_adapt.downstream.types.sequence import SequenceClassification


class PairClassification(SequenceClassification):
    """One class per text pair."""

    name = "pair_classification"
    default_columns = {"text_column": "sentence1", "text_pair_column": "sentence2", "label_column": "label"}
    required = ("text_pair_column",)
