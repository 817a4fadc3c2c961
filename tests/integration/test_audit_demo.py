"""The audit tools on the demo batch: a whole batch run by the engine on a fresh repository.

The demo runs once for this module; each test that changes the repository works on a copy.
The audit page is rendered in headless Chromium (Debian's package, which `.ci/run` installs):
a screenshot is taken, the page's content is read back from the DOM after its script ran,
and Chromium's network log shows that the page requested nothing.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from lanes_es.audit.completion import verify_completion
from tests.gitfixtures import git_out, identity_env, run_git
from tools.cli import main
from tools.demo import run_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    base = tmp_path_factory.mktemp("demo")
    assert run_demo(str(base), out=lambda _line: None) == 0
    repo = base / "repo"
    states = [path for path in (repo / ".imm/state/batches").glob("*.json") if not path.name.endswith(".report.json")]
    assert len(states) == 1
    return repo, states[0].stem


def copy_of(demo: tuple[Path, str], tmp_path: Path) -> Path:
    repo, _ = demo
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy, symlinks=True)
    return copy


def rewrite_documents(repo: Path, batch_id: str, change: Any) -> None:
    for name in (f"{batch_id}.json", f"{batch_id}.report.json"):
        path = repo / ".imm/state/batches" / name
        document = json.loads(path.read_text())
        change(document)
        path.write_text(json.dumps(document, indent=2) + "\n")


def test_verify_accepts_the_completed_demo_batch(demo, capsys):
    repo, batch_id = demo
    observation = verify_completion(repo, batch_id)
    assert observation.complete, observation.message
    record = json.loads((repo / ".imm/state/batches" / f"{batch_id}.json").read_text())
    assert [child.commit for child in observation.children] == record["commits"]
    assert observation.children[0].parent == record["base_head"]
    assert main(["--root", str(repo), "verify", batch_id]) == 0
    out = capsys.readouterr().out
    assert f"completion: verified {len(record['children'])} children on the batch branch" in out


def test_a_rewritten_demo_branch_is_refused(demo, tmp_path: Path):
    repo = copy_of(demo, tmp_path)
    last = git_out(repo, "rev-parse", "HEAD")
    run_git(repo, "reset", "-q", "--hard", "HEAD~1")
    run_git(repo, "cherry-pick", "--allow-empty", "--keep-redundant-commits", last, env=identity_env())
    assert git_out(repo, "rev-parse", "HEAD") != last
    observation = verify_completion(repo, demo[1])
    assert (observation.code, observation.exit_code) == ("lineage_mismatch", 1)


def test_a_demo_commit_without_its_audit_pair_is_refused(demo, tmp_path: Path):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]
    last = git_out(repo, "rev-parse", "HEAD")
    task = git_out(repo, "log", "-n", "1", "--format=%s").split(")")[0].removeprefix("imm(")
    run_git(repo, "rm", "-q", "-r", "--", f".imm/audit/{task}")
    run_git(repo, "commit", "-q", "--amend", "--no-edit", "--no-verify", env=identity_env())
    amended = git_out(repo, "rev-parse", "HEAD")

    def follow(document: dict[str, Any]) -> None:
        document["commits"] = [amended if commit == last else commit for commit in document["commits"]]
        for child in document["children"]:
            if child["commit"] == last:
                child["commit"] = amended

    rewrite_documents(repo, batch_id, follow)
    observation = verify_completion(repo, batch_id)
    assert (observation.code, observation.exit_code) == ("missing_commit_evidence", 1)
    assert f"{task} carries no audit pair" in observation.message


def test_a_demo_commit_out_of_integration_order_is_refused(demo, tmp_path: Path):
    repo = copy_of(demo, tmp_path)
    batch_id = demo[1]

    def swap_first_two(document: dict[str, Any]) -> None:
        document["commits"][0], document["commits"][1] = document["commits"][1], document["commits"][0]

    rewrite_documents(repo, batch_id, swap_first_two)
    observation = verify_completion(repo, batch_id)
    assert (observation.code, observation.exit_code) == ("commit_order_mismatch", 1)


# ---------------------------------------------------------------- the page in a browser


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary, "Debian's chromium package is needed for this test (.ci/run installs it)"
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120)


def page_requests(netlog_path: Path) -> list[str]:
    """URLs the page asked for. The browser's own background requests have no origin and are left out."""
    netlog = json.loads(netlog_path.read_text())
    names = {number: name for name, number in netlog["constants"]["logEventTypes"].items()}
    requested = []
    for event in netlog["events"]:
        params = event.get("params") or {}
        if names.get(event["type"]) != "URL_REQUEST_START_JOB" or params.get("initiator") == "not an origin":
            continue
        url = params.get("url")
        if url and not url.startswith(("file:", "data:")):  # the job's end carries no url
            requested.append(url)
    return requested


def png_facts(path: Path) -> tuple[int, int, int]:
    """Width, height and the number of distinct byte values in the image data (a blank page has few)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    offset, idat = 8, b""
    while offset < len(data):
        length = struct.unpack(">I", data[offset:offset + 4])[0]
        kind = data[offset + 4:offset + 8]
        if kind == b"IDAT":
            idat += data[offset + 8:offset + 8 + length]
        offset += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def test_the_demo_audit_page_renders_offline_in_chromium(demo, tmp_path: Path, capsys):
    repo, batch_id = demo
    page = tmp_path / "audit.html"
    assert main(["--root", str(repo), "audit", batch_id, "--html", str(page)]) == 0
    capsys.readouterr()

    screenshot, netlog = tmp_path / "audit.png", tmp_path / "net.json"
    shot = chromium("--window-size=1400,1000", f"--screenshot={screenshot}", f"--log-net-log={netlog}",
                    page.as_uri(), profile=tmp_path / "profile-shot")
    assert shot.returncode == 0, shot.stderr[-2000:]
    width, height, distinct = png_facts(screenshot)
    assert (width, height) == (1400, 1000) and distinct > 50
    assert page_requests(netlog) == []

    dom = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    record = json.loads((repo / ".imm/state/batches" / f"{batch_id}.json").read_text())
    assert main(["--root", str(repo), "replay", batch_id, "--json"]) == 0
    events = len(json.loads(capsys.readouterr().out)["steps"])
    html = dom.stdout
    assert f"Audit of <span class=\"mono\">{batch_id}</span>" in html
    for child in record["children"]:
        assert f'class="lane-label" data-task="{child["task_id"]}"' in html
        assert child["commit"][:12] in html
    assert html.count('<tr id="v') == events
    assert f'<span class="hint" id="shown">({events})</span>' in html  # the filter script ran and counted them


def test_the_network_check_sees_a_page_that_loads_something(tmp_path: Path):
    """The control: the same check flags a page with a remote image and script."""
    page = tmp_path / "remote.html"
    page.write_text('<!DOCTYPE html><p>x</p><img src="http://example.invalid/a.png">'
                    '<script src="https://cdn.example.invalid/x.js"></script>')
    netlog = tmp_path / "net.json"
    result = chromium(f"--screenshot={tmp_path / 'x.png'}", f"--log-net-log={netlog}", page.as_uri(),
                      profile=tmp_path / "profile")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(page_requests(netlog)) == ["http://example.invalid/a.png", "https://cdn.example.invalid/x.js"]
