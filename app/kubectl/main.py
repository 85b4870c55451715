"""The `kubectl-gang` entry point: parse, connect, read, print; --watch reprints what changed.

kubectl finds the console script `kubectl-gang` on PATH and runs it with
the arguments after `kubectl gang`. Every failure the user can fix (no
kubeconfig, forbidden, unknown gang, malformed NAMESPACE/NAME) is one line
on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.kubectl.api import Api, ApiError, PluginError, connect
from app.kubectl.args import Options, UsageError, parse
from app.kubectl.describe import describe
from app.kubectl.gangs import Gang, build_gangs, event_subjects, find, target_namespace
from app.kubectl.live import Endpoint, Live, read_live
from app.kubectl.objects import Objects, read_events, read_objects
from app.kubectl.output import as_list, dump, gang_document, gang_table, live_note
from app.kubectl.queues import bars, queue_rows, queue_table
from app.kubectl.table import use_colour


@dataclass(frozen=True, slots=True)
class View:
    """One read: the objects, the live state and the gangs built from both."""

    objects: Objects
    live: Live
    gangs: list[Gang]


def read(api: Api, options: Options, namespace: str | None) -> View:
    objects = read_objects(api, namespace)
    where = Endpoint(options.extender_namespace, options.extender_service, options.extender_url)
    live = read_live(api, where)
    return View(objects, live, build_gangs(objects, live))


def notes(view: View) -> list[str]:
    found = [live_note(view.live)] if live_note(view.live) else []
    return found + [f"could not read {what}" for what in view.objects.unreadable]


def show_get(view: View, options: Options, colour: bool, header: bool = True) -> str:
    if options.output in ("json", "yaml"):
        return dump(as_list([gang_document(g) for g in view.gangs], view.live), options.output)
    if not view.gangs and header:
        where = "any namespace" if options.all_namespaces else "this namespace"
        return f"No gangs found in {where}."
    return gang_table(
        view.gangs,
        view.objects.now,
        view.live,
        wide=options.output == "wide",
        all_namespaces=options.all_namespaces,
        colour=colour,
        header=header,
    )


def show_queues(view: View, options: Options, header: bool = True) -> str:
    rows = queue_rows(view.objects.queues, view.gangs, view.live)
    if options.output in ("json", "yaml"):
        return dump(as_list([r.document() for r in rows], view.live), options.output)
    if not rows:
        return "No queues found (no Volcano Queue objects and no gang names one)."
    table = queue_table(rows, header=header)
    drawn = bars(rows) if header else ""
    return table + ("\n\n" + drawn if drawn else "")


def show_describe(api: Api, view: View, options: Options, namespace: str, colour: bool) -> str:
    assert options.target is not None
    matches = find(view.gangs, options.target, namespace)
    if not matches:
        raise PluginError(f"gang {options.target!r} not found (namespace {namespace})")
    if len(matches) > 1:
        keys = ", ".join(g.key for g in matches)
        raise PluginError(f"{options.target!r} names several gangs ({keys}): give the key")
    gang = matches[0]
    events = read_events(api, gang.namespace, event_subjects(gang))
    return describe(gang, view.live, events, view.objects.now, colour)


def run(options: Options, out: Callable[[str], None], err: Callable[[str], None]) -> int:
    connection = connect(options.kubeconfig, options.context)
    api = Api(connection, options.timeout)
    namespace = options.namespace or connection.namespace
    if options.command == "describe" and options.target is not None:
        namespace = target_namespace(options.target, namespace)
    # Queues are cluster-wide: their gangs are counted in every namespace.
    scope = None if options.all_namespaces or options.command == "queues" else namespace
    colour = use_colour(options.colour, sys.stdout)
    view = read(api, options, scope)
    if options.command == "describe":
        out(show_describe(api, view, options, namespace, colour))
        return 0
    first = (
        show_get(view, options, colour) if options.command == "get" else show_queues(view, options)
    )
    out(first)
    if options.output not in ("json", "yaml"):
        for note in notes(view):
            err(f"note: {note}")
    if options.watch:
        watch(api, options, scope, view, out, colour)
    return 0


def watch(
    api: Api,
    options: Options,
    scope: str | None,
    last: View,
    out: Callable[[str], None],
    colour: bool,
) -> None:
    """Poll every --watch-interval seconds and print the rows that changed, as kubectl -w does.

    A row counts as changed when what it says changed, not when only its age
    moved on (kubectl -w prints an object when it changes, not every second).
    """
    seen = {key for key, _ in watch_rows(last, options, colour)}
    while True:
        time.sleep(options.interval)
        view = read(api, options, scope)
        rows = watch_rows(view, options, colour)
        for key, line in rows:
            if key not in seen:
                out(line)
        seen = {key for key, _ in rows}


def watch_rows(view: View, options: Options, colour: bool) -> list[tuple[str, str]]:
    """(what the row says apart from its age, the row as printed), one per gang or queue."""
    if options.command == "get":
        lines = show_get(view, options, colour, header=False).splitlines()
        if not view.gangs:
            return []
        keys = [json.dumps(gang_document(g), sort_keys=True) for g in view.gangs]
        return list(zip(keys, lines, strict=True))
    lines = show_queues(view, options, header=False).splitlines()
    return [(line, line) for line in lines]


def main(argv: Sequence[str] | None = None) -> int:
    """Console script `kubectl-gang`; the exit code kubectl passes on."""
    args = sys.argv[1:] if argv is None else argv

    def out(text: str) -> None:
        print(text, flush=True)

    def err(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        options = parse(args)
        return run(options, out, err)
    except UsageError as error:
        err(f"error: {error}")
        return 2
    except ApiError as error:
        err(f"error: {error}")
        return 1
    except PluginError as error:
        err(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
