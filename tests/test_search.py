"""kqv.nn.search, the one greedy and beam search of the Transformer and the LSTM baseline.

Most tests drive the search with a table of log-probabilities instead of a model, so the best sequence is known by
enumeration; the last ones check that both models' steppers give greedy decoding at beam size 1.
"""

import itertools

import pytest
import torch

from conftest import tiny_config
from kqv import EncoderDecoder
from kqv.nn.generation import EncoderDecoderStepper
from kqv.nn.rnn import RNNConfig, RNNEncoderDecoder, RNNStepper
from kqv.nn.search import beam_search, greedy_search, search

BOS, EOS = 0, 1


class TableStepper:
    """Next-token log-probabilities from tables (batch, steps, vocab, vocab) indexed by (sentence, step, last token):
    no model, and the answer is known by enumeration."""

    def __init__(self, tables: torch.Tensor):
        self.tables, self.sentence, self.t = tables, torch.arange(tables.shape[0]), 0

    def step(self, last_ids: torch.Tensor) -> torch.Tensor:
        log_probs = self.tables[self.sentence, self.t, last_ids]
        self.t += 1
        return log_probs

    def reorder(self, rows: torch.Tensor) -> None:
        self.sentence = self.sentence[rows]


def random_tables(batch: int, steps: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(batch, steps, vocab, vocab, generator=generator)).log_softmax(-1)


def log_prob(tables: torch.Tensor, sentence: int, tokens: tuple[int, ...]) -> float:
    last, total = BOS, 0.0
    for t, token in enumerate(tokens):
        total += float(tables[sentence, t, last, token])
        last = token
    return total


def best_by_enumeration(tables: torch.Tensor, sentence: int, length_penalty: float) -> tuple[int, ...]:
    """Among every sequence that ends in EOS or reaches the last step, the best log-probability / length^penalty."""
    steps, vocab = tables.shape[1], tables.shape[2]
    candidates = [
        s
        for n in range(1, steps + 1)
        for s in itertools.product(range(1, vocab), repeat=n)
        if EOS not in s[:-1] and (n == steps or s[-1] == EOS)
    ]
    return max(candidates, key=lambda s: log_prob(tables, sentence, s) / len(s) ** length_penalty)


def generated(row: torch.Tensor) -> tuple[int, ...]:
    tokens = row[1:].tolist()
    return tuple(tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens)


@pytest.mark.parametrize("seed", range(5))
def test_beam_size_one_is_greedy_decoding(seed):
    tables = random_tables(3, 6, 5, seed)
    greedy = greedy_search(TableStepper(tables), 3, 6, bos_id=BOS, eos_id=EOS)
    beam = beam_search(TableStepper(tables), 3, 6, beam_size=1, length_penalty=1.0, bos_id=BOS, eos_id=EOS)
    assert torch.equal(beam[:, : greedy.shape[1]], greedy)
    assert (beam[:, greedy.shape[1] :] == EOS).all()


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
@pytest.mark.parametrize("seed", range(4))
def test_an_exhaustive_beam_finds_the_best_sequence(seed, length_penalty):
    """Vocabulary 4 (BOS is never generated: its row of the table is used for the first step only), 3 steps: at most
    27 sequences, all of them in a beam of 27."""
    tables = random_tables(2, 3, 4, seed)
    tables[:, :, :, BOS] = float("-inf")
    out = beam_search(TableStepper(tables), 2, 3, beam_size=27, length_penalty=length_penalty, bos_id=BOS, eos_id=EOS)
    for sentence in range(2):
        assert generated(out[sentence]) == best_by_enumeration(tables, sentence, length_penalty)


def two_endings() -> torch.Tensor:
    """EOS right away costs 1.0 nats; token 2 then EOS costs 0.7 + 0.5 = 1.2: shorter by total, longer per token."""
    tables = torch.full((1, 3, 4, 4), -20.0)
    tables[0, 0, BOS, EOS], tables[0, 0, BOS, 2] = -1.0, -0.7
    tables[0, 1, 2, EOS] = -0.5
    tables[0, 1:, EOS, EOS] = 0.0
    return tables


def test_length_penalty_zero_ranks_by_total_log_probability_and_one_by_per_token():
    options = dict(beam_size=2, bos_id=BOS, eos_id=EOS)
    assert generated(beam_search(TableStepper(two_endings()), 1, 3, length_penalty=0.0, **options)[0]) == (EOS,)
    assert generated(beam_search(TableStepper(two_endings()), 1, 3, length_penalty=1.0, **options)[0]) == (2, EOS)


def test_every_sentence_is_searched_as_if_alone_and_padded_with_eos_after_its_end():
    tables = random_tables(4, 7, 6, seed=11)
    together = beam_search(TableStepper(tables), 4, 7, beam_size=3, length_penalty=1.0, bos_id=BOS, eos_id=EOS)
    for sentence in range(4):
        alone = beam_search(
            TableStepper(tables[sentence : sentence + 1]), 1, 7, beam_size=3, length_penalty=1.0, bos_id=BOS, eos_id=EOS
        )
        assert torch.equal(together[sentence, : alone.shape[1]], alone[0])
        assert (together[sentence, alone.shape[1] :] == EOS).all()
        row = together[sentence, 1:].tolist()
        if EOS in row:
            assert set(row[row.index(EOS) :]) == {EOS}


def test_bad_search_options_are_named():
    with pytest.raises(ValueError, match="beam_size must be a positive integer"):
        search(TableStepper(random_tables(1, 2, 3, 0)), 1, 2, bos_id=BOS, eos_id=EOS, beam_size=0)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        search(TableStepper(random_tables(1, 2, 3, 0)), 1, 0, bos_id=BOS, eos_id=EOS)


def model_steppers(seed: int):
    """(name, a fresh stepper for each call) for both models on a padded batch of 3 sources."""
    torch.manual_seed(seed)
    src = torch.randint(3, 23, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    src = src.masked_fill(mask == 0, 0)
    transformer = EncoderDecoder(tiny_config(vocab_size=23)).eval()
    lstm = RNNEncoderDecoder(RNNConfig(vocab_size=23, d_embed=12, d_hidden=16, n_layers=2, dropout=0.0)).eval()
    yield lambda: EncoderDecoderStepper(transformer, src, mask, use_cache=True)
    yield lambda: RNNStepper(lstm, *lstm.encode(src, mask), use_cache=True)


@pytest.mark.parametrize("seed", range(2))
@torch.no_grad()
def test_both_models_beam_size_one_is_their_greedy_decoding(seed):
    for stepper in model_steppers(seed):
        greedy = greedy_search(stepper(), 3, 10, bos_id=1, eos_id=2)
        beam = beam_search(stepper(), 3, 10, beam_size=1, length_penalty=1.0, bos_id=1, eos_id=2)
        assert torch.equal(beam[:, : greedy.shape[1]], greedy)
        assert (beam[:, greedy.shape[1] :] == 2).all()
