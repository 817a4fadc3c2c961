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

from lanes_es.audit.completion import verify_completion
from lanes_es.cli.main import main


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


MEASURE = """<script>
(() => {
  const box = (element) => { const r = element.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, text: element.textContent || element.tagName}; };
  const timeline = document.querySelector('.swim svg');
  const out = {
    swim: box(document.querySelector('.swim')), labels: box(document.querySelector('.swim .labels')),
    svg: box(timeline),
    texts: [...timeline.querySelectorAll('text')].map(box),
    marks: [...timeline.querySelectorAll('a.mark svg > *')].map(box),
  };
  const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def overlap(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] - 0.5 and b["left"] < a["right"] - 0.5 and a["top"] < b["bottom"] - 0.5 \
        and b["top"] < a["bottom"] - 0.5


def test_the_timeline_uses_the_width_and_its_labels_never_overlap(demo, tmp_path: Path, capsys):
    """The boxes as Chromium lays them out: the timeline fills the page beside the lane names, and no label (a
    tick's time and index, an integration's commit) overlaps another label or an event's marker."""
    repo, batch_id = demo
    page = tmp_path / "audit.html"
    assert main(["--root", str(repo), "audit", batch_id, "-o", str(page)]) == 0
    capsys.readouterr()
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = chromium("--window-size=1400,1000", "--dump-dom", measured.as_uri(), profile=tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = json.loads(dom.stdout.split('<pre id="measured">', 1)[1].split("</pre>", 1)[0].replace("&quot;", '"')
                       .replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    room = found["swim"]["right"] - found["labels"]["right"]
    used = found["svg"]["right"] - found["svg"]["left"]
    assert used >= 0.9 * room, f"the timeline uses {used:.0f} of {room:.0f} px"
    texts, marks = found["texts"], found["marks"]
    assert len(texts) > 10 and len(marks) > 40
    commits = [text for text in texts if len(text["text"]) == 7 and text["text"] not in ("#", "")]
    assert len(commits) == 6, commits
    clashes = [(a["text"], b["text"]) for i, a in enumerate(texts) for b in texts[i + 1:] if overlap(a, b)]
    clashes += [(a["text"], "a marker") for a in texts for b in marks if overlap(a, b)]
    assert not clashes, clashes
    # the control: the check sees an overlap where there is one
    assert overlap(marks[0], dict(marks[0]))
