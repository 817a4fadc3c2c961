"""A Lane's files as they travel to a Ray node, and a delivery written back: all of it within the task's
scope or nothing, never through a link out of the Lane, never into .git. Real repositories, no cluster
(tests/integration/test_ray_runner.py runs the attempt on one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lanes_es.adapters.ray_host import DeliveredFile
from lanes_es.adapters.remote_lane import DeliveryRefused, lane_payload, write_delivery
from tests.gitfixtures import make_repo, write_file


def test_the_lane_travels_as_git_sees_it(tmp_path: Path) -> None:
    lane = make_repo(tmp_path / "lane", files={"src/tool.sh": "#!/bin/sh\n"})
    os.chmod(Path(lane) / "src" / "tool.sh", 0o755)
    write_file(lane, "src/new.txt", "untracked, not ignored\n")
    write_file(lane, ".imm/state/kernel/claim.json", "{}")  # ignored: the kernel's state stays home
    os.symlink("new.txt", Path(lane) / "src" / "latest")
    sent = lane_payload(lane)
    modes = {entry.path: entry.mode for entry in sent.entries}
    assert modes["src/tool.sh"] == "100755" and modes["src/new.txt"] == "100644" and modes["src/latest"] == "120000"
    assert not any(path.startswith(".imm/state") for path in modes)
    link = next(entry for entry in sent.entries if entry.path == "src/latest")
    assert sent.blobs[link.sha] == b"new.txt"
    assert lane_payload(lane).identity == sent.identity


def test_a_delivery_within_scope_is_written_changes_and_removals(tmp_path: Path) -> None:
    lane = make_repo(tmp_path / "lane", files={"src/a.txt": "a\n", "src/gone.txt": "x\n"})
    write_delivery(lane, "task-a", ["src"], [DeliveredFile("src/a.txt", "100755", b"b\n"),
                                               DeliveredFile("src/deep/new.txt", "100644", b"new\n"),
                                               DeliveredFile("src/gone.txt", "")])
    assert (Path(lane) / "src" / "a.txt").read_bytes() == b"b\n"
    assert os.stat(Path(lane) / "src" / "a.txt").st_mode & 0o777 == 0o755
    assert (Path(lane) / "src" / "deep" / "new.txt").read_bytes() == b"new\n"
    assert not (Path(lane) / "src" / "gone.txt").exists()


@pytest.mark.parametrize("delivered, says", [
    (DeliveredFile("other.txt", "100644", b"x"), "outside the scope of task-a: other.txt"),
    (DeliveredFile(".git/config", "100644", b"[core]"), "outside the scope of task-a: .git/config"),
    (DeliveredFile("src/x", "040000", b""), "outside the scope of task-a: src/x"),
    (DeliveredFile("src/../other.txt", "100644", b"x"), "outside the scope"),
])
def test_a_delivery_out_of_scope_writes_nothing(tmp_path: Path, delivered: DeliveredFile, says: str) -> None:
    lane = make_repo(tmp_path / "lane")
    before = sorted(str(path) for path in Path(lane).rglob("*"))
    with pytest.raises(DeliveryRefused, match=says):
        write_delivery(lane, "task-a", ["src", "**"] if delivered.path.startswith(".git") else ["src"],
                       [DeliveredFile("src/fine.txt", "100644", b"ok"), delivered])
    assert sorted(str(path) for path in Path(lane).rglob("*")) == before


def test_a_delivery_never_writes_through_a_link_out_of_the_lane(tmp_path: Path) -> None:
    lane = make_repo(tmp_path / "lane")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, Path(lane) / "src")
    with pytest.raises(DeliveryRefused, match="through a link out of the Lane: src/x.txt"):
        write_delivery(lane, "task-a", ["src"], [DeliveredFile("src/x.txt", "100644", b"x")])
    assert list(outside.iterdir()) == []
