"""python -m trident: inspect and clear Trident's cache (``TRIDENT_CACHE_DIR``)."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time

from trident import config
from trident.frontend import entries as cache  # Note [Listing without torch]


def _origin(about: dict) -> str:
    if not about:
        return "(made by an older Trident: origin not recorded)"
    where = f"{about['file']}:{about['line']}" if about.get("file") else "source unknown"
    graph = f", graph of {about['graph_of']}" if about.get("graph_of") else ""
    if about.get("graph_line"):  # Note [Graph origins] in trident/frontend/entries.py
        graph = f", a torch.compile graph from line {about['graph_line']}"
    return f"{cache.full_name(about) or '?'} ({where}{graph})"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `trident list | head`: the reader stopped reading; what is left
        # to flush goes nowhere (the recipe of Python's signal module documentation)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="trident", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cache-dir", help="print the cache folder")
    listing = sub.add_parser("list", help="list cached functions: origin, specializations, "
                                          "size, folder")
    listing.add_argument("--full", action="store_true", help="whole signatures (a module's "
                         "forward names every parameter; cut at 160 characters otherwise)")
    clear = sub.add_parser("clear", help="delete one function's entries, or every cached "
                                         "module and runtime build")
    clear.add_argument("name", nargs="?", help="a function's module.qualname (as `list` shows "
                                               "it), its qualified name alone when no other "
                                               "module has one alike, either after its file "
                                               "and a colon (serve.py:__main__.f: two "
                                               "scripts' __main__.f), or its folder name; "
                                               "default: everything")
    args = parser.parse_args(argv)
    if args.command == "cache-dir":
        print(config.cache_dir())
    elif args.command == "list":
        rows = cache.list_entries()
        for row in rows:
            n = len(row["signatures"])
            used = "unknown" if row["last_use"] is None else \
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["last_use"]))
            print(f"{_origin(row['about'])}: {n} specialization{'s' * (n != 1)}, "
                  f"{_size(row['bytes'])}, last used {used}")
            for i, (signature, apart) in enumerate(zip(row["signatures"], row["apart"])):
                if not args.full:
                    signature = textwrap.shorten(signature, 160, placeholder=" ...")
                print(f"  {i}: {signature}" + (f" [{'; '.join(apart)}]" if apart else ""))
            if row["key_apart"]:  # Note [Key parts] in identity.py
                print("  apart from the alike: " + "; ".join(row["key_apart"]))
            print(f"  in {row['path']}")
        if rows:
            total = sum(row["bytes"] for row in rows)
            print(f"{len(rows)} entr{'ies' if len(rows) != 1 else 'y'}, {_size(total)} "
                  f"of the bound of {config.cache_size() / 2**20:.1f} MiB (TRIDENT_CACHE_SIZE)")
        else:
            print(f"no cached functions in {config.cache_dir()}")
    elif args.command == "clear":
        try:
            deleted = cache.clear(args.name)
        except ValueError as e:
            print(e)
            return 2
        for path in deleted:
            print(f"deleted {path}")
        if args.name is not None and not deleted:
            print(f"no cached function named {args.name!r} in {config.cache_dir()}")
            return 1
        print(f"cleared {len(deleted)} entr{'ies' if len(deleted) != 1 else 'y'} in "
              f"{config.cache_dir()}")
    return 0


def _size(n: int) -> str:
    """``n`` bytes in KiB below one MiB, else in MiB: a listing's entries and total."""
    return f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


if __name__ == "__main__":
    raise SystemExit(main())
