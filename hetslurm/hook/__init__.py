"""The job_submit hook: render, install, check and explain ``job_submit.lua``.

The hook's logic lives in Lua (``job_submit/hethook.lua``, with the request grammar
``job_submit/hetreq.lua``); this package renders it with the site's rules, validates it in
Lua 5.1 before installing, and runs the very same file in-process for ``hetslurm explain``.
"""
