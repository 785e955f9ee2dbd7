"""The model a run uses: its exact fingerprint (and the cache behind it), and bad settings refused by name."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from safetensors.torch import save_file

from restkv.eval.harness.config_tree import CONFIGS
from restkv.eval.models import fingerprint as models
from restkv.eval.models.fingerprint import fingerprint_scheme_matches, weights_fingerprint
from restkv.eval.models.spec import ModelSpec, check_model

MODEL_CONFIGS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))
HUB_ID = "meta-llama/Llama-3.1-8B-Instruct"
TENSORS = 48  # 64 KiB each: a 3 MiB file, larger than the first and last MiB together


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty hash cache."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(models.CACHE_ENV, str(folder))
    return folder / models.CACHE_FILE


def tensors(zeroed: range = range(0)) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    made = {f"layer{i:02d}.weight": torch.randn(128, 128, generator=generator) for i in range(TENSORS)}
    return {name: torch.zeros_like(t) if i in zeroed else t for i, (name, t) in enumerate(made.items())}


def model_folder(root: Path, age_seconds: float = 3600) -> Path:
    """A local model folder (weights, config, tokenizer) whose files were last written ``age_seconds`` ago."""
    folder = root / "model"
    folder.mkdir()
    save_file(tensors(), folder / "model.safetensors")
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    age(folder, age_seconds)
    return folder


def age(folder: Path, seconds: float) -> None:
    stamp = time.time() - seconds
    for file in folder.iterdir():
        os.utime(file, (stamp, stamp))


def spec(path: Path | str, **changes: object) -> ModelSpec:
    return ModelSpec(name="m", path=str(path), **changes)  # type: ignore[arg-type]


def test_a_change_in_the_middle_of_the_weights_changes_the_fingerprint(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    before = weights_fingerprint(spec(folder))
    size = (folder / "model.safetensors").stat().st_size
    save_file(tensors(zeroed=range(16, 32)), folder / "model.safetensors")  # 16 tensors retrained in the middle
    assert (folder / "model.safetensors").stat().st_size == size > 3 << 20
    after = weights_fingerprint(spec(folder))
    assert before is not None and after is not None and after != before
    assert after.startswith("sha256:") and len(after) == len("sha256:") + 64


def test_fingerprint_covers_config_tokenizer_and_seed_not_model_cards(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    first = weights_fingerprint(spec(folder))
    (folder / "README.md").write_text("a model card edit")
    assert weights_fingerprint(spec(folder)) == first
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    second = weights_fingerprint(spec(folder))
    assert second != first
    assert weights_fingerprint(spec(folder, random_init=True)) != weights_fingerprint(
        spec(folder, random_init=True, seed=1)
    )
    assert weights_fingerprint(spec(HUB_ID)) is None


def test_random_weights_are_identified_without_reading_weight_files(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    random = weights_fingerprint(spec(folder, random_init=True))
    save_file(tensors(zeroed=range(1)), folder / "model.safetensors")
    assert weights_fingerprint(spec(folder, random_init=True)) == random


def test_second_call_reads_the_cache_not_the_files(tmp_path: Path, cache: Path, monkeypatch) -> None:
    folder = model_folder(tmp_path)
    first = weights_fingerprint(spec(folder))
    entries = json.loads(cache.read_text())["files"]
    weights = folder / "model.safetensors"
    assert entries[str(weights.resolve())] == {
        "size": weights.stat().st_size,
        "mtime_ns": weights.stat().st_mtime_ns,
        "ino": weights.stat().st_ino,
        "ctime_ns": weights.stat().st_ctime_ns,
        "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
    }
    assert len(entries) == 3  # weights, config, tokenizer

    def no_reading(file: Path, bar: object) -> str:
        raise AssertionError(f"{file} was read again")

    monkeypatch.setattr(models, "_sha256", no_reading)
    assert weights_fingerprint(spec(folder)) == first


def test_a_touched_file_is_hashed_again(tmp_path: Path, monkeypatch) -> None:
    folder = model_folder(tmp_path)
    first = weights_fingerprint(spec(folder))
    age(folder, 7200)  # same bytes, other mtime
    read: list[str] = []
    real = models._sha256
    monkeypatch.setattr(models, "_sha256", lambda file, bar: read.append(file.name) or real(file, bar))
    assert weights_fingerprint(spec(folder)) == first
    assert sorted(read) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_files_written_just_now_are_not_cached(tmp_path: Path, cache: Path) -> None:
    folder = model_folder(tmp_path, age_seconds=0)
    weights_fingerprint(spec(folder))
    assert not cache.exists()  # a same-size rewrite within the timestamp tick would look unchanged


@pytest.mark.parametrize("content", ["not json {", '["a list"]', '{"files": 3}'])
def test_a_corrupt_cache_is_ignored_and_replaced(tmp_path: Path, cache: Path, content: str, capsys) -> None:
    folder = model_folder(tmp_path)
    expected = weights_fingerprint(spec(folder))
    cache.write_text(content)
    assert weights_fingerprint(spec(folder)) == expected
    assert "ignoring the unreadable file-hash cache" in capsys.readouterr().err
    assert len(json.loads(cache.read_text())["files"]) == 3


def test_a_wrong_cache_entry_is_ignored(tmp_path: Path, cache: Path) -> None:
    folder = model_folder(tmp_path)
    expected = weights_fingerprint(spec(folder))
    key = str((folder / "model.safetensors").resolve())
    content = json.loads(cache.read_text())
    content["files"][key]["sha256"] = "not a digest"
    cache.write_text(json.dumps(content))
    assert weights_fingerprint(spec(folder)) == expected


def test_an_unwritable_cache_does_not_stop_a_run(tmp_path: Path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(models.CACHE_ENV, str(blocker / "cache"))  # cannot be created: its parent is a file
    folder = model_folder(tmp_path)
    assert fingerprint_scheme_matches(weights_fingerprint(spec(folder)) or "")
    assert "cannot write the file-hash cache" in capsys.readouterr().err


def test_cache_folder_follows_the_environment(tmp_path: Path, monkeypatch) -> None:
    assert models.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv(models.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "restkv"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert models.cache_dir() == Path.home() / ".cache" / "restkv"


def test_large_first_hashes_show_progress(tmp_path: Path, monkeypatch, capsys) -> None:
    folder = model_folder(tmp_path)
    monkeypatch.setattr(models, "PROGRESS_BYTES", 1 << 20)
    weights_fingerprint(spec(folder))
    assert "hashing model files" in capsys.readouterr().err
    weights_fingerprint(spec(folder))  # cached: nothing to show
    assert "hashing model files" not in capsys.readouterr().err


def test_old_fingerprints_are_told_apart_from_other_weights(tmp_path: Path) -> None:
    new = weights_fingerprint(spec(model_folder(tmp_path)))
    assert new is not None and fingerprint_scheme_matches(new) and fingerprint_scheme_matches(new + "\n")
    assert not fingerprint_scheme_matches("0123456789abcdef")  # the sampled scheme's 16 hex digits


# ---------------------------------------------------------------------------------------------
# check_model
# ---------------------------------------------------------------------------------------------


def refused(model: ModelSpec) -> str:
    with pytest.raises(ValueError) as caught:
        check_model(model)
    return str(caught.value)


@pytest.mark.parametrize("name", ["micro-llama", "tiny-random-llama"])
def test_bundled_models_pass(name: str) -> None:
    check_model(spec(f"models/{name}", random_init=name == "tiny-random-llama"))


def _hub(monkeypatch, reachable: bool, cache: Path) -> None:
    """The hub as reachable or not (no real connection either way), its cache at ``cache``."""
    from huggingface_hub import constants

    from restkv.eval.models import hub

    hub.hub_reachable.cache_clear()
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: reachable)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))


def _cached(cache: Path, repo_id: str) -> Path:
    """A model in the hub cache's layout: ``models--owner--name/{refs/main, snapshots/<commit>/config.json}``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_a_hub_id_passes_when_the_hub_answers(monkeypatch, tmp_path) -> None:
    _hub(monkeypatch, True, tmp_path)
    check_model(spec(HUB_ID))
    check_model(spec(HUB_ID, tokenizer="Qwen/Qwen2.5-7B-Instruct"))


def test_a_hub_model_neither_cached_nor_reachable_is_refused_at_once(monkeypatch, tmp_path) -> None:
    """The hub libraries retried for minutes (109 lines), then failed with a traceback naming nothing of ours."""
    from restkv.eval.models.spec import ModelUnavailable

    _hub(monkeypatch, False, tmp_path)
    with pytest.raises(ModelUnavailable) as caught:
        check_model(spec(HUB_ID))
    message = str(caught.value)
    assert message.startswith(f"model.path={HUB_ID!r} is not on this machine (no such folder, not in the hub cache")
    assert f"`hf download {HUB_ID}`" in message and "model.path=<a local folder>" in message


def test_a_cached_hub_model_is_read_from_the_cache_when_the_hub_is_unreachable(monkeypatch, tmp_path) -> None:
    from restkv.eval.models.loading import resolve

    _hub(monkeypatch, False, tmp_path)
    snapshot = _cached(tmp_path, HUB_ID)
    check_model(spec(HUB_ID, random_init=True))
    assert resolve(HUB_ID) == str(snapshot)  # a folder: transformers reads it without one request


@pytest.mark.parametrize("path", ["no-such-model", "/no/such/folder", "./nope/", "a/b/c"])
def test_a_path_that_is_neither_folder_nor_hub_id(path: str) -> None:
    message = refused(spec(path))
    assert message.startswith(f"model.path={path!r} is neither a local folder nor a hub id (owner/name)")


def test_a_typo_in_a_local_folder_is_not_taken_for_a_hub_id() -> None:
    message = refused(spec("models/micro-lama"))
    assert message.startswith("model.path='models/micro-lama' is not a folder in ")
    assert "(it has: micro-llama, tiny-random-llama)" in message


def test_a_file_is_not_a_model_folder(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    assert "is a file" in refused(spec(tmp_path / "weights.bin"))


def test_an_empty_folder_lists_all_it_lacks(tmp_path: Path) -> None:
    message = refused(spec(tmp_path))
    assert message == (
        f"model.path={str(tmp_path)!r} ({tmp_path.resolve()}) lacks what loading it needs: config.json; "
        "a weight file (*.safetensors or *.bin; model.random_init=true builds random weights instead); "
        "a tokenizer (tokenizer.json, tokenizer.model, tokenizer_config.json; or model.tokenizer=<folder or hub id>)"
    )


def test_random_weights_need_no_weight_file_and_a_tokenizer_may_live_elsewhere(tmp_path: Path, monkeypatch) -> None:
    _hub(monkeypatch, True, tmp_path / "hub-cache")
    (tmp_path / "config.json").write_text("{}")
    message = refused(spec(tmp_path, random_init=True))
    assert message.endswith(
        "lacks what loading it needs: a tokenizer (tokenizer.json, tokenizer.model, "
        "tokenizer_config.json; or model.tokenizer=<folder or hub id>)"
    )
    check_model(spec(tmp_path, random_init=True, tokenizer="models/micro-llama"))
    check_model(spec(tmp_path, random_init=True, tokenizer=HUB_ID))
    assert refused(spec(tmp_path, random_init=True, tokenizer="missing-tokenizer")).startswith(
        "model.tokenizer='missing-tokenizer' is neither a local folder nor a hub id (owner/name)"
    )
    assert refused(spec(tmp_path, random_init=True, tokenizer=str(tmp_path))).startswith(
        f"model.tokenizer={str(tmp_path)!r} ({tmp_path.resolve()}) holds no tokenizer: none of tokenizer.json"
    )


def test_a_truncated_safetensors_file_is_named(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    check_model(spec(folder))
    weights.write_bytes(whole[:-1000])  # an interrupted download
    message = refused(spec(folder))
    assert message.startswith(f"model.path={str(folder)!r}: {weights.resolve()} is truncated or damaged")
    assert "the tensor data is 3145728 bytes, the file holds 3144728" in message
    weights.write_bytes(whole + b"\0")
    assert "the file holds 3145729" in refused(spec(folder))
    weights.write_bytes(whole[:100])
    assert "its header is said to be" in refused(spec(folder))
    weights.write_bytes(b"\x04\0\0\0\0\0\0\0nope")
    assert "its header is not a safetensors JSON header" in refused(spec(folder))
    assert check_model(spec(folder, random_init=True)) is None  # random weights never read the file


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    index = {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert refused(spec(folder)).endswith(
        "model.safetensors.index.json names shards that are missing: model-00002-of-00002.safetensors"
    )


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("chat_template", "maybe", "use true or false"),
        ("random_init", 1, "use true or false"),
        ("max_context", 1, "use an integer >= 2"),
        ("max_context", "4096", "use an integer >= 2"),
        ("attn_implementation", "flash", "choose one of: eager, sdpa, flash_attention_2"),
        ("seed", 1.5, "use an integer"),
        ("tokenizer", "", "use a local folder, a hub id (owner/name) or null"),
        ("dtype", "fp8", "choose one of: float32, bfloat16, float16"),
    ],
)
def test_a_wrong_field_is_refused_by_name(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ValueError) as caught:
        spec(HUB_ID, **{key: value})
    assert str(caught.value) == f"model.{key}={value!r} is not allowed; {allowed}"


# ---------------------------------------------------------------------------------------------
# Every field is a command-line override for every model config
# ---------------------------------------------------------------------------------------------


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("model", MODEL_CONFIGS)
def test_every_field_is_overridable_for_every_model(model: str) -> None:
    cfg = composed(f"model={model}", "model.tokenizer=models/micro-llama", "model.seed=3", "model.random_init=true")
    built = ModelSpec(**OmegaConf.to_container(cfg.model))  # type: ignore[arg-type]
    assert (built.name, built.tokenizer, built.seed, built.random_init) == (model, "models/micro-llama", 3, True)
    assert set(cfg.model) == set(ModelSpec.__dataclass_fields__)


def test_a_wrong_type_on_the_command_line_is_refused_by_name() -> None:
    with pytest.raises(ConfigCompositionException) as caught:
        composed("model.chat_template=maybe")
    assert "model.chat_template=maybe" in str(caught.value)
    assert "Value 'maybe' is not a valid bool" in str(caught.value.__cause__)
