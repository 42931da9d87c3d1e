"""The stores: publish, check-store, manifest, serve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from zoo import catalog
from zoo.config import REPO_STORE, lfs_remote_urls, repo_store
from zoo.errors import ZooError
from zoo.fsutil import atomic_write_text, plural
from zoo.layouts import launchers_table
from zoo.provenance import tree_state
from zoo.store.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BATCH_BODY, DEFAULT_MAX_HEAD, DEFAULT_MAX_OBJECT, ServeLimits
from zoo.cli.app import app, out, err, human


@app.command()
def publish(names: list[str] = typer.Argument(None, help="Entries to publish."),
            all_entries: bool = typer.Option(False, "--all", help="Every built entry."),
            to: Optional[str] = typer.Option(None, help="A mirror: LFS Batch API URL or bare repo path (default: "
                                             "the repository's store, store/)."),
            derived: bool = typer.Option(False, "--derived", help="With --to: also the variants `zoo fetch` can make "
                                         "from fp32 (int8-dynamic, fp16, ort-training, other opsets).")) -> None:
    """Publish entries into the repository's store or a mirror.

    The primaries (fp32, int8-qat, int8-ptq, retrained) and test data go into the repository's store
    (or a mirror) and replace them with pointers in the checkout; prints the store's total size. Then commit the
    card, pointers and store together."""
    from zoo.store.publish import publish as publish_entry, store_size  # lazy: requests (~0.16-0.3 s), for publishing

    targets = catalog.list_models() if all_entries else (names or [])
    if not targets:
        raise ZooError("name an entry to publish, or pass --all")
    if all_entries and to is None:  # the repository's store takes the builds of the checked-out commit
        head = tree_state().commit
        skipped = [n for n in targets if catalog.get_card(n).training.git_commit != head]
        targets = [n for n in targets if n not in skipped]
        if skipped:
            err.print(f"not built at {str(head)[:12]} (left as they are): {', '.join(skipped)}", highlight=False)
    for name in targets:
        for p in publish_entry(name, to, derived=derived):
            out.print(f"{'uploaded' if p.uploaded else 'present '} {name}/{p.path.relative_to(catalog.get_entry(name).dir)} "
                      f"{p.sha256[:12]}… {human(p.size)}", soft_wrap=True)  # one line per object, whatever the width
    to = to or str(REPO_STORE)
    size = store_size(to)
    out.print(f"store {to}: " + (f"{size:,} bytes ({size / 2**20:.1f} MiB) in all" if size is not None else
                                 "total size unknown (an HTTP store does not list its objects)"), soft_wrap=True)


@app.command("check-store")
def check_store(store: Optional[str] = typer.Argument(None, help="LFS URL or bare repo (default: the configured stores)."),
                derived: bool = typer.Option(False, "--derived", help="Also expect the derived variants."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Check a store: the card objects it lacks or holds corrupt.

    Every byte is hashed; the exit is non-zero if any is missing or corrupt."""
    stores = [store] if store else [str(s) for s in [repo_store()] if s] + lfs_remote_urls()
    if not stores:
        raise ZooError("no store configured: name one, or set ZOO_LFS_URL")
    from zoo.store.publish import check_store as run_check  # lazy: requests (~0.16-0.3 s), for checking a store

    bad = 0
    for url in stores:
        problems, total = run_check(url, derived=derived)
        bad += len(problems)
        if as_json:
            print(json.dumps({"store": url, "objects": total, "problems": [p.__dict__ for p in problems]}, indent=2))
            continue
        out.print(f"{url}: {total} card objects, {len(problems)} missing or corrupt")
        for p in problems:
            out.print(f"  {p.status:8} {p.entry} {p.label} ({p.path}) sha256 {p.sha256}", soft_wrap=True)
    if bad:
        raise ZooError(f"{plural(bad, 'card object')} missing or corrupt in the stores: publish them with "
                       "`zoo publish NAME [--to STORE]` from a build of the card's commit")


@app.command()
def manifest(check: bool = typer.Option(False, help="Fail if the committed manifest differs from the cards.")) -> None:
    """Regenerate the manifest and the generated tables of the README and the launchers guide.

    entries/MANIFEST.json from the cards, the README's catalog table, the launchers guide's layouts table and launcher
    matrix (or check them)."""
    from zoo.train.parallel import matrix_markdown  # lazy: torch; only this command renders the launcher matrix

    path = catalog.manifest_path()
    stale = []  # (file, its text with the generated tables rewritten)
    text = new = catalog.LAUNCHERS_GUIDE.read_text()
    for markers, render in [(catalog.LAYOUTS_TABLE, launchers_table), (catalog.LAUNCHER_MATRIX, matrix_markdown)]:
        new = catalog.replace_block(new, *markers, render())
    if new != text:
        stale.append((catalog.LAUNCHERS_GUIDE, new))
    if check:
        if not path.exists() or path.read_text() != catalog.manifest_text():
            raise ZooError(f"{path} is out of date with the cards; run `zoo manifest` and commit it")
        if stale:
            raise ZooError(f"{stale[0][0]}: a generated table is out of date; run `zoo manifest` and commit it")
        out.print(f"{path}: up to date")
        return
    for target, new in stale:
        atomic_write_text(target, new)
    out.print(f"wrote {catalog.write_manifest()}")


@app.command()
def serve(storage: Path = typer.Option(None, help="Folder for the objects."),
          host: str = typer.Option("127.0.0.1", help="Address to listen on; for a public mirror put a TLS proxy in "
                                                      "front (docs/guides/stores.md: Run a public mirror)."),
          port: int = typer.Option(8080),
          secret_file: Path = typer.Option(None, help="File holding the signing secret (else $ZOO_SERVE_SECRET): "
                                                      "upload tokens and action links are signed with it."),
          anonymous_writes: bool = typer.Option(False, help="Let anyone upload (tests, loopback-only use)."),
          issue_token: bool = typer.Option(False, help="Print an upload token signed with the secret, then exit."),
          expires: int = typer.Option(3600, help="Lifetime of an issued token, seconds."),
          subject: str = typer.Option("publisher", help="Who an issued token is for (shown in the request log)."),
          max_object_size: int = typer.Option(DEFAULT_MAX_OBJECT, help="Largest object accepted, bytes."),
          max_batch_body: int = typer.Option(DEFAULT_MAX_BATCH_BODY, help="Largest batch request body, bytes."),
          max_head: int = typer.Option(DEFAULT_MAX_HEAD, help="Largest request line and headers, bytes."),
          body_timeout: int = typer.Option(DEFAULT_BODY_TIMEOUT, help="Seconds a client may send nothing of an "
                                                                       "unfinished request before it is closed."),
          access_log: str = typer.Option("-", help="Request log: a file, or - for standard error."),
          no_ranges: bool = typer.Option(False, help="Answer without HTTP Range support (plain giftless).")) -> None:
    """Serve an LFS mirror (giftless) on this machine.

    Anonymous read, uploads with a token (`--issue-token` mints one)."""
    from zoo.store import serve as server  # lazy: giftless and flask, for this command only

    secret = server.load_secret(secret_file)
    if issue_token:
        if secret is None:
            raise ZooError("--issue-token needs the server's secret: set ZOO_SERVE_SECRET or pass --secret-file")
        if expires <= 0:
            raise ZooError(f"--expires {expires}: a token's lifetime must be a positive number of seconds")
        print(server.issue_token(secret, expires, subject))
        return
    if storage is None:
        raise ZooError("--storage FOLDER is required to serve (the folder objects are kept in)")
    limits = ServeLimits(max_object_size, max_batch_body, max_head, body_timeout)
    warning = server.exposure_warning(host, anonymous_writes)
    if warning:
        err.print(warning)
    mode = "anonymous read-write" if anonymous_writes else (
        "anonymous read, uploads with a token" if secret else "read-only (no secret: uploads are refused)")
    err.print(f"LFS endpoint: http://{host}:{port}/zoo/models.git/info/lfs ({mode})")
    server.serve(storage, host, port, ranges=not no_ranges, secret=secret, anonymous_writes=anonymous_writes,
               limits=limits, access_log=None if access_log == "" else access_log)
