#!/usr/bin/env python
"""Translation speed with beam search: kqv's `EncoderDecoder.generate` against Hugging Face's `MarianMTModel.generate`.

Both models are the same network: a randomly initialised `MarianMTModel` (post-LN, sinusoidal positions, scaled
and shared embeddings, final logits bias) of the size of kqv's MT configs (d_model 256, 4 heads, 3 + 3 layers,
d_ff 1024, ReLU, vocabulary 8000), and the kqv model made from it by `kqv.interop.from_hf`, so they hold the same
weights. The inputs are the same German verses (from the Bible's test split, encoded with a joint BPE) or, without
a prepared MT run, random token ids of the same lengths. Both decode with beam 4, length penalty 1, the same
maximum of new tokens, in batches of `--batch` sentences, in fp32 under `torch.no_grad()`.

A random model rarely emits EOS, so every beam runs to the maximum length in both libraries: the work is the same
and the timing compares the decoders, not their stopping rules. The runs alternate between the libraries for
`--rounds` rounds; the figure is the median over rounds of sentences per second. We also report whether the two
produced the same translations (they should, up to ties, as their weights and algorithm agree).

    python benchmarks/translation_speed.py            # prints a table, writes benchmarks/results/translation_speed.json
    python benchmarks/translation_speed.py --quick         # a smoke test
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from kqv_lab import benchmarking as harness

PAD, BOS, EOS = 0, 1, 2


def marian(vocab: int, d_model: int, layers: int, heads: int, d_ff: int):
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        activation_function="relu",
        max_position_embeddings=512,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    torch.manual_seed(0)
    return MarianMTModel(config).eval()


def source_batches(
    count: int, batch: int, vocab: int, run: Path | None
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], str]:
    """Right-padded (ids, mask) batches: Bible test verses from a prepared MT run, else random ids."""
    if run is not None and (run / "tokenizer").is_dir():
        from kqv.data import load_tokenizer

        tokenizer = load_tokenizer(run / "tokenizer")
        lines = (run / "data" / "test.src").read_text(encoding="utf-8").splitlines()[:count]
        sequences = [torch.tensor(tokenizer.encode(line)[:60] + [EOS]) for line in lines]
        sequences = [s.clamp(max=vocab - 1) for s in sequences]
        source = f"{len(sequences)} German test verses of {run}"
    else:
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(8, 48, (count,), generator=generator)
        sequences = [
            torch.cat((torch.randint(3, vocab, (int(n),), generator=generator), torch.tensor([EOS]))) for n in lengths
        ]
        source = f"{count} random sequences of 9-48 tokens"
    batches = []
    for start in range(0, len(sequences), batch):
        chunk = sequences[start : start + batch]
        ids = torch.nn.utils.rnn.pad_sequence(chunk, batch_first=True, padding_value=PAD)
        mask = (torch.arange(ids.shape[1])[None, :] < torch.tensor([len(s) for s in chunk])[:, None]).long()
        batches.append((ids, mask))
    return batches, source


def main() -> None:
    output = harness.results_path("translation_speed")
    parser = harness.arguments(__doc__, whole=True, output=output, output_flag="--out", threads=1, quick="a smoke test")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run", default="runs/mt-compare/data", help="a prepared MT run for real source sentences")
    args = parser.parse_args()
    if args.quick:
        args.sentences, args.batch, args.max_new_tokens, args.rounds = 8, 4, 8, 1
    torch.set_num_threads(args.threads)

    from kqv import count_parameters
    from kqv.interop import from_hf

    hf = marian(8000, 256, 3, 4, 1024)
    kqv = from_hf(hf).eval()
    batches, source = source_batches(args.sentences, args.batch, 8000, Path(args.run) if args.run else None)
    sentences = sum(ids.shape[0] for ids, _ in batches)

    def run_kqv() -> list[list[int]]:
        out = []
        for ids, mask in batches:
            out += kqv.generate(
                ids, args.max_new_tokens, beam_size=args.beam, length_penalty=1.0, bos_id=BOS, eos_id=EOS, src_mask=mask
            ).tolist()
        return out

    def run_hf() -> list[list[int]]:
        out = []
        for ids, mask in batches:
            out += hf.generate(
                input_ids=ids,
                attention_mask=mask,
                num_beams=args.beam,
                length_penalty=1.0,
                max_new_tokens=args.max_new_tokens,
                min_new_tokens=0,
                do_sample=False,
                early_stopping=False,
                decoder_start_token_id=BOS,
                eos_token_id=EOS,
                pad_token_id=EOS,
                bad_words_ids=None,
            ).tolist()
        return out

    runners = {"kqv EncoderDecoder.generate": run_kqv, "HF MarianMTModel.generate": run_hf}
    timings: dict[str, list[float]] = {name: [] for name in runners}
    outputs: dict[str, list[list[int]]] = {}
    with torch.no_grad():
        for name, runner in runners.items():  # warm-up, and the translations to compare
            outputs[name] = runner()
        for round_ in range(args.rounds):
            for name in list(runners) if round_ % 2 == 0 else list(reversed(runners)):
                started = time.perf_counter()
                runners[name]()
                timings[name].append(time.perf_counter() - started)

    def strip(row: list[int]) -> list[int]:
        row = row[1:]
        return row[: row.index(EOS)] if EOS in row else row

    same = sum(strip(a) == strip(b) for a, b in zip(*outputs.values()))
    rows = {
        name: {"sentences_per_s": sentences / statistics.median(t), "seconds": statistics.median(t), "rounds": t}
        for name, t in timings.items()
    }
    print(
        f"beam {args.beam}, {args.max_new_tokens} new tokens at most, batches of {args.batch}, {source}, "
        f"{args.threads} thread(s); {count_parameters(kqv) / 1e6:.1f}M parameters each\n"
    )
    print("| decoder | sentences/s | seconds for all |\n| --- | ---: | ---: |")
    for name, row in rows.items():
        print(f"| {name} | {row['sentences_per_s']:.2f} | {row['seconds']:.2f} |")
    ratio = (
        rows["kqv EncoderDecoder.generate"]["sentences_per_s"] / rows["HF MarianMTModel.generate"]["sentences_per_s"]
    )
    print(f"\nkqv / HF speed: {ratio:.2f}x; identical translations: {same}/{sentences}")
    record = {
        "beam": args.beam,
        "max_new_tokens": args.max_new_tokens,
        "batch": args.batch,
        "source": source,
        "threads": args.threads,
        "parameters": count_parameters(kqv),
        "results": rows,
        "kqv_over_hf": ratio,
        "identical_translations": same,
        "sentences": sentences,
    }
    if not args.quick:
        harness.write_record(Path(args.output), record)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
