# The project metadata lives in pyproject.toml; this file exists only because
# cffi's build hook is a setup() keyword that pyproject.toml cannot express.
# The build script is named through src/ (package-dir): the path must exist in
# an sdist too, which holds the packages under src/ and not the root's fulmar/.
from setuptools import setup

setup(cffi_modules=["src/fulmar/_native/build.py:ffibuilder"])
