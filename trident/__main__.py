"""python -m trident: inspect and clear Trident's cache."""

from __future__ import annotations

import argparse

from . import cache, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trident", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cache-dir", help="print the cache folder")
    sub.add_parser("list", help="list cached functions")
    sub.add_parser("clear", help="delete every cached module and runtime build")
    args = parser.parse_args(argv)
    if args.command == "cache-dir":
        print(config.cache_dir())
    elif args.command == "list":
        rows = cache.list_entries()
        for row in rows:
            print(f"{row['specializations']:3d} specialization(s) {row['bytes'] / 1024:9.1f} KiB  "
                  f"{row['path']}")
        if not rows:
            print(f"no cached functions in {config.cache_dir()}")
    elif args.command == "clear":
        cache.clear()
        print(f"cleared {config.cache_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
