"""What a user's `pip install lanes-es` gets: the built distribution, installed away from the source tree.

The suite itself runs on an editable install, which imports from the source tree and so cannot see a
module the wheel leaves out (how `lanes_es.tick` went missing). Here the sdist is built, the wheel is
built from that sdist (as pip does from an index), and the wheel is installed into a fresh venv. The
venv borrows the suite's third-party dependencies through a path entry (the suite's site-packages,
whose own .pth files, the editable install among them, are not processed from there), so nothing
reaches the network; lanes_es itself comes only from the wheel. Then, from a directory outside the
source tree: `--version`, every command's and subcommand's `--help`, and the demo.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def away_from_the_source_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """No PYTHONPATH into the checkout in anything a test starts: the installed copy alone is under test."""
    monkeypatch.delenv("PYTHONPATH", raising=False)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist built from the checkout, the wheel from the sdist."""
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the suite's setuptools builds, so the test needs no network
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(PROJECT)],
                   check=True, capture_output=True, timeout=300)
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def installed(dist: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; returns its bin directory."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # the dependencies, from the suite's environment (a plain path entry: its .pth files stay unread)
    (site / "suite_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Without PYTHONPATH: a path to the source tree there shows pip its lanes_es (the editable install's
    # egg-info) as installed already, and pip installs nothing.
    clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(dist[1])], check=True, capture_output=True, timeout=300, env=clean)
    assert (venv / "bin" / "lanes-es").is_file(), "the wheel installed no lanes-es script"
    return venv / "bin"


def run(bin_dir: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["PATH"] = os.pathsep.join([str(bin_dir), environment.get("PATH", "")])
    return subprocess.run([str(bin_dir / "lanes-es"), *args], cwd=cwd, capture_output=True, text=True,
                          env={**environment, **env}, timeout=300)


def source_modules() -> set[str]:
    """Every module of the package in the source tree (lanes_es/projections is the link to projections/)."""
    return {str(path.relative_to(PROJECT)) for path in (PROJECT / "lanes_es").rglob("*.py")
            if "__pycache__" not in path.parts}


def test_the_wheel_ships_every_module_and_no_generic_top_level_name(dist):
    names = set(zipfile.ZipFile(dist[1]).namelist())
    assert source_modules() - names == set()
    assert "lanes_es/runtime_contracts.json" in names
    assert {name.split("/")[0] for name in names} == {"lanes_es", "lanes_es-" + dist[1].name.split("-")[1] + ".dist-info"}


def test_the_sdist_ships_every_module(dist):
    with tarfile.open(dist[0]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert source_modules() - names == set()
    assert {"pyproject.toml", "README.md", "lanes_es/runtime_contracts.json"} <= names


def commands(bin_dir: Path, cwd: Path) -> Iterator[list[str]]:
    """Every command and subcommand the installed parser has, as argument lists."""
    listing = subprocess.run([str(bin_dir / "python"), "-c",
                              "import argparse\nfrom lanes_es.cli.main import build_parser\n"
                              "def walk(parser, prefix):\n"
                              "    for action in parser._actions:\n"
                              "        if not isinstance(action, argparse._SubParsersAction): continue\n"
                              "        for name, sub in action.choices.items():\n"
                              "            if hasattr(sub, '_actions'):\n"
                              "                print(' '.join(prefix + [name])); walk(sub, prefix + [name])\n"
                              "walk(build_parser('*'), [])\n"], cwd=cwd, capture_output=True, text=True, check=True)
    for line in listing.stdout.splitlines():
        yield line.split()


def test_the_installed_package_runs_outside_the_source_tree(installed, tmp_path):
    where = run(installed, "--version", cwd=tmp_path)
    assert where.returncode == 0 and where.stdout.startswith("lanes-es "), where
    origin = subprocess.run([str(installed / "python"), "-c", "import lanes_es; print(lanes_es.__file__)"],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert origin.startswith(str(installed.parent)), origin  # the wheel's copy, not the checkout's
    for generic in ("tools", "projections"):
        found = subprocess.run([str(installed / "python"), "-c", f"import {generic}"], cwd=tmp_path)
        assert found.returncode != 0, f"the installed package brought a top-level {generic!r}"
    listed = list(commands(installed, tmp_path))
    assert ["tick"] in listed and ["task", "submit"] in listed and ["run"] in listed
    for command in listed:
        shown = run(installed, *command, "--help", cwd=tmp_path)
        if command == ["bench"] or command[:1] == ["bench"]:
            continue  # the benchmarks are the project's tooling; not installed (the test below)
        assert shown.returncode == 0 and "usage: lanes-es" in shown.stdout, (command, shown.stderr)


def test_the_benchmarks_say_they_need_a_source_checkout(installed, tmp_path):
    shown = run(installed, "bench", "startup", cwd=tmp_path)
    assert shown.returncode == 2
    assert shown.stderr.startswith("lanes-es: source_checkout_needed:") and "pip install -e ." in shown.stderr


def test_the_demo_runs_from_the_wheel(installed, tmp_path, store_url):
    shown = run(installed, "demo", "--dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "final report: completed" in shown.stdout
    assert "no drift" in shown.stdout
