"""bouquet: serving of text embedding and reranking models (gateway → gRPC replicas → engine)."""


def __getattr__(name: str) -> str:
    # ``bouquet.__version__`` on first use only: reading the installed metadata costs ~30 ms, which
    # every process (replicas, gateway workers, the CLI) would otherwise pay at import.
    if name != "__version__":
        raise AttributeError(f"module 'bouquet' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bouquet")  # pyproject.toml's, the one place it is written
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
