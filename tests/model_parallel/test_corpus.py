"""course.model_parallel.corpus: the grammar text is reproducible, encodes losslessly, batches are shifted
windows."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.model_parallel import corpus

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's


def test_the_same_seed_gives_the_same_text_and_another_seed_another():
    assert corpus.sentences(50, seed=3) == corpus.sentences(50, seed=3)
    assert corpus.sentences(50, seed=3) != corpus.sentences(50, seed=4)


def test_every_sentence_follows_the_grammar():
    words = set(corpus.ARTICLES + corpus.ADJECTIVES + corpus.NOUNS + corpus.VERBS)
    for sentence in corpus.sentences(100, seed=1).split("."):
        tokens = sentence.split()
        if tokens:
            assert set(tokens) <= words
            assert tokens[0] in corpus.ARTICLES and sum(t in corpus.VERBS for t in tokens) == 1


def test_encode_then_decode_gives_the_text_back():
    text = corpus.sentences(20)
    vocabulary = corpus.vocabulary()
    assert vocabulary.decode(vocabulary.encode(text)) == text
    assert vocabulary.size == len(set(corpus.sentences(2000)))


def test_unknown_characters_are_named():
    with pytest.raises(ValueError, match=r"\['Z'\] are not in the vocabulary"):
        corpus.vocabulary().encode("the Zebra")


@settings(max_examples=25, deadline=None)
@given(batch_size=st.integers(1, 8), seq_len=st.integers(1, 40), seed=st.integers(0, 100))
def test_targets_are_the_inputs_one_token_on(batch_size, seq_len, seed):
    tokens = corpus.vocabulary().encode(corpus.sentences(10))
    inputs, targets = corpus.batch(tokens, batch_size, seq_len, torch.Generator().manual_seed(seed))
    assert inputs.shape == targets.shape == (batch_size, seq_len)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    text = corpus.vocabulary().decode(tokens)
    for row, target in zip(inputs, targets, strict=True):
        window = corpus.vocabulary().decode(torch.cat([row, target[-1:]]))
        assert window in text


def test_a_window_longer_than_the_text_is_refused():
    with pytest.raises(ValueError, match="seq_len must be an integer number of tokens from 1 to 4"):
        corpus.batch(torch.arange(5), 2, 5)
