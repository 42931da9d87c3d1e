"""Errors users see. Each one says what was wrong and what to do next, on one line."""


class ZooError(Exception):
    """Base class: the CLI prints the message (no traceback) and exits non-zero."""

    exit_code = 1


class CardError(ZooError):
    """A card (or recipe) file failed its schema: names the file and the field."""


class UnknownModelError(ZooError):
    """A model name that is not in the catalog."""


class PointerFileError(ZooError):
    """A Git LFS pointer was found where the file's content was expected."""


class IntegrityError(ZooError):
    """Bytes whose sha256 or size differ from what the card promises."""


class ObjectNotFoundError(ZooError):
    """No source (checkout, cache, remotes) had the object."""


class StoreUnreachableError(ObjectNotFoundError):
    """No store that answered had the object, and at least one store could not be reached: maybe it has it."""


class RemoteError(ZooError):
    """A remote failed (after retries) or refused a request."""
