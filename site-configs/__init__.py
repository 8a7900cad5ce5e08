# Not Python code: this file makes site-configs/ a package so the wheel ships the example
# sites (demo.toml, case-study.toml, simulate-params.toml, ...) as package data.
# pyproject.toml installs this folder as `hetslurm_site_configs`; hetslurm.site.find
# (`shipped_site`) reads it with importlib.resources, so `testbed up` and `bench` find them
# from any working directory.
