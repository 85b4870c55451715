"""Read the Dockerfile as `docker build` would, for tests on a machine without Docker.

Only the subset the project's Dockerfile uses: FROM ... AS, line
continuations, comments, JSON (exec) form, COPY [--from=stage], and a
.dockerignore without `!` exceptions.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str

    def words(self) -> list[str]:
        """Exec-form JSON list, else the shell words."""
        text = self.args.strip()
        if text.startswith("["):
            value = json.loads(text)
            assert isinstance(value, list)
            return [str(v) for v in value]
        return shlex.split(text)


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    assert not current, "Dockerfile ends inside a continued line"
    return lines


def parse(path: Path = DOCKERFILE) -> list[Stage]:
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
            continue
        assert stages, f"instruction before FROM: {line}"
        stages[-1].instructions.append(Instruction(keyword, args.strip()))
    return stages


def ignore_patterns(path: Path = DOCKERIGNORE) -> list[str]:
    patterns = [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns), "exceptions are not modelled here"
    return patterns


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether .dockerignore drops this context path (or a directory above it)."""
    parts = Path(relative).parts
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        for pattern in patterns:
            if fnmatch.fnmatchcase(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], pattern[3:]):
                return True
    return False


def copy_sources(stage: Stage) -> list[str]:
    """Context paths a stage COPYs (not those copied --from another stage)."""
    sources: list[str] = []
    for copy in stage.all("COPY"):
        words = copy.words()
        if any(w.startswith("--from=") for w in words):
            continue
        sources.extend(w for w in words[:-1] if not w.startswith("--"))
    return sources


def build_context(into: Path) -> Path:
    """What the build stage sees: the COPYed files minus .dockerignore, from this checkout."""
    patterns = ignore_patterns()
    for source in copy_sources(parse()[0]):
        src = REPO / source
        for path in [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file()):
            relative = path.relative_to(REPO).as_posix()
            if ignored(relative, patterns):
                continue
            target = into / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return into


def wheel_command(stage: Stage) -> list[str]:
    """The build stage's `pip wheel` command line."""
    (command,) = [i.words() for i in stage.all("RUN") if "wheel" in i.words()]
    return command


def build_wheel(into: Path, context: Path) -> Path:
    """Run the build stage's pip wheel on a context, as CI and the image build do."""
    command = wheel_command(parse()[0])
    args = command[command.index("wheel") + 1 :]
    assert "--no-deps" in args
    # Keep the Dockerfile's options; only the output directory is ours.
    out = args.index("--wheel-dir")
    args[out + 1] = str(into)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", *args],
        cwd=context,
        check=True,
        capture_output=True,
    )
    (wheel,) = into.glob("gang_extender-*.whl")
    return wheel
