"""Packages of the wheel beyond what ``pyproject.toml`` can say: the top-level ``conf/`` and ``traces/``
directories ship inside the ``harness`` package as ``harness.conf`` (found by Hydra as ``pkg://harness.conf``,
``harness.run.cli.config_path``) and ``harness.traces`` (the default traces and the Qwen2.5 tokenizer,
``harness.core.paths.data_path``), so an installed wheel runs the main job outside a checkout. Metadata, extras and
the console script are in ``pyproject.toml``."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["harness", "harness.*", "baselines", "baselines.*"]),
              "harness.conf", "harness.traces",
              "hydra_plugins.harness_launcher"],   # the default sweep launcher (``hydra/launcher=pool``)
    package_dir={"harness.conf": "conf", "harness.traces": "traces"},
    package_data={"harness.conf": ["**/*.yaml", "README.md"],
                  "harness.traces": ["*.jsonl.gz", "*.md", "**/*.jsonl.gz", "**/*.md", "**/*.json", "**/*.txt",
                                     "**/LICENSE"]},
    include_package_data=False,
)
