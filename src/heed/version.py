"""heed's version, from the installed package metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("heed")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+unknown"

API_VERSION = "v1"
