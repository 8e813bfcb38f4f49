"""Issue 44: a fine-tune's source whose weights are in shards (model.safetensors.index.json and the files it names)
is fingerprinted by every shard, so a LoRA run refuses a changed one, and is fetched from the hub whole."""

import fnmatch
import shutil

import pytest
from safetensors.torch import load_file, save_file

from kqv.errors import RunError
from kqv.jobs.finetune import restore_source
from kqv.jobs.init import HUB_FILES, read_source
from kqv.nn.models import DecoderLM
from kqv.train.files import sha256 as file_sha256

INDEX = "model.safetensors.index.json"


@pytest.fixture
def sharded(gpt2_dir, tmp_path):
    """conftest's random GPT-2 directory saved again in shards of at most 20 KB (its tokenizer copied)."""
    from transformers import GPT2LMHeadModel

    path = tmp_path / "sharded"
    shutil.copytree(gpt2_dir, path)
    (path / "model.safetensors").unlink()
    GPT2LMHeadModel.from_pretrained(gpt2_dir).save_pretrained(path, max_shard_size="20KB")
    assert (path / INDEX).is_file() and len(list(path.glob("model-*.safetensors"))) > 2
    return path


def change_a_tensor(shard):
    state = load_file(shard)
    state[next(iter(state))] += 1.0
    save_file(state, shard, metadata={"format": "pt"})


def test_a_changed_shard_of_a_lora_runs_source_is_refused(sharded, tmp_path):
    source = read_source(sharded)
    record = source.record()
    restore_source(DecoderLM(source.config), record, tmp_path / "run")  # as it was: loads
    change_a_tensor(sorted(sharded.glob("model-*.safetensors"))[-1])  # the index stays the same
    with pytest.raises(RunError, match="has changed since the run trained"):
        restore_source(DecoderLM(source.config), record, tmp_path / "run")


def test_a_single_file_source_keeps_its_fingerprint_and_an_index_only_record_still_loads(gpt2_dir, sharded, tmp_path):
    """Run directories written before read the same: a model.safetensors is fingerprinted by its own SHA-256, and a
    sharded source recorded (before issue 44) by its index's SHA-256 alone is still taken."""
    assert read_source(gpt2_dir).weights_sha256 == file_sha256(gpt2_dir / "model.safetensors")
    source = read_source(sharded)
    assert source.weights_sha256 != file_sha256(sharded / INDEX)
    old = {**source.record(), "weights_sha256": file_sha256(sharded / INDEX)}
    restore_source(DecoderLM(source.config), old, tmp_path / "run")


def test_a_sharded_hub_model_is_fetched_with_its_index_and_every_shard(sharded, tmp_path, monkeypatch):
    """`--init someone/gpt2-sharded` fetches the files of HUB_FILES, then the shards its index names, from the same
    revision (no network: the hub is `sharded`, the download copies what the patterns allow)."""
    import huggingface_hub

    cache, calls = tmp_path / "cache" / "0123abcd", []

    def snapshot_download(name, allow_patterns, revision=None):
        calls.append((name, sorted(allow_patterns), revision))
        cache.mkdir(parents=True, exist_ok=True)
        for file in sharded.iterdir():
            if any(fnmatch.fnmatch(file.name, pattern) for pattern in allow_patterns):
                shutil.copy(file, cache / file.name)
        return str(cache)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    source = read_source("someone/gpt2-sharded")
    assert source.path == cache and source.weights_sha256 == read_source(sharded).weights_sha256
    shards = sorted(file.name for file in sharded.glob("model-*.safetensors"))
    assert calls == [("someone/gpt2-sharded", sorted(HUB_FILES), None), ("someone/gpt2-sharded", shards, "0123abcd")]
    assert INDEX in HUB_FILES and not any(p.endswith((".bin", ".pt", ".pkl")) for _, ps, _ in calls for p in ps)
