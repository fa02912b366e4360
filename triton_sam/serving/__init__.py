"""What runs inside Triton, and the dependency-free pieces it shares with the clients.

The modules here import only the standard library and numpy (``intake`` also PIL, lazily, to
decode image files and for SAM1's resize), and one another relatively, so
the repository writer can ship this package beside a server-side ``model.py`` under the name
``triton_sam_serving`` (a unique top-level name: nothing on the stub's ``sys.path`` can shadow
it), and the clients import the very same files as ``triton_sam.serving``:

- :mod:`.resample`: numpy twins of torch's resampling kernels;
- :mod:`.images`: content ids and SAM3 preprocessing of RGB images;
- :mod:`.masks`: instance post-processing (Sam3Processor's), COCO RLE and PNG encoding;
- :mod:`.bounds`: the request bounds every client-reachable input is checked against (the
  session model enforces them, the clients check them first);
- :mod:`.intake`: image files / pixels in: decoding, the official preprocessing, the ids the
  server computes;
- :mod:`.prompt_frame`: original-pixel prompts to the input frame and masks back (bbox,
  bit-packing);
- :mod:`.protocol`: tensor names, limits and error codes of the served models;
- :mod:`.tracking`: SAM2 video tracking orchestration (the tracker model's, and in-process);
- :mod:`.everything`: segment everything's parameters, plan, instances and driver (the
  everything job model's, and in-process);
- :mod:`.model_io`: how a ``model.py`` reads its inputs and answers a refusal (one way);
- :mod:`.session_call`: the BLS call to the session model (tenant, relayed refusals);
- :mod:`.concept_request`: the concept model's phrases, tokens and scalars;
- ``*_model.py``: the python-backend ``model.py`` files (``concept_model``,
  ``embedding_cache_model``, ``everything_model`` (the everything JOB model),
  ``lambda_model``, ``tracker_model``, ``runner_model``); they need Triton's
  ``triton_python_backend_utils`` and are never imported by the package itself. Each imports
  the package by its shipped name only (``from triton_sam_serving import ...``, after putting
  its own directory on ``sys.path``); ``repository/shipping.py`` reads those imports to ship
  what it needs, and in the source tree the finder below answers the shipped name with this
  package's own modules.
"""

import importlib
import importlib.abc
import importlib.util
import sys

# The name the repository writer ships this package under beside a model.py (the same value
# as protocol.SHIPPED_PACKAGE; written here too so importing the package imports nothing).
_SHIPPED = "triton_sam_serving"


class _ShippedName(importlib.abc.MetaPathFinder):
    """Answers ``triton_sam_serving[.x]`` with the module ``triton_sam.serving[.x]`` itself.

    Why: every ``model.py`` imports its modules under the shipped name only (one import
    block, read by ``repository/shipping.py`` to know what to ship). Inside Triton that is
    the package beside it; in the source tree (unit tests, the clients) this finder answers
    the name with the very same module objects, so a class raised by one name is caught by
    the other.
    """

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's)
        if fullname != _SHIPPED and not fullname.startswith(_SHIPPED + "."):
            return None
        module = importlib.import_module(__name__ + fullname[len(_SHIPPED) :])
        loader = _Same(module)
        return importlib.util.spec_from_loader(
            fullname, loader, is_package=hasattr(module, "__path__")
        )


class _Same(importlib.abc.Loader):
    """Loads a shipped name as the already imported source-tree module."""

    def __init__(self, module) -> None:  # noqa: ANN001
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec):  # noqa: ANN001
        return self.module

    def exec_module(self, module) -> None:  # noqa: ANN001
        module.__spec__ = self.spec  # the import system set the alias's spec: give it back


if __name__ != _SHIPPED and not any(isinstance(f, _ShippedName) for f in sys.meta_path):
    sys.meta_path.insert(0, _ShippedName())  # before the path finder, which would load a copy
