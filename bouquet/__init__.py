"""bouquet: serving of text embedding and reranking models (gateway → gRPC replicas → engine)."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bouquet")  # pyproject.toml's, the one place it is written
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
