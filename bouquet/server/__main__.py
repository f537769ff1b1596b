import sys

if "--standalone" not in sys.argv:
    # Before the imports below (grpc, torch: a second or more): a launcher killed meanwhile must
    # not leave this replica running on its own.
    import signal

    from bouquet.parent import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the launcher stops its replicas (main.py)

from bouquet.server.main import main  # noqa: E402

main()
