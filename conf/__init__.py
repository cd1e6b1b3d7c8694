"""The Hydra configs (YAML files only). This file makes ``conf/`` a package so the installed wheel ships it as
``harness.conf`` (``setup.py``) and Hydra finds it through its ``pkg://harness.conf`` search path
(``harness.run.cli.config_path``); a checkout reads ``conf/`` as a directory."""
