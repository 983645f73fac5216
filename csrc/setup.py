"""Builds the project's C++ extensions with torch's extension tooling (make ext runs it):

    python csrc/setup.py build_ext --inplace --build-temp build/csrc

from the repository root; each module lands beside the Python that uses it (model/).
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="dlrm-harness-csrc",
    ext_modules=[
        CppExtension("model._id_transformer", ["csrc/id_transformer.cpp"], extra_compile_args=["-O3"]),
        CppExtension("harness.run._row_index", ["csrc/row_index.cpp"], extra_compile_args=["-O3"]),
        # Bits as torch's element-wise ops give them: no fused multiply-add (csrc/row_init.cpp).
        CppExtension("model._row_init", ["csrc/row_init.cpp"], extra_compile_args=["-O3", "-ffp-contract=off"]),
    ],
    cmdclass={"build_ext": BuildExtension},
)
