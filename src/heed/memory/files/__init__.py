"""File retain: uploaded files become documents.

- :mod:`~heed.memory.files.rules`: which files heed reads, within which limits;
- :mod:`~heed.memory.files.readers`: the text of each format, in bounded work;
- :mod:`~heed.memory.files.parse`: one file parsed in a child process, bounded and killed
  on cancel;
- :mod:`~heed.memory.files.retain`: :class:`FileRetain`, what ``POST .../files/retain`` does.
"""

from heed.memory.files.retain import FileMeta, FileRetain, FileRetainResult
from heed.memory.files.rules import FileLimits, FileRefused, FileTooLarge, UploadedFile

#: What a parsing child imports: preloaded once in the process children start from.
FILE_PARSER_MODULES = (
    "heed.memory.files.parse",
    *("bs4.dammit", "pypdf", "docx", "pptx", "openpyxl"),
)

__all__ = [
    "FILE_PARSER_MODULES",
    "FileLimits",
    "FileMeta",
    "FileRefused",
    "FileRetain",
    "FileRetainResult",
    "FileTooLarge",
    "UploadedFile",
]
