"""Stand-in for SimpleITK, for the device run of the benchmarks only (never part of the product).

The device run (``benchmarks/device/run.py``) goes to a machine where SimpleITK is not installed and
its wheel (about 50 MB) does not fit what may travel there. nnU-Net and this package import
SimpleITK at import time (``nnunetv2.imageio.simpleitk_reader_writer``,
``nnunetv2.preprocessing.preprocessors.default_preprocessor``, ``acvl_utils``,
``nnunetv2_meddisseg.datasets.synapse``, which names ``SimpleITK.Image`` in its annotations), but the
2D PNG datasets of the run are read and written by nnU-Net's ``NaturalImage2DIO``, which comes first
in nnU-Net's reader list, so no SimpleITK function is ever called. This module lets those imports
succeed: ``Image`` exists as a class that cannot be instantiated, and every other attribute raises an
``AttributeError`` that names this stand-in, so a code path that really needs SimpleITK fails with a
clear message instead of a wrong result.

``run.py`` puts this folder on the path only where ``import SimpleITK`` finds nothing.
"""

__version__ = "0+standin"
IS_STANDIN = True
_MESSAGE = ("SimpleITK.{name} is not available: this is the device run's stand-in for SimpleITK "
            "(benchmarks/device/standins), enough for 2D PNG datasets only")


class Image:
    """Placeholder for ``SimpleITK.Image`` (type annotations only)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(_MESSAGE.format(name="Image"))


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(_MESSAGE.format(name=name))
