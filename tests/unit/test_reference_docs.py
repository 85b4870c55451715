"""The manual against the code: generated pages fresh, hand-written pages naming only what exists.

docs/reference/, docs/index.md and docs/contributing.md are rendered by
hack/gen_reference.py from the code, README.md and CONTRIBUTING.md; a
committed page that differs from a fresh rendering fails here. The
hand-written pages are checked where they name the code: every metric they
mention is registered, every flag and Event reason has its place.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from app.base.metrics import Metrics
from app.core import events
from app.flags import FLAGS
from app.ops import device_metrics
from hack import gen_reference
from hack.gen_reference import PAGES, REPO, event_rows, message_rows, render_text

DOCS = REPO / "docs"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_generated_page_is_fresh(name: str) -> None:
    path = DOCS / name
    assert path.is_file(), f"docs/{name} is missing: run `make docs-reference`"
    assert path.read_text() == PAGES[name](), f"docs/{name} is stale: run `make docs-reference`"


def test_check_mode_names_a_stale_page(tmp_path: Path) -> None:
    for name, render in PAGES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(render())
    (tmp_path / "reference" / "metrics.md").write_text("# Metrics\n")
    assert gen_reference.stale_pages(tmp_path) == ["reference/metrics.md"]


def test_readme_is_a_front_page_with_both_set_up_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "make demo " in readme and "make test " in readme
    assert "docs/kubectl-gang.md" in readme


def _registered_metrics() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        if family.name.startswith("gang_extender_"):
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names | {family.name for family in device_metrics.FAMILIES}


def _hand_written_pages() -> list[Path]:
    generated = {DOCS / name for name in PAGES}
    return [p for p in sorted(DOCS.rglob("*.md")) if p not in generated]


def test_every_metric_the_manual_names_is_registered() -> None:
    registered = _registered_metrics()
    for page in [*_hand_written_pages(), REPO / "README.md"]:
        for name in re.findall(r"gang_extender_[a-z_]+\*?", page.read_text()):
            if name.endswith("*"):  # a family: gang_extender_queue_*
                assert any(r.startswith(name[:-1]) for r in registered), name
                continue
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            assert base in registered or f"{base}_total" in registered, (
                f"{page.relative_to(REPO)} names {name}, "
                "which app/base/metrics.py does not register"
            )


def test_operations_says_what_every_metrics_labels_mean() -> None:
    operations = (DOCS / "operations.md").read_text()
    for name in _registered_metrics():
        assert f"| `{name}` |" in operations, f"docs/operations.md has no row for {name}"


def test_every_flag_has_its_place_in_the_configuration_page() -> None:
    configuration = (DOCS / "configuration.md").read_text()
    for flag in FLAGS:
        option = "--" + flag.name.replace("_", "-")
        assert f"`{option}`" in configuration, f"docs/configuration.md does not name {option}"


def _reasons() -> set[str]:
    return {
        value
        for name, value in vars(events).items()
        if name.isupper() and isinstance(value, str) and value not in ("Normal", "Warning")
    }


def test_the_extractor_finds_every_event_reason() -> None:
    source = Path(events.__file__).read_text()
    names = {k: v for k, v in vars(events).items() if isinstance(v, str)}
    found = {part for row in event_rows(source, names) for part in row.reason.split(" / ")}
    assert found == _reasons()


def test_reporting_explains_every_event_reason() -> None:
    reporting = (DOCS / "reporting.md").read_text()
    for reason in _reasons():
        assert f"| `{reason}` |" in reporting, f"docs/reporting.md has no row for {reason}"


def test_every_helm_value_has_a_description() -> None:
    schema = json.loads((REPO / "charts/gang-extender/values.schema.json").read_text())

    def walk(node: dict[str, object], path: str) -> None:
        if path:
            assert node.get("description"), f"values.schema.json: {path} has no description"
        children = node.get("properties")
        if isinstance(children, dict):
            for key, child in children.items():
                walk(child, f"{path}.{key}" if path else key)

    walk(schema, "")


def test_an_f_string_renders_with_its_placeholders() -> None:
    expr = ast.parse('f"gang {spec.key} needs {count(x) + 1} more, waited {w:g}s"').body[0]
    assert isinstance(expr, ast.Expr)
    assert render_text(expr.value) == "gang {spec.key} needs {…} more, waited {w}s"


def test_messages_leave_out_docstrings_log_lines_and_cel() -> None:
    source = '''
"""A module docstring of more than five words."""
LIMIT = 3
"""An attribute docstring of more than five words."""


def refuse(key: str) -> str:
    """A function docstring of more than five words."""
    log.info("a log line of more than five words %s", key)
    rule = "has(object.spec.priority) && object.spec.priority > 0"
    short = "too short to count"
    return f"gang {key} is refused: " + "it asks for more than the cluster has"
'''
    assert message_rows(source) == [
        ("refuse", "gang {key} is refused: it asks for more than the cluster has")
    ]


def _docs_build_command() -> list[str]:
    """The mkdocs command line `make docs` runs, read from the Makefile itself."""
    makefile = (REPO / "Makefile").read_text()
    line = next(
        raw.strip() for raw in makefile.splitlines() if "mkdocs build" in raw and "\t" in raw
    )
    words = line.split()
    start = next(i for i, word in enumerate(words) if word.endswith("/mkdocs"))
    return [str(REPO / ".venv" / "bin" / "mkdocs"), *words[start + 1 :]]


def test_make_docs_fails_on_a_broken_link(tmp_path: Path) -> None:
    """`make docs`'s own mkdocs flags turn a broken link into a failure.

    `--quiet` once sat beside `--strict` there: it hides the warnings from the
    count that `--strict` fails on, so a broken link built "successfully".
    """
    import shutil
    import subprocess

    command = _docs_build_command()
    assert "--strict" in command
    project = tmp_path / "p"
    shutil.copytree(REPO / "docs", project / "docs")
    shutil.copy(REPO / "mkdocs.yml", project / "mkdocs.yml")
    site = tmp_path / "site"
    command = [word if word != "$(DOCS_SITE)" else str(site) for word in command]

    def build() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            cwd=project,
            capture_output=True,
            text=True,
            env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
            check=False,
        )

    clean = build()
    assert clean.returncode == 0, clean.stderr
    page = project / "docs" / "troubleshooting.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    broken = build()
    assert broken.returncode != 0, "a broken link built without an error"
    assert "no-such-page.md" in broken.stderr
