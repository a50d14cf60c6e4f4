# The project metadata lives in pyproject.toml; this file exists only because
# cffi's build hook is a setup() keyword that pyproject.toml cannot express.
from setuptools import setup

setup(cffi_modules=["fulmar/_native/build.py:ffibuilder"])
