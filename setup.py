from setuptools import setup

setup(
    name="trident",
    version="0.1.0",
    description="Compile PyTorch functions that call Triton kernels into native "
                "Specialization Cache Modules",
    python_requires=">=3.10",
    packages=["trident", "trident.ir", "trident.lower", "trident.codegen", "trident.frontend",
              "trident.runtime", "trident.templates"],
    package_dir={"trident.templates": "templates"},
    package_data={"trident.runtime": ["*.h", "*.cpp"], "trident.templates": ["*.jinja"]},
    install_requires=[
        "torch>=2.11,<2.14",
        "triton>=3.6,<3.7",
        "torch-mlir",
        "ml_dtypes",  # Torch-MLIR's importer writes a bfloat16 constant through it
        "cffi",
        "jinja2",
        "setuptools",
        "ninja",  # torch.utils.cpp_extension builds the runtime with it
        "filelock",
        "platformdirs",
        "tqdm",  # progress of long first compiles on a terminal
    ],
    extras_require={"test": ["pytest", "pytest-xdist", "hypothesis", "expecttest", "liger-kernel",
                             "transformers", "markdown-it-py"]},
    entry_points={
        "console_scripts": ["trident = trident.__main__:main"],
        "torch_dynamo_backends": ["trident = trident.frontend.backend:trident_backend"],
    },
)
