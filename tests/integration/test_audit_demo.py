"""The audit tools on the demo batch: a whole batch run by the engine on a fresh repository.

The demo runs once for this module; each test that changes the repository works on a copy.
The audit page is rendered in headless Chromium (Debian's package, which `.ci/run` installs):
a screenshot is taken, the page's content is read back from the DOM after its script ran,
and Chromium's network log shows that the page requested nothing.

Chromium makes requests of its own on every launch, whatever the flags: on Chromium 156 the
network time (clients2.google.com/time), two component-update checks (update.googleapis.com,
http and https) and Gaia's ListAccounts (accounts.google.com). Those four are the "4
unexpected page requests" a first version of the check reported. The check tells them apart
from the page's requests by what Chromium records for each, not by their URLs: see
`net_requests`.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
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
    # Another committer date, or a cherry-pick in the same second as the demo's commit makes the same commit.
    run_git(repo, "cherry-pick", "--allow-empty", "--keep-redundant-commits", last,
            env={**identity_env(), "GIT_COMMITTER_DATE": "2001-01-01T00:00:00+00:00"})
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


def net_requests(netlog_path: Path) -> tuple[list[str], list[str]]:
    """The URLs of every network request in the log: (the page's, Chromium's own).

    Chromium records each request's `initiator` (the origin of the document that asked:
    "null" for a file: page, "not an origin" when the browser itself asked) and its
    `network_isolation_key` (the top-level site it is made for: "file://" for a file: page).
    A request is Chromium's own only when it has no initiator AND is made for another site
    than the page's; anything else, including a request missing either fact, is the page's.
    A log Chromium did not finish writing is refused rather than read in part.
    """
    text = netlog_path.read_text()
    assert text.rstrip().endswith("}"), f"Chromium did not finish its netlog {netlog_path}; it cannot show every request"
    netlog = json.loads(text)
    names = {number: name for name, number in netlog["constants"]["logEventTypes"].items()}
    begin = netlog["constants"]["logEventPhase"]["PHASE_BEGIN"]
    page: list[str] = []
    browser: list[str] = []
    for event in netlog["events"]:
        if names.get(event["type"]) != "URL_REQUEST_START_JOB" or event.get("phase") != begin:
            continue
        params = event.get("params") or {}
        url = str(params.get("url"))
        if url.startswith(("file:", "data:")):
            continue  # not the network
        own = (params.get("initiator") == "not an origin"
               and not str(params.get("network_isolation_key", "file://")).startswith("file://"))
        (browser if own else page).append(url)
    return page, browser


def page_requests(netlog_path: Path) -> list[str]:
    return net_requests(netlog_path)[0]


class _Pointers(HTMLParser):
    """Attributes that make a browser load something: src, srcset, poster, data, and href not to a #fragment."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "srcset", "poster", "data") or (name == "href" and not (value or "").startswith("#")):
                self.found.append((tag, name, value or ""))


def pointers(html: str) -> list[tuple[str, str, str]]:
    parser = _Pointers()
    parser.feed(html)
    return parser.found


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
    page_asked, browser_asked = net_requests(netlog)
    assert page_asked == [], f"the page asked for {page_asked} (Chromium's own requests: {browser_asked})"

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
    # nor does the DOM its script built point anywhere: local files never show in a netlog
    assert pointers(html) == []


def test_the_network_check_sees_a_page_that_loads_something(tmp_path: Path):
    """The control: the same check flags every kind of request a page can make, and only those."""
    page = tmp_path / "remote.html"
    page.write_text('<!DOCTYPE html><html><head><link rel="stylesheet" href="http://css.example.invalid/s.css">'
                    '<link rel="prefetch" href="http://prefetch.example.invalid/p"></head><body><p>x</p>'
                    '<img src="http://example.invalid/a.png"><iframe src="http://frame.example.invalid/f"></iframe>'
                    '<script src="https://cdn.example.invalid/x.js"></script>'
                    '<script>fetch("http://fetch.example.invalid/f");'
                    'navigator.sendBeacon("http://beacon.example.invalid/b", "x")</script></body></html>')
    netlog = tmp_path / "net.json"
    result = chromium(f"--screenshot={tmp_path / 'x.png'}", f"--log-net-log={netlog}", page.as_uri(),
                      profile=tmp_path / "profile")
    assert result.returncode == 0, result.stderr[-2000:]
    page_asked, browser_asked = net_requests(netlog)
    assert sorted(page_asked) == [
        "http://beacon.example.invalid/b", "http://css.example.invalid/s.css", "http://example.invalid/a.png",
        "http://fetch.example.invalid/f", "http://frame.example.invalid/f", "http://prefetch.example.invalid/p",
        "https://cdn.example.invalid/x.js"]
    assert not any("example.invalid" in url for url in browser_asked)
