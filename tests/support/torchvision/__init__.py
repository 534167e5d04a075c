"""A stand-in for `torchvision`, imported by SGLang's multimodal code, unused for text (see stand_in)."""

from stand_in import install

__version__ = "0.0.0+stand-in"

install(__name__)
