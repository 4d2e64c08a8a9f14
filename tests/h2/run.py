"""Runs one group of HTTP/2 conformance checks against a running forkd.

    H2_PORT=8080 python run.py GROUP [CHECK_ID ...]

GROUP is a module of tests/h2 (connection, frames, semantics, hpack_checks,
floods, lifecycle, clients). One line per check (`ok` or `FAIL`, its id, its title, and for a
failure what was expected and seen); the exit status is 1 if any failed.
"""

import importlib
import sys
import traceback

import h2conf


def main():
    group = sys.argv[1]
    only = set(sys.argv[2:])
    importlib.import_module(group)
    failed = 0
    ran = 0
    for module, ident, title, fn in h2conf.CHECKS:
        if module != group or (only and ident not in only):
            continue
        ran += 1
        ctx = h2conf.Ctx()
        try:
            fn(ctx)
            notes = "".join(" [note: %s]" % n for n in ctx.notes)
            print("ok   %-10s %s%s" % (ident, title, notes), flush=True)
        except h2conf.Failed as e:
            failed += 1
            print("FAIL %-10s %s: %s" % (ident, title, e), flush=True)
        except Exception:
            failed += 1
            err = traceback.format_exc().strip().replace("\n", " | ")
            print("FAIL %-10s %s: the check itself broke: %s" % (ident, title, err), flush=True)
        finally:
            ctx.close_all()
    if ran == 0:
        print("FAIL %s: no checks ran" % group)
        failed = 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
