import signal

# Held from the first line until rfsgen's handlers are in place (_signals.install
# unblocks them): a Ctrl-C while the entry point is imported is then reported as any
# other, never as a KeyboardInterrupt traceback from the import machinery.
if hasattr(signal, "pthread_sigmask"):  # POSIX
    signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")
                                              if hasattr(signal, n)})

from ._entry import main  # noqa: E402

main()
