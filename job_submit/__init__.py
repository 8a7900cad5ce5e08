# Not Python code: this file makes job_submit/ a package so the wheel can ship its Lua
# (hetreq.lua, the request grammar) as package data. pyproject.toml installs this folder as
# `hetslurm_job_submit`; hetslurm.request._lua reads it with importlib.resources.
